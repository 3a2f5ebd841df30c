"""Submits pretrain_bert.py to AzureML as a command job (azure-ai-ml v2; pip install -r requirements-azureml.txt).

    python azureml/submit.py --compute gpu-cluster --instance-count 2 --gpus-per-node 8 \
        --ds-config ds_configs/ring_sp2.json --data azureml://datastores/<store>/paths/wiki/ \
        --data-prefix wiki_text_sentence -- --num-layers 24 --hidden-size 1024 --train-iters 100000
    python azureml/submit.py --dry-run job.yml ...      # writes the job YAML, needs no credentials

The job uploads this repository as its code folder (files .gitignore excludes stay home), runs in
an environment of a CUDA image plus this project's pinned requirements.txt, and gets the DeepSpeed
JSON and the data folder (preprocessed .bin/.idx and vocab.txt) as inputs. The PyTorch
distribution runs the command once per instance (process_count_per_instance 1) with
MASTER_ADDR, MASTER_PORT and NODE_RANK set; the command installs the package (compiling the
data helpers) and starts that instance's GPUS_PER_NODE ranks with DeepSpeed's per-node launcher
(deepspeed.launcher.launch), exactly as `deepspeed --no_ssh --node_rank` would. Flags after `--`
go to pretrain_bert.py; they, the JSON, the layout for the job's world and a local data folder are
checked as the trainer checks them before anything is written (validate). A real submit reads the workspace from config.json (MLClient.from_config:
./config.json or ./.azureml/config.json, or --workspace-config) and your Azure login.
"""
import argparse
import base64
import io
import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04"
NCCL_ENV = {  # NCCL over the node's Ethernet/InfiniBand; errors surface instead of hanging
    "NCCL_DEBUG": "WARN",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


class SubmitError(Exception):
    """A one-line problem; fix, like megatron.errors.ConfigError."""


def conda_environment() -> dict:
    """Python 3.11 and requirements.txt's pins, read from the file so that they cannot drift."""
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return {"name": "bert-longseq", "channels": ["conda-forge"],
            "dependencies": ["python=3.11", "pip", {"pip": pins}]}


def node_command(instance_count: int, gpus_per_node: int, data_prefix: str, vocab: str, flags: list) -> str:
    """Per instance: install, then DeepSpeed's per-node launcher for this node's ranks."""
    world_info = {f"node-{node}": list(range(gpus_per_node)) for node in range(instance_count)}
    encoded = base64.urlsafe_b64encode(json.dumps(world_info).encode()).decode()
    return " ".join([
        "pip install --no-deps --no-build-isolation -e . &&",
        "python -m deepspeed.launcher.launch", f"--world_info={encoded}",
        "--node_rank=$NODE_RANK --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT",
        "pretrain_bert.py --deepspeed --deepspeed_config ${{inputs.ds_config}}",
        f"--data-path ${{{{inputs.data}}}}/{data_prefix} --vocab-file ${{{{inputs.data}}}}/{vocab}",
        "--save ./outputs/checkpoints --log-dir ./outputs/logs", *map(shlex.quote, flags),
    ])


def is_local(data: str) -> bool:
    return "://" not in data and not data.startswith("azureml:")


def validate(args) -> None:
    """The trainer's own checks, run here before anything is written or submitted, so that a job
    does not wait in the queue for a node only to stop at start-up: pretrain_bert.py's argument
    parser (unknown flags, bad values) and flag checks, the DeepSpeed JSON as the trainer reads it
    (megatron.config.read_ds_config) and the layout it resolves for this job's world
    (megatron.config.resolve with instance count x GPUs per node), and a local --data folder's
    files (an azureml:// URI is checked by AzureML when the job mounts it)."""
    if not args.ds_config.is_file():
        raise SubmitError(f"--ds-config {args.ds_config} does not exist; pass a JSON from ds_configs/ "
                          "(or one made with tools/ds_config.py set)")
    for name in ("instance_count", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise SubmitError(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1; pass a positive integer")
    data = Path(args.data)
    if is_local(args.data):
        if not data.is_dir():
            raise SubmitError(f"--data {args.data} is not a folder; pass the local folder of the preprocessed "
                              ".bin/.idx and the vocab file, or an azureml:// URI")
        for name in (f"{args.data_prefix}.bin", f"{args.data_prefix}.idx", args.vocab):
            if not (data / name).is_file():
                raise SubmitError(f"--data {args.data} has no {name}; pass the folder tools/preprocess_data.py wrote "
                                  "(--data-prefix names the .bin/.idx in it, --vocab the vocab file)")
    from megatron.quiet import quiet_deepspeed

    quiet_deepspeed()  # before DeepSpeed is first imported: no accelerator warning
    from megatron.arguments import build_parser as trainer_parser, config_flags
    from megatron.config import read_ds_config, resolve
    from megatron.errors import ConfigError
    from megatron.training import check_flags

    def refuse(message):
        raise SubmitError(f"pretrain_bert.py flags after --: {message}; see python pretrain_bert.py --help")

    parser = trainer_parser()
    parser.error = refuse  # one line, not argparse's usage and exit
    trainer_args = parser.parse_args([*args.flags, "--deepspeed", "--deepspeed_config", str(args.ds_config)])
    try:
        check_flags(trainer_args)
        flags = config_flags(trainer_args)
        if is_local(args.data) and not flags["vocab_size"]:
            with open(data / args.vocab, encoding="utf-8", errors="replace") as file:
                flags["vocab_size"] = sum(1 for line in file if line.strip())
        flags["bigbird_seed"] = trainer_args.seed
        resolve(flags, read_ds_config(args.ds_config), args.instance_count * args.gpus_per_node)
    except ConfigError as error:
        raise SubmitError(str(error)) from None


def build_job(args):
    validate(args)
    try:
        from azure.ai.ml import Input, PyTorchDistribution
        from azure.ai.ml.entities import CommandJob, Environment, JobResourceConfiguration
    except ImportError:
        raise SubmitError("azure-ai-ml is not installed; pip install -r requirements-azureml.txt") from None
    environment = Environment(image=args.image, conda_file=conda_environment())
    return CommandJob(
        code=str(ROOT),
        command=node_command(args.instance_count, args.gpus_per_node, args.data_prefix, args.vocab, args.flags),
        environment=environment,
        inputs={"ds_config": Input(type="uri_file", path=str(args.ds_config.resolve())),
                "data": Input(type="uri_folder", path=args.data)},
        resources=JobResourceConfiguration(instance_count=args.instance_count),
        distribution=PyTorchDistribution(process_count_per_instance=1),
        environment_variables={**NCCL_ENV, **dict(args.env)},
        compute=args.compute,
        experiment_name=args.experiment,
        display_name=args.display_name,
    )


def write_job_yaml(job, path: Path) -> None:
    """The job as YAML that `az ml job create -f` and azure.ai.ml.load_job read. The SDK's dump
    writes a local input path as an asset name (`azureml:/abs/path`); the given paths are put back."""
    import yaml

    spec = yaml.safe_load(io.StringIO(job_text(job)))
    for name, given in job.inputs.items():
        spec["inputs"][name]["path"] = given.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def job_text(job) -> str:
    stream = io.StringIO()
    job.dump(stream)
    return stream.getvalue()


def submit(job, workspace_config):
    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

    try:
        client = MLClient.from_config(credential=DefaultAzureCredential(), path=workspace_config)
    except Exception as error:  # the SDK raises its own exception types for a missing/invalid config
        raise SubmitError(f"no AzureML workspace config found ({type(error).__name__}); download config.json from "
                          "the workspace's Overview page to ./config.json or pass --workspace-config FILE") from None
    return client.jobs.create_or_update(job)


def key_value(text: str) -> tuple:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="submit.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", metavar="JOB_YAML", type=Path, help="write the job YAML here, submit nothing")
    parser.add_argument("--compute", default="gpu-cluster", help="AzureML compute cluster name")
    parser.add_argument("--instance-count", type=int, default=1, help="nodes")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node")
    parser.add_argument("--ds-config", type=Path, default=ROOT / "ds_configs" / "ring_sp2.json",
                        help="DeepSpeed JSON (uploaded as an input)")
    parser.add_argument("--data", required=True,
                        help="folder with the preprocessed .bin/.idx and vocab.txt: a local path or an azureml:// URI")
    parser.add_argument("--data-prefix", default="corpus_text_sentence", help="the .bin/.idx name inside --data")
    parser.add_argument("--vocab", default="vocab.txt", help="the vocab file inside --data")
    parser.add_argument("--image", default=IMAGE, help="base Docker image (CUDA + MPI)")
    parser.add_argument("--env", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment variable (repeatable; overrides the NCCL defaults)")
    parser.add_argument("--experiment", default="bert-longseq")
    parser.add_argument("--display-name")
    parser.add_argument("--workspace-config", help="the workspace's config.json (default: search from .)")
    parser.add_argument("flags", nargs="*", help="after --: pretrain_bert.py flags")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        job = build_job(args)
        if args.dry_run:
            write_job_yaml(job, args.dry_run)
            print(args.dry_run)
        else:
            print(submit(job, args.workspace_config).studio_url)
    except SubmitError as error:
        print(f"submit.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
