"""Submits pretrain_bert.py to AzureML as a command job (azure-ai-ml v2; pip install -r requirements-azureml.txt).

    python azureml/submit.py --compute gpu-cluster --instance-count 2 --gpus-per-node 8 \
        --ds-config ds_configs/ring_sp2.json --data azureml://datastores/<store>/paths/wiki/ \
        --data-prefix wiki_text_sentence -- --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
        --train-iters 100000
    python azureml/submit.py --dry-run job.yml ...      # writes the job YAML, needs no credentials

The job uploads this repository as its code folder (files .gitignore excludes stay home) and runs in
an image built from azureml/Dockerfile: CUDA 13.0 as the pinned torch's wheels, the pinned
requirements.txt, and DeepSpeed's FusedAdam/CPUAdam compiled in (no JIT build at start-up). Inputs:
the DeepSpeed JSON and the data folder (preprocessed .bin/.idx and the vocab.txt or Hugging Face
tokenizer.json they were made with) and the Hugging Face folder a run starts from (--init-from-hf, the
trainer's flag made an option here), mounted read-only. Outputs, mounted read-write on every node,
so that all nodes write into one folder: `checkpoints` (--save and --load: a job resubmitted with
the same --checkpoints resumes from its last save) and `data_cache` (--data-cache-path: the index
maps the read-only data cannot hold; the same --data-cache reuses them across jobs). Logs go to
./outputs/logs of node 0. The PyTorch distribution runs the command once per instance
(process_count_per_instance 1) with MASTER_ADDR, MASTER_PORT and NODE_RANK set; the command installs
the package (compiling the data helpers) and starts that instance's GPUS_PER_NODE ranks with
DeepSpeed's per-node launcher (deepspeed.launcher.launch), exactly as `deepspeed --no_ssh
--node_rank` would. Flags after `--` go to pretrain_bert.py; they, the JSON, the layout for the
job's world, the image's CUDA and a local data or model folder are checked as the trainer checks them before
anything is written (validate). A real submit reads the workspace from config.json
(MLClient.from_config: ./config.json or ./.azureml/config.json, or --workspace-config) and your
Azure login; it needs --compute (a --dry-run does not).
"""
import argparse
import base64
import io
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import this_repo  # azureml/this_repo.py, a link to tools/this_repo.py
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, DataError, OneLineParser, either, run_tool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "azureml" / "Dockerfile"
# The CUDA of torch's Linux wheels on PyPI, from their metadata (torch 2.13.0 requires
# cuda-toolkit==13.0.3). The image's nvcc must match it: a new torch pin needs its line here.
TORCH_CUDA = {"2.13.0": "13.0"}
# Trainer flags the job sets itself (the inputs' and outputs' mount points), by their argparse dest:
# the flag and the submit.py option that sets it.
JOB_FLAGS = {"data_path": ("--data-path", "--data and --data-prefix"), "vocab_file": ("--vocab-file", "--vocab"),
             "tokenizer_file": ("--tokenizer-file", "--vocab"), "save": ("--save", "--checkpoints"),
             "load": ("--load", "--checkpoints"), "data_cache_path": ("--data-cache-path", "--data-cache"),
             "log_dir": ("--log-dir", None), "deepspeed_config": ("--deepspeed_config", "--ds-config"),
             "init_from_hf": ("--init-from-hf", "--init-from-hf")}
# what the job's command passes the trainer for them (node_command): AzureML's placeholders of its mount points
MOUNTS = {"data": "${{inputs.data}}", "checkpoints": "${{outputs.checkpoints}}", "data_cache": "${{outputs.data_cache}}",
          "ds_config": "${{inputs.ds_config}}", "init_from_hf": "${{inputs.init_from_hf}}"}
# the JSON's monitor sections that log to a service -> (the package DeepSpeed imports for it, the variable of its
# API key, how it logs without an account)
# monitor: (package, API key variable, how to run without one, whether the job's env and section do)
SERVICE_MONITORS = {
    "wandb": ("wandb", "WANDB_API_KEY", "--env WANDB_MODE=offline",
              lambda env, section: env.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")),
    "comet": ("comet_ml", "COMET_API_KEY", '"online": false in the comet section',
              lambda env, section: section.get("online") is False or section.get("mode") == "offline")}
# a distributed job's nodes: an AzureML compute cluster set up for communication between nodes has at most 4000
MAX_INSTANCES = 4000
# a node's GPUs: Azure's largest GPU sizes (ND H100 v5, ND A100 v4) have 8; twice that leaves room, and a typo such
# as 80 for 8 stopped no check (the launch's world list was built for every one of them)
MAX_GPUS_PER_NODE = 16
COMPUTE_NAME = re.compile(r"(azureml:)?[A-Za-z][A-Za-z0-9-]*")  # AzureML's compute names: letters, digits, hyphens
DATASTORE_FOLDER = re.compile(r"azureml://(.+/)?datastores/[^/]+/paths/.+")  # of this or a named workspace
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # an environment variable's name, as a shell takes it
KEPT = "outputs"  # the job's folder AzureML keeps (beside the checkpoints mount); the run log goes to outputs/logs
NCCL_ENV = {  # NCCL over the node's Ethernet/InfiniBand; errors surface instead of hanging
    "NCCL_DEBUG": "WARN",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_IB_PCI_RELAXED_ORDERING": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


class SubmitError(ConfigError):
    """A one-line `<problem>; <fix>` of submit.py's, written whole: a ConfigError, so run_tool reports it."""

    def __init__(self, line: str):
        problem, _, fix = line.partition("; ")
        super().__init__(problem, fix)
        self.args = (line,)  # the text as written (a problem without a fix has no "; " to add)


def default_image() -> str:
    """The base image azureml/Dockerfile names (its `ARG IMAGE=` line)."""
    return re.search(r"^ARG IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE).group(1)


def pinned(package: str) -> str:
    """The version requirements.txt pins for `package`."""
    match = re.search(rf"^{re.escape(package)}==(\S+)$", (ROOT / "requirements.txt").read_text(), re.MULTILINE)
    return match.group(1)


def image_cuda(image: str) -> str | None:
    """The CUDA version an image's name states (nvidia/cuda:13.0.0-devel-..., ...-cuda12.4-...)."""
    match = re.search(r"cuda[:\-_]?(\d+)\.(\d+)", image)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def check_image(image: str) -> None:
    """The image must bring the nvcc of torch's CUDA: DeepSpeed's op builds compare them."""
    torch_version = pinned("torch")
    if torch_version not in TORCH_CUDA:
        raise SubmitError(f"requirements.txt pins torch {torch_version}, whose CUDA submit.py does not know; "
                          "add its wheels' CUDA version to TORCH_CUDA in azureml/submit.py")
    cuda, wanted = image_cuda(image), TORCH_CUDA[torch_version]
    if not image:
        raise SubmitError(f"--image is empty; pass a CUDA {wanted} devel image, or leave --image out for the default "
                          f"{default_image()}")
    if cuda is None:
        print(f"submit.py: warning: --image {image} does not name its CUDA version; it must have CUDA {wanted}'s "
              f"nvcc (torch {torch_version}'s)", file=sys.stderr)
    elif cuda != wanted:
        raise SubmitError(f"--image {image} is CUDA {cuda}, the pinned torch {torch_version}'s wheels are CUDA {wanted} "
                          f"(DeepSpeed's FusedAdam build would refuse the mismatch); pass a CUDA {wanted} devel image "
                          f"such as the default {default_image()}")


def in_requirements(package: str) -> bool:
    """Whether requirements.txt, which the job's image is built from, installs `package` (names compared as pip
    does: case, '-', '_' and '.' alike)."""
    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()
    names = (re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line) for line in
             (ROOT / "requirements.txt").read_text().splitlines())
    return normal(package) in {normal(name.group(1)) for name in names if name}


def check_monitors(args, ds_config: dict, tensorboard_dir: str | None) -> None:
    """The JSON's monitors and the trainer's --tensorboard-dir as the job would run them: a service whose package
    the image lacks (the trainer's start-up would refuse it on the cluster, with a pip install no job can run) is
    refused; one without its API key, and a file that goes elsewhere than ./outputs (lost with the node's
    container), get a warning."""
    from megatron import monitors
    from megatron.ds_schema import FILE_MONITORS

    env = dict(args.env)
    for name in monitors.enabled(ds_config):
        if name in SERVICE_MONITORS:
            package, key, offline, runs_offline = SERVICE_MONITORS[name]
            fix = f"run it offline ({offline}: its files under ./{KEPT}) or pass the key from a workspace secret " \
                  f"(--env {key}=... is written in plain text into the job's definition)"
            if not in_requirements(package):
                raise SubmitError(f"--ds-config {args.ds_config} enables {name}, whose package {package} the job's "
                                  f"image (built from requirements.txt) does not have; add {package} to "
                                  f"requirements.txt and {fix}, or set {name}.enabled to false")
            section = ds_config[name]
            if key not in env and not section.get("api_key") and not runs_offline(env, section):
                print(f"submit.py: warning: --ds-config {args.ds_config} enables {name} and the job gets no {key} "
                      f"(it would stop at start-up without a login); {fix}", file=sys.stderr, flush=True)
    written = [(f"{name}.output_path", ds_config[name].get("output_path", "")) for name in monitors.enabled(ds_config)
               if name in FILE_MONITORS]
    profiler = ds_config.get("flops_profiler")
    if isinstance(profiler, dict) and profiler.get("enabled") is True and profiler.get("output_file"):
        written.append(("flops_profiler.output_file", profiler["output_file"]))
    # (what names the path, the path, the folder under ./outputs to suggest)
    written = [(f"{key} {json.dumps(path)} of --ds-config {args.ds_config}", path, key.split(".")[0])
               for key, path in written]
    if tensorboard_dir is not None:
        written.append((f"--tensorboard-dir {tensorboard_dir} after --", tensorboard_dir, "tensorboard"))
    for what, path, folder in written:
        if not kept(path):
            print(f"submit.py: warning: {what} is not kept by the job (AzureML keeps ./{KEPT} and the checkpoints); "
                  f'set it to a path under {KEPT}/, e.g. "{KEPT}/{folder}"', file=sys.stderr, flush=True)


def kept(path: str) -> bool:
    """Whether a path the job writes (relative to its working folder, the code folder) lies in ./outputs."""
    return not os.path.isabs(path) and Path(os.path.normpath(path)).parts[:1] == (KEPT,)


def write_build_context(folder: Path, image: str) -> Path:
    """azureml/Dockerfile (FROM `image`) and requirements.txt in `folder`: what AzureML builds the
    job's image from."""
    folder.mkdir(parents=True, exist_ok=True)
    dockerfile = re.sub(r"^ARG IMAGE=\S+$", f"ARG IMAGE={image}", DOCKERFILE.read_text(), flags=re.MULTILINE)
    (folder / "Dockerfile").write_text(dockerfile)
    (folder / "requirements.txt").write_text((ROOT / "requirements.txt").read_text())
    return folder


def tokenizer_flag(vocab: str) -> str:
    """The trainer flag for --vocab: a *.json is a Hugging Face tokenizer.json (HFTokenizer), else a vocab.txt."""
    return "--tokenizer-file" if vocab.endswith(".json") else "--vocab-file"


def node_command(instance_count: int, gpus_per_node: int, data_prefix: str, vocab: str, flags: list,
                 init_from_hf: bool = False) -> str:
    """Per instance: install, then DeepSpeed's per-node launcher for this node's ranks (from the mounted Hugging
    Face folder with `init_from_hf`)."""
    world_info = {f"node-{node}": list(range(gpus_per_node)) for node in range(instance_count)}
    encoded = base64.urlsafe_b64encode(json.dumps(world_info).encode()).decode()
    return " ".join([
        "pip install --no-deps --no-build-isolation -e . &&",
        "python -m deepspeed.launcher.launch", f"--world_info={encoded}",
        "--node_rank=$NODE_RANK --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT",
        f"pretrain_bert.py --deepspeed --deepspeed_config {MOUNTS['ds_config']}",
        f"--data-path {MOUNTS['data']}/{shlex.quote(data_prefix)}",
        f"{tokenizer_flag(vocab)} {MOUNTS['data']}/{shlex.quote(vocab)}",
        f"--save {MOUNTS['checkpoints']} --load {MOUNTS['checkpoints']}",
        f"--data-cache-path {MOUNTS['data_cache']} --log-dir ./outputs/logs",
        *([f"--init-from-hf {MOUNTS['init_from_hf']}"] if init_from_hf else []), *map(shlex.quote, flags),
    ])


def files_in(folder: Path, pattern: str) -> list:
    return sorted(path.name for path in folder.glob(pattern) if path.is_file())


def default_said(args, option: str) -> str:
    """' (the default --data-prefix)' where the option's value is its default, which the user may not have typed."""
    dest = option.lstrip("-").replace("-", "_")
    return f" (the default {option})" if getattr(args, dest) == build_parser().get_default(dest) else ""


def check_inside_data(args, option: str, name: str) -> None:
    """--data-prefix and --vocab name files inside --data: the job reads ${{inputs.data}}/NAME, so an absolute path
    or one that leaves --data (a local one checked here) names nothing on the node."""
    parts = Path(os.path.normpath(name)).parts
    if not (os.path.isabs(name) or parts[:1] == ("..",)):
        return
    where = "an absolute path" if os.path.isabs(name) else "a path out of --data"
    inside = Path(name).name
    if option == "--data-prefix":
        inside = re.sub(r"\.(bin|idx)$", "", inside)
    local = Path(args.data) if is_local(args.data) and Path(args.data).is_dir() else None
    present = (local / (f"{inside}.bin" if option == "--data-prefix" else inside)).is_file() if local else True
    instead = (f"pass {option} {shlex.quote(inside)}, its name inside --data" if present else
               f"pass {option} with the name of a file inside --data {args.data}, or copy {name} into it")
    raise SubmitError(f"{option} {name} is {where}: the job reads it inside the --data folder it mounts "
                      f"({MOUNTS['data']}/{name}); {instead}")


def check_data_files(args, data: Path) -> None:
    """A local --data folder's .bin/.idx of --data-prefix and its --vocab, each missing one named with what the
    folder holds instead (the .bin files; the tokenizer its data's vocab record names)."""
    from megatron.data.tokenizer_identity import recorded_tokenizer

    prefix, where = args.data_prefix, f"--data {args.data}"
    if not (data / f"{prefix}.bin").is_file():
        bins = [name[:-len(".bin")] for name in files_in(data, "*.bin")]
        fix = (f"pass --data-prefix {either([shlex.quote(name) for name in bins])} (the .bin/.idx in it)" if bins
               else "pass the folder tools/preprocess_data.py wrote (its .bin/.idx and their vocab file)")
        raise SubmitError(f"{where} has no {prefix}.bin{default_said(args, '--data-prefix')}; {fix}")
    if not (data / f"{prefix}.idx").is_file():
        raise SubmitError(f"{where} has {prefix}.bin but no {prefix}.idx; copy the {prefix}.idx "
                          "tools/preprocess_data.py wrote beside it")
    if not (data / args.vocab).is_file():
        recorded = recorded_tokenizer([str(data / prefix)])
        made_with = Path(recorded[1]).name if recorded else None
        if made_with and (data / made_with).is_file():
            fix = f"pass --vocab {shlex.quote(made_with)}, the tokenizer its data's vocab record names"
        elif made_with:
            fix = f"copy {recorded[1]}, the tokenizer its data's vocab record names, into it"
        else:
            fix = "pass --vocab the vocab.txt or tokenizer.json (named *.json) in it that the data was made with"
        raise SubmitError(f"{where} has no {args.vocab}{default_said(args, '--vocab')}; {fix}")


def is_local(data: str) -> bool:
    return "://" not in data and not data.startswith("azureml:")


def input_path(given: str) -> str:
    """A job input's path: a local folder (uploaded at the submit) absolute, a URI as given."""
    return str(Path(given).resolve()) if is_local(given) else given


def validate(args) -> None:
    """The trainer's own checks, run here before anything is written or submitted, so that a job
    does not wait in the queue for a node only to stop at start-up: pretrain_bert.py's argument
    parser (unknown flags, bad values) and flag checks, the DeepSpeed JSON as the trainer reads it
    with the optimizer the flags and the job's GPUs fill in (megatron.training.deepspeed_settings)
    and the layout it resolves for this job's world
    (megatron.config.resolve with instance count x GPUs per node), and a local --data folder's
    files and tokenizer against the vocab record of its data (megatron.run_data.data_paths), and a local
    --init-from-hf folder's weights and model as the run would start from them (an azureml:// URI is checked by
    AzureML when the job mounts it)."""
    if not args.ds_config.is_file():
        what = "is a folder, not a JSON file" if args.ds_config.is_dir() else "does not exist"
        raise SubmitError(f"--ds-config {args.ds_config} {what}; pass a JSON from ds_configs/ "
                          "(or one made with tools/ds_config.py set)")
    check_image(args.image)
    if args.compute is not None and not COMPUTE_NAME.fullmatch(args.compute):
        raise SubmitError(f"--compute {args.compute!r} is not a compute name (letters, digits and hyphens, from a "
                          "letter); pass the name of the workspace's GPU compute cluster")
    # the outputs are datastore folders; an input a local folder (uploaded) or one (azurml://, azureml:/ mistyped)
    for option, uri, local in (("--checkpoints", args.checkpoints, False), ("--data-cache", args.data_cache, False),
                               ("--data", args.data, True), ("--init-from-hf", args.init_from_hf, True)):
        if uri is not None and not (local and is_local(uri)) and not DATASTORE_FOLDER.fullmatch(uri):
            raise SubmitError(f"{option} {uri} is not a datastore path; pass {option} "
                              f"azureml://datastores/<store>/paths/<folder>{', or a local folder' if local else ''}")
    for option, name, what in (("--data-prefix", args.data_prefix, "the .bin/.idx name"),
                               ("--vocab", args.vocab, "the vocab.txt or tokenizer.json")):
        if not name:
            raise SubmitError(f"{option} is empty; pass {what} inside --data")
        check_inside_data(args, option, name)
    for name in ("instance_count", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise SubmitError(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1; pass a positive integer")
    if args.instance_count > MAX_INSTANCES:
        raise SubmitError(f"--instance-count {args.instance_count} is more nodes than an AzureML compute cluster has "
                          f"(at most {MAX_INSTANCES} for a distributed job); pass the nodes the job runs on")
    if args.gpus_per_node > MAX_GPUS_PER_NODE:
        raise SubmitError(f"--gpus-per-node {args.gpus_per_node} is more GPUs than an Azure machine has (8 on the "
                          "largest GPU sizes, ND H100 v5 and ND A100 v4); pass the GPUs of the cluster's VM size")
    if re.search(r"\.(bin|idx)$", args.data_prefix):
        raise SubmitError(f"--data-prefix {args.data_prefix} ends in a file suffix; pass --data-prefix "
                          f"{args.data_prefix[:-4]} (it names both the .bin and the .idx)")
    data = Path(args.data)
    if is_local(args.data):
        if not data.is_dir():
            raise SubmitError(f"--data {args.data} is not a folder; pass the local folder of the preprocessed "
                              ".bin/.idx and the vocab file, or an azureml:// URI")
        check_data_files(args, data)
    weights = args.init_from_hf if args.init_from_hf and is_local(args.init_from_hf) else None  # files read here
    if weights is not None and not Path(weights).is_dir():
        raise SubmitError(f"--init-from-hf {weights} is not a folder; pass a local Hugging Face model folder (its "
                          "config.json and weights), or an azureml:// URI")
    from megatron.quiet import quiet_deepspeed

    quiet_deepspeed()  # before DeepSpeed is first imported: no accelerator warning (a ConfigError: a DS_ACCELERATOR
    # here that DeepSpeed cannot load; the job's GPUs need none)
    from megatron import hf_io
    from megatron.arguments import build_parser as trainer_parser, flags_given
    from megatron.config import read_ds_config, resolve
    from megatron.flag_checks import check_flag_combinations, check_flags
    from megatron.flag_habits import wrapped_fix
    from megatron.parallel.launch_check import LayoutError
    from megatron.run_data import data_paths
    from megatron.start_plan import StartPlan
    from megatron.starting_weights import model_flags
    from megatron.training import check_resolved, deepspeed_settings

    def refuse(message):
        raise SubmitError(f"pretrain_bert.py flags after --: {message}; see python pretrain_bert.py --help")

    def refuse_habit(problem, fix):  # another trainer's flag, named with its equivalent in submit.py's terms
        raise SubmitError(f"pretrain_bert.py flags after --: {problem}; "
                          f"{wrapped_fix(fix, {flag: option for flag, option in JOB_FLAGS.values()})}")

    parser = trainer_parser()
    parser.error, parser.refuse = refuse, refuse_habit  # one line, not argparse's usage and exit
    for _, action in flags_given(parser, args.flags):  # by dest: an abbreviation (--loa) sets it too
        if action.dest in JOB_FLAGS:
            flag, option = JOB_FLAGS[action.dest]
            instead = f"; pass {option} to submit.py instead" if option else ""
            raise SubmitError(f"pretrain_bert.py flags after --: {flag} is set by the job (a mount point){instead}")
    folder = data if is_local(args.data) else Path()  # a remote folder's files are not read
    start = ["--init-from-hf", args.init_from_hf] if args.init_from_hf else []
    trainer_args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(args.ds_config), "--data-path",
                                      str(folder / args.data_prefix), tokenizer_flag(args.vocab),
                                      str(folder / args.vocab), *start, *args.flags])
    check_flags(trainer_args)
    # the flags the job adds as its command passes them: --save and --load of the checkpoints mount (a requeued
    # job resumes), --init-from-hf of its own mount (a local folder's path is the upload's)
    job_mounts = {"save": MOUNTS["checkpoints"], "load": MOUNTS["checkpoints"],
                  "init_from_hf": MOUNTS["init_from_hf"] if args.init_from_hf else None}
    check_flag_combinations(argparse.Namespace(**{**vars(trainer_args), **job_mounts}))
    plan = StartPlan(load=None, init_from_hf=weights, finetune=False, weights_only=False)
    if weights:  # as the trainer's check_start: a checkpoint or a --log-dir is named as such
        hf_io.hf_weight_files(weights)
    # the JSON as the trainer fills it from the flags on the job's GPUs (where the Adam params differ)
    ds = deepspeed_settings(trainer_args, cuda=True)
    flags = model_flags(trainer_args, ds, plan)  # with the folder's model where the flags leave it out
    if is_local(args.data):  # the tokenizer and the data's vocab record, as the trainer reads them
        try:
            _, tokenizer = data_paths(argparse.Namespace(**{**vars(trainer_args), "data_cache_path": None}), plan)
        except DataError as error:  # its fix in submit.py's option
            raise SubmitError(f"{error.problem}; pass --vocab the vocab.txt or tokenizer.json (named *.json) in "
                              "--data that the data was made with") from None
        if flags["vocab_size"] is None:  # --vocab-size 0 is refused (BertConfig), not taken for "not given"
            flags["vocab_size"] = tokenizer.vocab_size
    try:
        config = resolve(flags, ds, args.instance_count * args.gpus_per_node, weights_given=bool(args.init_from_hf))
    except LayoutError as error:  # launched by the job: its ranks are submit.py's options
        raise SubmitError(f"{error.problem}; set --instance-count x --gpus-per-node to a multiple of "
                          f"{error.processes}, or pass {error.sizes} after -- to run on {error.world_size} "
                          "GPUs") from None
    check_resolved(trainer_args, config, ds)  # room for a sample, the LR schedule against the run's length
    # the JSON as written: the job expands a ~ in its own home
    check_monitors(args, read_ds_config(args.ds_config), trainer_args.tensorboard_dir)


def check_dry_run(path: Path, context: Path) -> None:
    """The job YAML's path is a file in a folder and its build context's a folder, checked before
    anything is written."""
    if path.is_dir():
        raise SubmitError(f"--dry-run {path} is a folder; pass the job YAML's file name, e.g. {path / 'job.yml'}")
    from megatron.paths import file_in_the_way

    if problem := file_in_the_way(f"--dry-run {path}: its folder", str(path.parent)):
        raise SubmitError(f"{problem}; pass a path in a folder")
    if context.exists() and not context.is_dir():
        raise SubmitError(f"--dry-run {path}: {context}, where the image's build context goes, is a file; "
                          "remove it or pass another --dry-run name")


def build_job(args, context: Path):
    """The command job, as azure.ai.ml.command() builds it: jobs.create_or_update takes that Command, and
    refuses a CommandJob entity ("Non supported job type"). Its image is built from `context`
    (write_build_context)."""
    validate(args)
    try:
        from azure.ai.ml import Input, Output, PyTorchDistribution, command
        from azure.ai.ml.entities import BuildContext, Environment
    except ImportError:
        raise SubmitError("azure-ai-ml is not installed; pip install -r requirements-azureml.txt") from None
    # "Class ...Schema: This is an experimental class" for schema classes the SDK uses inside command()
    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)
    environment = Environment(build=BuildContext(path=str(write_build_context(context, args.image).resolve())))
    inputs = {"ds_config": Input(type="uri_file", path=str(args.ds_config.resolve())),
              "data": Input(type="uri_folder", path=input_path(args.data), mode="ro_mount")}
    if args.init_from_hf:
        inputs["init_from_hf"] = Input(type="uri_folder", path=input_path(args.init_from_hf), mode="ro_mount")
    return command(
        code=str(ROOT),
        command=node_command(args.instance_count, args.gpus_per_node, args.data_prefix, args.vocab, args.flags,
                             bool(args.init_from_hf)),
        environment=environment,
        inputs=inputs,
        outputs={"checkpoints": Output(type="uri_folder", mode="rw_mount", path=args.checkpoints),
                 "data_cache": Output(type="uri_folder", mode="rw_mount", path=args.data_cache)},
        instance_count=args.instance_count,
        distribution=PyTorchDistribution(process_count_per_instance=1),
        environment_variables={**NCCL_ENV, **dict(args.env)},
        compute=args.compute,
        experiment_name=args.experiment,
        display_name=args.display_name,
    )


def write_job_yaml(job, path: Path) -> None:
    """The job as YAML that `az ml job create -f` and azure.ai.ml.load_job read: the command job that
    create_or_update makes of the Command (a Command's own dump is a pipeline node's, with its
    component inline). The SDK's dump writes a local input path as an asset name (`azureml:/abs/path`);
    the given paths are put back."""
    import yaml

    job = job._to_job()
    spec = yaml.safe_load(io.StringIO(job_text(job)))
    for name, given in job.inputs.items():
        spec["inputs"][name]["path"] = given.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def job_text(job) -> str:
    stream = io.StringIO()
    job.dump(stream)
    return stream.getvalue()


def submit(job, workspace_config: str | None):
    """The job created in the workspace of `workspace_config` (workspace_file's; None: searched from .); the
    SDK's and Azure's errors as one line each (SubmitError). The SDK's own lines (the config file it found, every
    credential DefaultAzureCredential tried, upload progress bars) are silenced: the one line names the cause."""
    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

    logging.disable(logging.CRITICAL)
    try:
        try:
            client = MLClient.from_config(credential=DefaultAzureCredential(), path=workspace_config,
                                          show_progress=False)
        except Exception as error:  # the SDK raises its own exception types for a missing/invalid config
            # the SDK's first sentence: not found, or what the file it found lacks
            said = re.split(r"\.\s+(?=[A-Z])", first_line(error))[0]
            raise SubmitError(f"no usable AzureML workspace config found from {Path.cwd()} ({said}); "
                              f"{WORKSPACE_FIX} to ./config.json, or pass --workspace-config FILE") from None
        compute = job.compute  # as given: create_or_update puts the cluster's ARM id in its place
        try:
            return client.jobs.create_or_update(job)
        except Exception as error:
            raise sdk_error(error, compute) from None
    finally:
        logging.disable(logging.NOTSET)


WORKSPACE_KEYS = ("subscription_id", "resource_group", "workspace_name")  # MLClient.from_config's (or an ARM Scope)
WORKSPACE_FIX = "download the workspace's config.json from its Overview page in the Azure portal"


def workspace_file(given: str | None) -> str | None:
    """--workspace-config as MLClient.from_config reads it: a JSON object naming the workspace, in the file given or
    in config.json of the folder given; each problem named with the path. None: from_config searches from ."""
    if given is None:
        return None
    path = Path(given) / "config.json" if Path(given).is_dir() else Path(given)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problem = "does not exist"
    except OSError as error:
        problem = f"cannot be read ({error.strerror})"
    except ValueError as error:  # not JSON, not UTF-8
        problem = f"is not JSON ({error})"
    else:
        missing = [key for key in WORKSPACE_KEYS if key not in config] if isinstance(config, dict) else None
        problem = ("holds no JSON object" if missing is None else
                   f"lacks {', '.join(missing)}" if missing and not config.get("Scope") else None)
    if problem:
        raise SubmitError(f"--workspace-config {path} {problem}; {WORKSPACE_FIX} and pass that file")
    return str(path)


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# what a request that found no network says (urllib3 through azure-core): a name not resolved, no route, no answer
UNREACHABLE = re.compile(r"Failed to resolve|Name or service not known|Temporary failure in name resolution|"
                         r"Failed to establish a new connection|Network is unreachable|timed out")
NETWORK_FIX = "check this machine's network connection (behind a proxy: set HTTPS_PROXY) and submit again"
SERVICE_PRINCIPAL = ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET")  # EnvironmentCredential's


def login_problem(error: Exception) -> str:
    """The cause and fix of a failed login, from DefaultAzureCredential's message, which lists each credential
    it tried on a line of its own (`\tName: what it said`): no network, the service principal the AZURE_*
    variables set, else no login (the Azure CLI's line)."""
    tried = [line.strip() for line in str(error).splitlines() if line.startswith("\t")]

    def said(name: str) -> str:  # the line of the credential named, else the message's first
        return next((line for line in tried if line.startswith(f"{name}:")), first_line(error))

    if unreachable := next((line for line in tried if UNREACHABLE.search(line)), None):
        return f"Azure's login cannot be reached ({unreachable}); {NETWORK_FIX}"
    if all(os.environ.get(name) for name in SERVICE_PRINCIPAL):
        return (f"the service principal's login failed ({said('EnvironmentCredential')}); check "
                f"{', '.join(SERVICE_PRINCIPAL)} and submit again")
    return (f"no Azure login ({said('AzureCliCredential')}); sign in with `az login` (or set "
            f"{', '.join(SERVICE_PRINCIPAL)} of a service principal) and submit again")


def sdk_error(error: Exception, compute: str):
    """`error`, raised by azure-ai-ml or Azure while creating the job, as a SubmitError (one line
    with the fix its kind calls for), or `error` itself when it is neither's."""
    from azure.ai.ml.exceptions import MlException
    from azure.core.exceptions import AzureError, ClientAuthenticationError, ServiceRequestError

    if isinstance(error, ClientAuthenticationError):
        return SubmitError(f"the submit failed: {login_problem(error)}")
    if isinstance(error, ServiceRequestError):  # no answer: no network, a proxy, a firewall
        return SubmitError(f"the submit failed: Azure cannot be reached ({first_line(error)}); {NETWORK_FIX}")
    if isinstance(error, MlException):  # the SDK's checks of the job, or an asset it could not resolve
        fix = "correct what it names (--dry-run job.yml writes the job as submit.py builds it, to look at)"
    elif isinstance(error, AzureError):  # an HTTP error
        fix = (f"check that the workspace in config.json exists, that you may submit jobs to it and that it has a "
               f"compute cluster --compute {compute}")
    else:
        return error
    # the SDK's ValidationException, before log_and_raise_error's many-line rendering of it
    source = error.__context__ if isinstance(error.__context__, MlException) else error
    return SubmitError(f"the submit failed: {' '.join(str(source).split())}; {fix}")


def key_value(text: str) -> tuple:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    if not VARIABLE.fullmatch(key):
        raise argparse.ArgumentTypeError(f"{key!r} is not a variable name (letters, digits and _, not from a digit)")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="submit.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", metavar="JOB_YAML", type=Path, help="write the job YAML here, submit nothing")
    parser.add_argument("--compute", help="AzureML compute cluster name (a submit needs it; a --dry-run YAML "
                        "without it gets none)")
    parser.add_argument("--instance-count", type=int, default=1, help="nodes")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node")
    parser.add_argument("--ds-config", type=Path, default=ROOT / "ds_configs" / "ring_sp2.json",
                        help="DeepSpeed JSON (uploaded as an input)")
    parser.add_argument("--data", required=True,
                        help="folder with the preprocessed .bin/.idx and their vocab.txt or tokenizer.json: a local "
                             "path or an azureml:// URI")
    parser.add_argument("--data-prefix", default="corpus_text_sentence", help="the .bin/.idx name inside --data")
    parser.add_argument("--vocab", default="vocab.txt", help="the vocab file inside --data: a WordPiece vocab.txt, or "
                        "a Hugging Face tokenizer.json (a *.json: passed as --tokenizer-file)")
    parser.add_argument("--init-from-hf", metavar="DIR",
                        help="the Hugging Face model folder the run starts from (pretrain_bert.py's --init-from-hf), "
                             "mounted read-only: a local folder (uploaded) or an azureml:// URI")
    parser.add_argument("--image", default=default_image(),
                        help="base image of azureml/Dockerfile: a CUDA devel image of torch's CUDA (default %(default)s)")
    parser.add_argument("--checkpoints", metavar="URI",
                        help="datastore folder for the checkpoints (azureml://datastores/<store>/paths/<folder>; "
                             "default: a new one per job); the same URI again resumes from its last checkpoint")
    parser.add_argument("--data-cache", metavar="URI",
                        help="datastore folder for the index maps (default: a new one per job); the same URI again "
                             "reuses them")
    parser.add_argument("--env", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment variable (repeatable; overrides the NCCL defaults)")
    parser.add_argument("--experiment", default="bert-longseq")
    parser.add_argument("--display-name")
    parser.add_argument("--workspace-config", help="the workspace's config.json (default: search from .)")
    parser.add_argument("flags", nargs="*", help="after --: pretrain_bert.py flags")
    return parser


def parse_args(argv: list | None) -> argparse.Namespace:
    """submit.py's options before `--`, pretrain_bert.py's flags after it. A trainer flag before `--` (the `--`
    forgotten) is named as such: argparse's "unrecognized arguments" took the flag's value for a trainer flag."""
    argv = sys.argv[1:] if argv is None else list(argv)
    own, flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = build_parser()
    args, unknown = parser.parse_known_args(own)
    if unknown or args.flags:
        stray = next((word for word in unknown if word.startswith("--")), "")
        if stray and is_trainer_flag(stray):
            parser.refuse(f"{stray.split('=')[0]} is a flag of pretrain_bert.py, given before --",
                          f"put the trainer's flags after -- (submit.py [options] -- {stray.split('=')[0]} ...)")
        parser.error(f"unrecognized arguments: {' '.join(unknown + args.flags)}")
    args.flags = flags
    return args


def is_trainer_flag(word: str) -> bool:
    """Whether `word` names a flag of pretrain_bert.py (as argparse reads it: --flag=value, an abbreviation)."""
    from megatron.quiet import quiet_deepspeed

    quiet_deepspeed()  # before DeepSpeed's import: no accelerator warning
    from megatron.arguments import build_parser as trainer_parser, flags_given

    return bool(flags_given(trainer_parser(), [word]))


def main(argv=None) -> int:
    """The exit code: run_tool's one line for a mistake or a Ctrl-C."""
    return run_tool("submit.py", lambda: run(parse_args(argv)))


def run(args) -> None:
    if args.dry_run:  # the build context stays next to the YAML, which names it
        context = args.dry_run.parent / f"{args.dry_run.stem}_environment"
        check_dry_run(args.dry_run, context)
        from megatron.paths import missing_folders

        made, new_yaml = missing_folders(str(context)), not args.dry_run.exists()
        try:
            write_job_yaml(build_job(args, context), args.dry_run)
        except BaseException:  # a mistake the SDK finds, or a Ctrl-C (run_tool: "partial output removed")
            if new_yaml:
                args.dry_run.unlink(missing_ok=True)
            if made:  # the outermost folder made for the build context, with all it holds
                shutil.rmtree(made[-1], ignore_errors=True)
            raise
        print(args.dry_run)
        if not args.compute:  # az ml job create would send it to serverless compute's default VM, without GPUs
            print(f"warning: {args.dry_run} names no compute; pass --compute NAME, or submit it with `az ml job create "
                  f"-f {args.dry_run} --set compute=azureml:NAME`", file=sys.stderr, flush=True)
    else:
        if not args.compute:  # the job would go to serverless compute's default VM, without GPUs
            raise SubmitError("a submit needs --compute; pass the name of the workspace's GPU compute cluster "
                              "(--compute NAME), or --dry-run JOB_YAML to write the job without submitting it")
        workspace = workspace_file(args.workspace_config)  # before the checks' seconds
        with tempfile.TemporaryDirectory(prefix="bert-longseq-environment-") as context:
            print(submit(build_job(args, Path(context)), workspace).studio_url)


if __name__ == "__main__":
    sys.exit(main())
