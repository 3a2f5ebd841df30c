"""azureml/submit.py: the dry run writes a command job YAML that azure.ai.ml.load_job reads back
with the code folder, the image's build context (CUDA of the pinned torch, pinned requirements,
DeepSpeed ops prebuilt), the nodes, the distribution, the read-only data input, the read-write
checkpoint and index-map outputs and the NCCL variables; a real submit without a workspace
config stops with one line; bad input stops with one line before anything is written."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBMIT = ROOT / "azureml" / "submit.py"

try:
    from azure.ai.ml import load_job
except ImportError:  # optional extra: pip install -r requirements-azureml.txt
    load_job = None
needs_sdk = pytest.mark.skipif(load_job is None, reason="azure-ai-ml is not installed (pip install -r "
                               "requirements-azureml.txt); the AzureML submission cannot be built")


def submit(*argv, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SUBMIT), *map(str, argv)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
RUN_LENGTH = ["--train-iters", "10"]  # the trainer refuses a run without one (flag_checks.check_flag_combinations)


def with_run_length(argv: list) -> list:
    """submit.py's `argv` with a run length among the trainer's flags after `--` (unless it gives one)."""
    if {"--train-iters", "--train-samples"} & set(argv):
        return argv
    return [*argv, *RUN_LENGTH] if "--" in argv else [*argv, "--", *RUN_LENGTH]


def data_folder(folder: Path, prefix: str = "corpus_text_sentence", tokenizer: str = "vocab.txt") -> Path:
    """A local --data folder as tools/preprocess_data.py leaves it with `tokenizer` (vocab.txt, or
    tokenizer.json: a Hugging Face one) and its record of that tokenizer; vocab.txt, other.txt and
    tokenizer.json all have other tokens (the .bin/.idx are not read)."""
    from megatron.data.tokenizer import build_tokenizer
    from megatron.data.tokenizer_identity import write_data_identity
    from megatron.hf_modernbert import wordpiece_tokenizer_json

    folder.mkdir(parents=True)
    for name in (f"{prefix}.bin", f"{prefix}.idx"):
        (folder / name).write_bytes(b"")
    (folder / "vocab.txt").write_text("\n".join([*SPECIALS, "a", "b"]) + "\n")
    (folder / "other.txt").write_text("\n".join([*SPECIALS, "c", "d"]) + "\n")
    (folder / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json([*SPECIALS, "e", "f"], True)))
    hf = tokenizer.endswith(".json")
    write_data_identity(build_tokenizer(None, None if hf else folder / tokenizer, folder / tokenizer if hf else None),
                        str(folder / prefix))
    return folder


@needs_sdk
def test_dry_run_yaml_reloads(tmp_path):
    job_file, data = tmp_path / "job.yml", data_folder(tmp_path / "data", "wiki_text_sentence")
    checkpoints = "azureml://datastores/workspaceblobstore/paths/bert/run1/checkpoints"
    result = submit("--dry-run", job_file, "--compute", "gpu-a100", "--instance-count", 2, "--gpus-per-node", 4,
                    "--data", "data",
                    "--data-prefix", "wiki_text_sentence", "--env", "NCCL_DEBUG=INFO", "--checkpoints", checkpoints, "--",
                    "--train-iters", 10, "--max-position-embeddings", 8192, "--seq-length", 8192,
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    job = load_job(job_file)
    assert job.type == "command" and Path(job.code) == ROOT
    assert job.resources.instance_count == 2 and job.compute == "gpu-a100"
    assert job.distribution.type == "pytorch" and job.distribution.process_count_per_instance == 1
    data_input = job.inputs["data"]
    assert (data_input.type, data_input.path, data_input.mode) == ("uri_folder", str(data), "ro_mount")
    assert job.inputs["ds_config"].path == str(ROOT / "ds_configs" / "ring_sp2.json")
    assert {name: (output.type, output.mode, output.path) for name, output in job.outputs.items()} == {
        "checkpoints": ("uri_folder", "rw_mount", checkpoints), "data_cache": ("uri_folder", "rw_mount", None)}
    assert job.environment_variables["NCCL_DEBUG"] == "INFO" and job.environment_variables["NCCL_SOCKET_IFNAME"]
    context = Path(job.environment.build.path)
    assert context == tmp_path / "job_environment" and job.environment.image is None
    assert (context / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()
    dockerfile = (context / "Dockerfile").read_text()
    assert "ARG IMAGE=nvidia/cuda:13.0.0-devel-ubuntu22.04\nFROM ${IMAGE}" in dockerfile
    assert "DS_BUILD_FUSED_ADAM=1" in dockerfile and "COPY requirements.txt" in dockerfile
    assert "python -m deepspeed.launcher.launch" in job.command and "--node_rank=$NODE_RANK" in job.command
    assert "--data-path ${{inputs.data}}/wiki_text_sentence --vocab-file ${{inputs.data}}/vocab.txt" in job.command
    assert "--save ${{outputs.checkpoints}} --load ${{outputs.checkpoints}}" in job.command
    assert "--data-cache-path ${{outputs.data_cache}}" in job.command
    assert "--deepspeed_config ${{inputs.ds_config}}" in job.command and job.command.endswith("--seq-length 8192")


def load_submit_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("azureml_submit", SUBMIT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OLD_IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.8-cudnn8-ubuntu22.04"  # the image before: CUDA 11.8


def test_image_cuda_is_the_pinned_torchs_for_deepspeeds_op_builds(monkeypatch):
    """The default image's CUDA passes the check DeepSpeed's FusedAdam/CPUAdam build runs against
    torch's CUDA (its assert_no_cuda_mismatch; DS_SKIP_CUDA_CHECK unset); the image of before does
    not, and submit.py refuses it before writing anything."""
    import torch
    from deepspeed.ops.op_builder import builder

    module = load_submit_module()
    monkeypatch.delenv("DS_SKIP_CUDA_CHECK", raising=False)
    torch_cuda = module.TORCH_CUDA[module.pinned("torch")]  # a new torch pin must state its CUDA
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    for image, accepted in ((module.default_image(), True), (OLD_IMAGE, False)):
        major, minor = module.image_cuda(image).split(".")
        monkeypatch.setattr(builder, "installed_cuda_version", lambda name="": (int(major), int(minor)))
        if accepted:
            assert builder.assert_no_cuda_mismatch("fused_adam")
            module.check_image(image)
        else:
            with pytest.raises(builder.CUDAMismatchException):
                builder.assert_no_cuda_mismatch("fused_adam")
            with pytest.raises(module.SubmitError, match="is CUDA 11.8, the pinned torch"):
                module.check_image(image)


@needs_sdk
def test_submit_without_workspace_config_is_one_line(tmp_path):
    result = submit("--compute", "gpu-cluster", "--data", data_folder(tmp_path / "data"), "--", *RUN_LENGTH,
                    cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"submit.py: error: no usable AzureML workspace config found from {tmp_path} (We could not find config.json "
        "in: . or in its parent directories); download the workspace's config.json from its Overview page in the "
        "Azure portal to ./config.json, or pass --workspace-config FILE"], result.stderr


@needs_sdk
def test_the_help_example_passes_its_own_dry_run(tmp_path, monkeypatch, capsys):
    """The example of `submit.py --help` (the module's docstring) stopped its own dry run: hidden size 1024 is not
    divisible by the default 12 attention heads. Run from the repository, as written, with a datastore named."""
    module = load_submit_module()
    example = next(line for line in module.__doc__.splitlines() if line.strip().startswith("python azureml/submit.py "))
    monkeypatch.chdir(ROOT)
    argv = shlex.split(example.replace("<store>", "workspaceblobstore"))[2:]
    assert module.main(["--dry-run", str(tmp_path / "job.yml"), *argv]) == 0, capsys.readouterr().err
    assert load_job(tmp_path / "job.yml").command.endswith("--num-attention-heads 16 --train-iters 100000")


class OfflineCredential:
    """An Azure credential that gives no token: whatever would reach Azure stops the test."""

    def get_token(self, *scopes, **kwargs):
        raise AssertionError("the offline submit asked for a token (a network call)")

    get_token_info = get_token


@pytest.fixture
def offline_workspace(tmp_path, monkeypatch):
    """A workspace config.json in tmp_path, and azure-ai-ml's create_or_update with its Azure calls
    replaced by records: the uploads of local inputs, the ARM ids of the code, environment and compute
    (and the files of the image's build context then), and the request body it would PUT, answered
    with itself. Everything before them (the SDK's checks of the job, its REST form) runs as it would;
    returns the list of records."""
    import azure.identity
    from azure.ai.ml.operations import _job_operations
    from azure.ai.ml.operations._operation_orchestrator import OperationOrchestrator

    (tmp_path / "config.json").write_text(json.dumps({"subscription_id": "00000000-0000-0000-0000-000000000000",
                                                      "resource_group": "rg", "workspace_name": "ws"}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", OfflineCredential)
    records = []

    def upload(scope, datastores, path, **kwargs):
        records.append(("upload", str(path)))
        return f"azureml://datastores/workspaceblobstore/paths/LocalUpload{path}"

    def arm_id(self, asset, azureml_type, *args, **kwargs):
        records.append((azureml_type, asset))
        if azureml_type == "environments":  # the image's build context, uploaded here, is a temporary folder
            records.append(("build context", sorted(path.name for path in Path(asset.build.path).iterdir())))
        name = asset if isinstance(asset, str) else "x"
        return f"/subscriptions/0/resourceGroups/rg/workspaces/ws/{azureml_type}/{name}"

    def put(self, rest_job_resource, **kwargs):
        records.append(("put", rest_job_resource))
        return rest_job_resource

    monkeypatch.setattr(_job_operations, "_upload_and_generate_remote_uri", upload)
    monkeypatch.setattr(OperationOrchestrator, "get_asset_arm_id", arm_id)
    monkeypatch.setattr(OperationOrchestrator, "resolve_azureml_id", lambda self, arm_id=None, **kwargs: arm_id)
    monkeypatch.setattr(_job_operations.JobOperations, "_create_or_update_with_different_version_api", put)
    return records


@needs_sdk
def test_submit_passes_the_sdks_checks_with_every_field(tmp_path, offline_workspace, capsys):
    """azure-ai-ml's jobs.create_or_update, offline: the job submit.py builds passes the SDK's own
    checks (a CommandJob entity did not: "Non supported job type", so no submit could work) and the
    request it would send holds the compute, the nodes, the distribution, the image's build context,
    the code folder, the inputs and outputs with their modes, the command line and the variables.
    A local Hugging Face folder to start from is uploaded and mounted as the data is (its path on this
    machine was written into the command, which the node could not read)."""
    from test_hf_convert import hf_model

    module = load_submit_module()
    data = data_folder(tmp_path / "data")
    _, weights = hf_model("bert", tmp_path, heads=False, vocab_size=len(SPECIALS) + 2, hidden_size=64,
                          num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    capsys.readouterr()  # transformers' progress bar
    argv = ["--compute", "gpu-cluster", "--instance-count", "2", "--gpus-per-node", "4", "--data", str(data),
            "--init-from-hf", str(weights), "--env", "NCCL_DEBUG=INFO", "--display-name", "run1", "--",
            "--num-layers", "2", *RUN_LENGTH]
    assert module.main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().err == ""
    [body] = [record for kind, record in offline_workspace if kind == "put"]
    sent = body.properties.as_dict()
    assert sent["jobType"] == "Command" and sent["computeId"].endswith("/gpu-cluster")
    assert sent["resources"]["instanceCount"] == 2
    assert sent["distribution"] == {"distributionType": "PyTorch", "processCountPerInstance": 1}
    assert sent["command"] == module.node_command(2, 4, "corpus_text_sentence", "vocab.txt",
                                                  ["--num-layers", "2", *RUN_LENGTH], init_from_hf=True)
    assert "--init-from-hf ${{inputs.init_from_hf}} --num-layers 2" in sent["command"]
    assert sent["environmentVariables"] == {**module.NCCL_ENV, "NCCL_DEBUG": "INFO"}
    assert (sent["experimentName"], sent["displayName"]) == ("bert-longseq", "run1")
    inputs = {name: (given["jobInputType"], given.get("mode"), given["uri"]) for name, given in sent["inputs"].items()}
    assert inputs == {
        "ds_config": ("uri_file", None, f"azureml://datastores/workspaceblobstore/paths/LocalUpload{module.ROOT}"
                                        "/ds_configs/ring_sp2.json"),
        "data": ("uri_folder", "ReadOnlyMount", f"azureml://datastores/workspaceblobstore/paths/LocalUpload{data}/"),
        "init_from_hf": ("uri_folder", "ReadOnlyMount",
                         f"azureml://datastores/workspaceblobstore/paths/LocalUpload{weights}/")}
    assert {name: given["mode"] for name, given in sent["outputs"].items()} == {
        "checkpoints": "ReadWriteMount", "data_cache": "ReadWriteMount"}
    assets = dict(record for record in offline_workspace if record[0] in ("codes", "build context"))
    assert Path(assets["codes"].path) == module.ROOT and assets["build context"] == ["Dockerfile", "requirements.txt"]


@needs_sdk
@pytest.mark.parametrize("refusal", ["http", "no_connection", "sdk_check"])
def test_an_sdk_error_at_submit_is_one_line(refusal, tmp_path, offline_workspace, monkeypatch, capsys):
    """Azure's answer, no connection (was "check that the workspace exists") or one of the SDK's checks: one line
    with the cause, exit 2."""
    from azure.ai.ml._exception_helper import log_and_raise_error
    from azure.ai.ml.exceptions import ErrorTarget, ValidationErrorType, ValidationException
    from azure.ai.ml.operations import _job_operations
    from azure.core.exceptions import HttpResponseError, ServiceRequestError

    def refuse(self, rest_job_resource, **kwargs):
        if refusal == "http":
            raise HttpResponseError("(ResourceNotFound) compute gpu-cluster not found\nCode: ResourceNotFound")
        if refusal == "no_connection":
            raise ServiceRequestError("<urllib3.connection.HTTPSConnection object>: Failed to resolve "
                                      "'management.azure.com' ([Errno -2] Name or service not known)")
        try:  # as the SDK raises its checks' errors: rendered on many lines by log_and_raise_error
            raise ValidationException(message="instance_count must be positive", no_personal_data_message="",
                                      target=ErrorTarget.JOB, error_type=ValidationErrorType.INVALID_VALUE)
        except ValidationException as error:
            log_and_raise_error(error)

    monkeypatch.setattr(_job_operations.JobOperations, "_create_or_update_with_different_version_api", refuse)
    module = load_submit_module()
    argv = ["--compute", "gpu-cluster", "--gpus-per-node", "2", "--data", str(data_folder(tmp_path / "data")), "--",
            *RUN_LENGTH]
    assert module.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    cause = {"http": "(ResourceNotFound) compute gpu-cluster not found Code: ResourceNotFound",
             "no_connection": "Azure cannot be reached (<urllib3.connection.HTTPSConnection object>: Failed to resolve "
                              "'management.azure.com' ([Errno -2] Name or service not known)); check this machine's "
                              "network connection (behind a proxy: set HTTPS_PROXY)",
             "sdk_check": "instance_count must be positive; correct what it names"}[refusal]
    assert len(lines) == 1 and lines[0].startswith("submit.py: error: the submit failed: ") and cause in lines[0], lines


# what DefaultAzureCredential's EnvironmentCredential says without a network, with a wrong secret
NO_DNS = ("Authentication failed: HTTPSConnection(host='login.microsoftonline.com', port=443): Failed to resolve "
          "'login.microsoftonline.com' ([Errno -2] Name or service not known)")
WRONG_SECRET = "Authentication failed: AADSTS7000215: Invalid client secret provided."
SERVICE_PRINCIPAL = {"AZURE_TENANT_ID": "t", "AZURE_CLIENT_ID": "c", "AZURE_CLIENT_SECRET": "s"}


@needs_sdk
@pytest.mark.parametrize("cause, line", [
    ("no_login", "no Azure login (AzureCliCredential: Azure CLI not found on path); sign in with `az login` (or set "
                 "AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET of a service principal) and submit again"),
    ("no_network", f"Azure's login cannot be reached (EnvironmentCredential: {NO_DNS}); check this machine's network "
                   "connection (behind a proxy: set HTTPS_PROXY) and submit again"),
    ("wrong_secret", f"the service principal's login failed (EnvironmentCredential: {WRONG_SECRET}); check "
                     "AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET and submit again")])
def test_a_failed_login_is_one_line_naming_its_cause(cause, line, tmp_path, offline_workspace, monkeypatch, capsys):
    """A failed login printed the SDK's "Found the config file in: ./config.json" and DefaultAzureCredential's lines
    for each credential it tried before the one line, whose fix said `az login` even with a service principal's
    AZURE_* variables set and no network, the cause it left out. Azure's own chain of credentials here, their
    answers stood in for; the SDK's log handler writes to this test's stderr."""
    import logging
    from azure.ai.ml.operations import _job_operations
    from azure.core.exceptions import ClientAuthenticationError
    from azure.identity import ChainedTokenCredential, CredentialUnavailableError

    class EnvironmentCredential:
        def get_token(self, *scopes, **kwargs):
            if cause == "no_login":
                raise CredentialUnavailableError("EnvironmentCredential authentication unavailable. Environment "
                                                 "variables are not fully configured.")
            raise ClientAuthenticationError(NO_DNS if cause == "no_network" else WRONG_SECRET)

    class AzureCliCredential:
        def get_token(self, *scopes, **kwargs):
            raise CredentialUnavailableError("Azure CLI not found on path")

    def put(self, rest_job_resource, **kwargs):  # the request asks for its token
        ChainedTokenCredential(EnvironmentCredential(), AzureCliCredential()).get_token("https://management.azure.com")

    for name in SERVICE_PRINCIPAL:
        if cause == "no_login":
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, SERVICE_PRINCIPAL[name])
    for handler in logging.getLogger("azure.ai.ml").handlers:  # the SDK's StreamHandler (pytest adds its own)
        if type(handler) is logging.StreamHandler:
            monkeypatch.setattr(handler, "stream", sys.stderr)
    monkeypatch.setattr(_job_operations.JobOperations, "_create_or_update_with_different_version_api", put)
    argv = ["--compute", "gpu-cluster", "--gpus-per-node", "2", "--data", str(data_folder(tmp_path / "data")), "--",
            *RUN_LENGTH]
    assert load_submit_module().main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [f"submit.py: error: the submit failed: {line}"]


@pytest.mark.parametrize("config, problem", [
    ("{tmp}/nowhere.json", "{tmp}/nowhere.json does not exist"),
    ("{tmp}", "{tmp}/config.json does not exist"),  # a folder: its config.json
    ("{tmp}/text.json", "{tmp}/text.json is not JSON (Expecting value: line 1 column 1 (char 0))"),
    ("{tmp}/partial.json", "{tmp}/partial.json lacks resource_group, workspace_name"),
])
def test_a_bad_workspace_config_is_named(config, problem, tmp_path, capsys):
    """Each was "no AzureML workspace config found ... or pass --workspace-config FILE", the flag given; now the
    path and what is wrong with it, before the seconds of the trainer's checks."""
    (tmp_path / "text.json").write_text("not json\n")
    (tmp_path / "partial.json").write_text('{"subscription_id": "0"}')
    argv = ["--compute", "gpu", "--data", str(tmp_path), "--workspace-config", config.format(tmp=tmp_path)]
    assert load_submit_module().main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"submit.py: error: --workspace-config {problem.format(tmp=tmp_path)}; download the workspace's config.json "
        "from its Overview page in the Azure portal and pass that file"]


def test_a_submit_without_compute_is_refused(tmp_path, capsys):
    """Without --compute the job would go to serverless compute's default VM (no GPUs): refused
    before anything is built; a --dry-run needs none."""
    module = load_submit_module()
    assert module.main(["--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "submit.py: error: a submit needs --compute; pass the name of the workspace's GPU compute cluster "
        "(--compute NAME), or --dry-run JOB_YAML to write the job without submitting it"]


@needs_sdk
def test_a_dry_run_without_compute_warns_that_its_yaml_names_none(tmp_path, capsys):
    """`az ml job create -f` on a YAML without compute runs on serverless compute's default VM, without GPUs:
    the YAML is written (compute can be set at submit), with one line saying how."""
    module, job_file = load_submit_module(), tmp_path / "job.yml"
    data = data_folder(tmp_path / "data", "wiki_text_sentence")
    assert module.main(["--dry-run", str(job_file), "--data", str(data), "--data-prefix", "wiki_text_sentence", "--",
                        *RUN_LENGTH]) == 0
    assert load_job(job_file).compute is None
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {job_file} names no compute; pass --compute NAME, or submit it with `az ml job create -f "
        f"{job_file} --set compute=azureml:NAME`"]


def test_missing_ds_config_is_one_line(tmp_path):
    result = submit("--dry-run", tmp_path / "job.yml", "--data", tmp_path, "--ds-config", tmp_path / "no.json",
                    cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("submit.py: error:")]
    assert result.returncode == 2 and len(errors) == 1 and "no.json" in errors[0], result.stderr
    assert not (tmp_path / "job.yml").exists() and not (tmp_path / "job_environment").exists()


@needs_sdk
def test_a_dry_run_stopped_while_writing_leaves_nothing(tmp_path, monkeypatch, capsys):
    """Ctrl-C during a dry run said "partial output removed" and left the image's build context (and the folders
    made for it); a stop while the YAML is written leaves no part of it either."""
    module = load_submit_module()
    job_file = tmp_path / "new" / "folder" / "job.yml"

    def interrupted(job, path):
        path.write_text("type: comm")
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "write_job_yaml", interrupted)
    assert module.main(["--dry-run", str(job_file), "--data", str(data_folder(tmp_path / "data")), "--",
                        *RUN_LENGTH]) == 130
    assert capsys.readouterr().err.splitlines()[-1].startswith("submit.py: error: interrupted by SIGINT, partial "
                                                                "output removed")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data"]


def test_a_flag_mistake_is_one_line_without_the_usage_block(capsys):
    """`--env NCCL_DEBUG` (no =VALUE) printed argparse's ten-line usage block before the line, unlike
    every other tool."""
    with pytest.raises(SystemExit, match="^2$"):
        load_submit_module().main(["--data", "x", "--env", "NCCL_DEBUG"])
    assert capsys.readouterr().err.splitlines() == [
        "submit.py: error: argument --env: 'NCCL_DEBUG' is not KEY=VALUE; see submit.py --help"]
    with pytest.raises(SystemExit, match="^2$"):  # was written into the job's variables as it was
        load_submit_module().main(["--data", "x", "--env", "BAD NAME=1"])
    assert capsys.readouterr().err.splitlines() == [
        "submit.py: error: argument --env: 'BAD NAME' is not a variable name (letters, digits and _, not from a "
        "digit); see submit.py --help"]


def test_a_trainer_flag_before_the_double_dash_is_named(capsys):
    """`submit.py ... --num-layers 2 --train-iters 10` (the `--` forgotten) said "unrecognized arguments:
    --num-layers --train-iters 10", having taken the 2 for a trainer flag; a mistyped option of submit.py's own
    stays argparse's line."""
    module = load_submit_module()
    with pytest.raises(SystemExit, match="^2$"):
        module.main(["--data", "x", "--num-layers", "2", "--train-iters", "10"])
    assert capsys.readouterr().err.splitlines() == [
        "submit.py: error: --num-layers is a flag of pretrain_bert.py, given before --; put the trainer's flags after "
        "-- (submit.py [options] -- --num-layers ...)"]
    with pytest.raises(SystemExit, match="^2$"):
        module.main(["--data", "x", "--instanse-count", "2", "--", "--num-layers", "2"])
    assert capsys.readouterr().err.splitlines() == [
        "submit.py: error: unrecognized arguments: --instanse-count 2; see submit.py --help"]


def test_hf_tokenizer_data_goes_as_tokenizer_file_and_names_are_quoted(tmp_path):
    """Data made with a Hugging Face tokenizer.json passes (the trainer reads it with --tokenizer-file,
    not --vocab-file); --data-prefix and --vocab reach the node's shell as one word each."""
    module = load_submit_module()
    data = data_folder(tmp_path / "data", "my corpus", "tokenizer.json")
    module.validate(module.parse_args(["--gpus-per-node", "2", "--data", str(data), "--data-prefix", "my corpus",
                                       "--vocab", "tokenizer.json", "--", *RUN_LENGTH]))
    words = shlex.split(module.node_command(1, 2, "x; rm -rf /", "my tokenizer.json", []))
    assert words[words.index("--data-path") + 1] == "${{inputs.data}}/x; rm -rf /"
    assert words[words.index("--tokenizer-file") + 1] == "${{inputs.data}}/my tokenizer.json"
    assert "--vocab-file" not in words


REMOTE_DATA = "azureml://datastores/workspaceblobstore/paths/wiki/"
# validated as the trainer validates, before anything is written: (submit.py flags, phrases of the error)
REFUSED = {
    "world_does_not_fit_the_json": (["--instance-count", "1", "--gpus-per-node", "3"],
                                    ("sequence_parallel.size 2 x pipeline 1 does not divide the world size 3",
                                     "; set --instance-count x --gpus-per-node to a multiple of 2, or pass "
                                     "--sequence-parallel-size 1 or 3 after -- to run on 3 GPUs")),
    "unknown_trainer_flag": (["--", "--num-layerz", "2"], ("pretrain_bert.py flags after --: unrecognized "
                                                           "arguments: --num-layerz 2",)),
    "bad_trainer_value": (["--", "--mask-prob", "0"], ("--mask-prob 0.0 is outside (0, 1]",)),
    "invalid_json": (["--ds-config", "{tmp}/bad.json"], ("bad.json:1:17: invalid JSON",)),
    "json_scheduler": (["--ds-config", "{tmp}/scheduler.json"], ('"scheduler" section is not used',)),
    "adam_param_of_torchs_adam_only": (["--ds-config", "{tmp}/foreach.json"],  # the job's GPUs get DeepSpeed's Adam
                                       ("optimizer.params.foreach is not a parameter of DeepSpeed's AdamW",)),
    "adam_flag_with_an_sgd_json": (["--ds-config", "{tmp}/sgd.json", "--", "--adam-beta1", "0.5"],
                                   ("--adam-beta1 0.5 is given but optimizer.type SGD takes no betas",)),
    "min_lr_above_the_jsons_lr": (["--", "--min-lr", "0.1"], ("--min-lr 0.1 is above the JSON's optimizer.params.lr",)),
    "missing_local_data": (["--data", "{tmp}/nowhere"], ("--data {tmp}/nowhere is not a folder",)),
    "data_without_the_prefix": (["--data-prefix", "wiki"], ("has no wiki.bin",)),
    "image_of_another_cuda": (["--image", OLD_IMAGE], ("is CUDA 11.8, the pinned torch 2.13.0's wheels are CUDA 13.0",)),
    "flag_the_job_sets": (["--", "--save", "/tmp/x"], ("--save is set by the job (a mount point); pass "
                                                       "--checkpoints to submit.py instead",)),
    "abbreviation_of_a_flag_the_job_sets": (["--", "--loa", "/tmp/x"], ("--load is set by the job",)),
    "abbreviation_of_the_jobs_data_path": (["--", "--data-pat", "x"], ("--data-path is set by the job (a mount "
                                                                       "point); pass --data and --data-prefix",)),
    "vocab_other_than_the_datas": (["--vocab", "other.txt"], ("whose tokens differ from the run's {tmp}/data/other.txt",
                                                              "; pass --vocab the vocab.txt or tokenizer.json")),
    "tokenizer_json_other_than_the_datas": (["--vocab", "tokenizer.json"], ("whose tokens differ",)),
    "prefix_with_its_suffix": (["--data-prefix", "corpus_text_sentence.bin"],
                               ("ends in a file suffix; pass --data-prefix corpus_text_sentence ",)),
    "dry_run_into_a_folder": (["--dry-run", "{tmp}"], ("--dry-run {tmp} is a folder; pass the job YAML's file name",)),
    "dry_run_below_a_file": (["--dry-run", "{tmp}/bad.json/job.yml"], ("its folder {tmp}/bad.json is a file, not a directory",)),
    "checkpoints_not_on_a_datastore": (["--checkpoints", "./ckpt"], ("--checkpoints ./ckpt is not a datastore path",)),
    # accepted before, each failing only on the node (or in the SDK, a build context left behind)
    "ds_config_a_folder": (["--ds-config", "{tmp}"], ("--ds-config {tmp} is a folder, not a JSON file; pass a JSON",)),
    "checkpoints_without_a_folder": (["--checkpoints", "azureml://"], (
        "--checkpoints azureml:// is not a datastore path; pass --checkpoints azureml://datastores/",)),
    "compute_with_a_space": (["--compute", "gpu cluster"], ("--compute 'gpu cluster' is not a compute name (letters, "
                                                            "digits and hyphens",)),
    "empty_vocab": (["--data", REMOTE_DATA, "--vocab", ""], ("--vocab is empty; pass the vocab.txt or tokenizer.json "
                                                             "inside --data",)),
    "empty_data_prefix": (["--data", REMOTE_DATA, "--data-prefix", ""], ("--data-prefix is empty; pass the .bin",)),
    "empty_image": (["--data", REMOTE_DATA, "--image", ""], ("--image is empty; pass a CUDA 13.0 devel image, or leave "
                                                             "--image out for the default nvidia/cuda:13.0.0",)),
    # written into the job's command as given: the node has no such folder
    "init_from_hf_after_the_dashes": (["--", "--init-from-hf", "{tmp}/data"], (
        "--init-from-hf is set by the job (a mount point); pass --init-from-hf to submit.py instead",)),
    "init_from_hf_missing": (["--init-from-hf", "{tmp}/nowhere"], ("--init-from-hf {tmp}/nowhere is not a folder; pass "
                                                                   "a local Hugging Face model folder",)),
    "init_from_hf_without_weights": (["--init-from-hf", "{tmp}/data"], ("{tmp}/data holds no model.safetensors or "
                                                                        "pytorch_model.bin",)),
    # world_info for every node was built until the process was killed
    "absurd_instance_count": (["--instance-count", "99999999999999"], (
        "--instance-count 99999999999999 is more nodes than an AzureML compute cluster has (at most 4000",)),
    "absurd_gpus_per_node": (["--gpus-per-node", "80"], (
        "--gpus-per-node 80 is more GPUs than an Azure machine has (8 on the largest GPU sizes",)),
    # a monitor service whose package the job's image lacks: the trainer would stop on the cluster with a pip install
    "wandb_the_image_lacks": (["--ds-config", "{tmp}/wandb.json"], (
        "--ds-config {tmp}/wandb.json enables wandb, whose package wandb the job's image (built from requirements.txt) "
        "does not have; add wandb to requirements.txt and run it offline (--env WANDB_MODE=offline: its files under "
        "./outputs) or pass the key from a workspace secret (--env WANDB_API_KEY=... is written in plain text into "
        "the job's definition), or set wandb.enabled to false",)),
    "comet_the_image_lacks": (["--ds-config", "{tmp}/comet.json"], ("enables comet, whose package comet_ml",
                                                                    "COMET_API_KEY")),
    # the trainer's flag combinations with the flags the job adds (--save and --load, --init-from-hf): each passed the
    # dry run and stopped the job at start-up
    "no_run_length": (["--", "--num-layers", "2"], ("the run length is not set; pass --train-iters N",)),
    "position_extension_without_init_from_hf": (["--", "--no-position-extension"], (
        "--no-position-extension is given without --init-from-hf",)),
    "finetune_with_init_from_hf": (["--init-from-hf", "{tmp}/data", "--", "--finetune"], (
        "--finetune is given with --init-from-hf",)),
    # the LR schedule against the run's length, as the trainer's Schedule checks it
    "wsd_anneal_longer_than_the_run": (["--", "--train-iters", "100", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters",
                                        "200"], ("--lr-wsd-decay-iters 200 is longer than the 99 steps between the "
                                                 "warm-up's end (1) and the decay's (100); pass a --lr-wsd-decay-iters "
                                                 "of at most 99",)),
    "wsd_anneal_longer_than_the_samples": (["--", "--train-samples", "640", "--lr-decay-style", "WSD",
                                            "--lr-wsd-decay-iters", "100"], ("--lr-wsd-decay-iters 100 is longer",)),
    "decay_within_the_warmup": (["--", "--lr-warmup-iters", "5", "--lr-decay-iters", "5"], (
        "--lr-decay-iters 5 ends the decay before the 5 warm-up steps do",)),
    "no_room_for_a_sample": (["--", "--seq-length", "4", "--max-position-embeddings", "4"], (
        "--seq-length 4 leaves no room for a sample's text",)),
    # names the job reads inside its --data mount: written as ${{inputs.data}}//abs/path or ${{inputs.data}}/../x
    "vocab_an_absolute_path": (["--vocab", "{tmp}/data/vocab.txt"], (
        "--vocab {tmp}/data/vocab.txt is an absolute path: the job reads it inside the --data folder it mounts "
        "(${{{{inputs.data}}}}/{tmp}/data/vocab.txt); pass --vocab vocab.txt, its name inside --data",)),
    "data_prefix_out_of_the_data": (["--data-prefix", "../data/corpus_text_sentence"], (
        "--data-prefix ../data/corpus_text_sentence is a path out of --data",
        "pass --data-prefix corpus_text_sentence, its name inside --data")),
    "vocab_elsewhere": (["--vocab", "../x.txt"], ("pass --vocab with the name of a file inside --data {tmp}/data, or "
                                                  "copy ../x.txt into it",)),
    # a mistyped datastore URI was taken for a remote folder and written into the job
    "data_uri_mistyped": (["--data", "azurml://datastores/x/paths/y"], (
        "--data azurml://datastores/x/paths/y is not a datastore path; pass --data azureml://datastores/<store>/paths/"
        "<folder>, or a local folder",)),
    "data_uri_with_one_slash": (["--data", "azureml:/datastores/x/paths/y"], ("is not a datastore path",)),
    "data_uri_without_a_folder": (["--data", "azureml://datastores/x"], ("is not a datastore path",)),
    "init_from_hf_uri_mistyped": (["--init-from-hf", "azureml:/datastores/x/paths/hf"], (
        "--init-from-hf azureml:/datastores/x/paths/hf is not a datastore path",)),
    # a missing file named with what the folder holds, the defaults named as such
    "default_prefix_missing": (["--data", "{tmp}/hf data"], (
        "--data {tmp}/hf data has no corpus_text_sentence.bin (the default --data-prefix); pass --data-prefix "
        "wiki_text_sentence (the .bin/.idx in it)",)),
    "default_vocab_missing": (["--data", "{tmp}/hf data", "--data-prefix", "wiki_text_sentence"], (
        "--data {tmp}/hf data has no vocab.txt (the default --vocab); pass --vocab tokenizer.json, the tokenizer its "
        "data's vocab record names",)),
}


@pytest.mark.parametrize("case", REFUSED)
def test_submit_validates_as_the_trainer(case, tmp_path, capsys):
    """In-process (one import of the trainer for all cases): one line, exit 2, no job.yml and no
    build context (beside the job.yml, or beside a --dry-run folder)."""
    module = load_submit_module()
    (tmp_path / "bad.json").write_text('{"train_batch": }')
    (tmp_path / "scheduler.json").write_text('{"train_micro_batch_size_per_gpu": 4, "scheduler": {"type": "WarmupLR"}}')
    (tmp_path / "foreach.json").write_text('{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", '
                                           '"params": {"foreach": true}}}')
    (tmp_path / "sgd.json").write_text('{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", '
                                       '"params": {"lr": 0.01}}}')
    for service in ("wandb", "comet"):
        (tmp_path / f"{service}.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 4,
                                                              service: {"enabled": True, "project": "p"}}))
    (data_folder(tmp_path / "hf data", "wiki_text_sentence", "tokenizer.json") / "vocab.txt").unlink()
    argv, phrases = REFUSED[case]
    argv = [part.format(tmp=tmp_path) for part in argv]
    data = ["--data", str(data_folder(tmp_path / "data"))] if "--data" not in argv else []
    assert module.main(["--dry-run", str(tmp_path / "job.yml"), *data, *(argv if case == "no_run_length" else with_run_length(argv))]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("submit.py: error: "), lines
    assert all(phrase.format(tmp=tmp_path) in lines[0] for phrase in phrases), lines[0]
    assert not (tmp_path / "job.yml").exists() and not (tmp_path / "job_environment").exists()
    assert not (tmp_path.parent / f"{tmp_path.name}_environment").exists()


@needs_sdk
def test_monitor_files_the_job_would_lose_and_a_service_without_a_key_are_warned_of(tmp_path, capsys, monkeypatch):
    """The job keeps ./outputs (and the checkpoints): a monitor writing elsewhere (an absolute path in node 0's
    container, the code folder, a ~) is lost with the job, and wandb without WANDB_API_KEY stops at start-up on
    the cluster; one warning line each, the job YAML written. Paths under outputs/ and an offline wandb pass."""
    module, job_file = load_submit_module(), tmp_path / "job.yml"
    monkeypatch.setattr(module, "in_requirements", lambda package: True)  # an image with the package
    data = ["--data", str(data_folder(tmp_path / "data")), "--compute", "gpu"]

    def dry_run(*argv) -> int:
        return module.main(with_run_length(["--dry-run", str(job_file), *data, *argv]))
    lost = {"csv_monitor": {"enabled": True, "output_path": "/tmp/csv"}, "tensorboard": {"enabled": True},
            "flops_profiler": {"enabled": True, "output_file": "~/flops.txt"}, "wandb": {"enabled": True}}
    (tmp_path / "lost.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, **lost}))
    assert dry_run("--ds-config", str(tmp_path / "lost.json")) == 0
    lines = capsys.readouterr().err.splitlines()
    config = tmp_path / "lost.json"
    assert lines == [
        f"submit.py: warning: --ds-config {config} enables wandb and the job gets no WANDB_API_KEY (it would stop at "
        "start-up without a login); run it offline (--env WANDB_MODE=offline: its files under ./outputs) or pass the "
        "key from a workspace secret (--env WANDB_API_KEY=... is written in plain text into the job's definition)",
        f'submit.py: warning: tensorboard.output_path "" of --ds-config {config} is not kept by the job (AzureML keeps '
        './outputs and the checkpoints); set it to a path under outputs/, e.g. "outputs/tensorboard"',
        f'submit.py: warning: csv_monitor.output_path "/tmp/csv" of --ds-config {config} is not kept by the job '
        '(AzureML keeps ./outputs and the checkpoints); set it to a path under outputs/, e.g. "outputs/csv_monitor"',
        f'submit.py: warning: flops_profiler.output_file "~/flops.txt" of --ds-config {config} is not kept by the job '
        '(AzureML keeps ./outputs and the checkpoints); set it to a path under outputs/, e.g. "outputs/flops_profiler"',
    ], lines
    kept = {"csv_monitor": {"enabled": True, "output_path": "./outputs/csv"},
            "tensorboard": {"enabled": True, "output_path": "outputs"},
            "flops_profiler": {"enabled": True, "output_file": "outputs/flops.txt"}, "wandb": {"enabled": True}}
    (tmp_path / "kept.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, **kept}))
    assert dry_run("--ds-config", str(tmp_path / "kept.json"), "--env", "WANDB_MODE=offline") == 0
    assert capsys.readouterr().err == ""
    # offline is what the mode says, not that it is set; comet's own offline mode counts
    assert dry_run("--ds-config", str(tmp_path / "kept.json"), "--env", "WANDB_MODE=online") == 0
    assert "the job gets no WANDB_API_KEY" in capsys.readouterr().err
    (tmp_path / "comet.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 4,
                                                     "comet": {"enabled": True, "mode": "offline"}}))
    assert dry_run("--ds-config", str(tmp_path / "comet.json")) == 0
    assert capsys.readouterr().err == ""
    # the trainer's own TensorBoard folder alike (it passed silently); under outputs/ it is kept
    assert dry_run("--", "--tensorboard-dir", "tb") == 0
    assert capsys.readouterr().err.splitlines() == [
        "submit.py: warning: --tensorboard-dir tb after -- is not kept by the job (AzureML keeps ./outputs and the "
        'checkpoints); set it to a path under outputs/, e.g. "outputs/tensorboard"']
    assert dry_run("--", "--tensorboard-dir", "outputs/tb") == 0
    assert capsys.readouterr().err == ""


def test_requirements_are_read_with_pips_names(tmp_path, monkeypatch):
    """comet-ml, Comet_ML and comet.ml are pip's one package comet_ml; a package whose name only starts so is not."""
    module = load_submit_module()
    monkeypatch.setattr(module, "ROOT", tmp_path)
    for line, found in (("comet-ml==3.0", True), ("Comet_ML", True), ("comet.ml>=3 ; python_version>'3'", True),
                        ("comet-ml-extra==1", False), ("# comet_ml", False)):
        (tmp_path / "requirements.txt").write_text(f"torch==2.13.0\n{line}\n")
        assert module.in_requirements("comet_ml") == found, line
