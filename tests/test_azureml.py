"""azureml/submit.py: the dry run writes a command job YAML that azure.ai.ml.load_job reads back
with the code folder, the pinned environment, the nodes, the distribution, the inputs and the NCCL
variables; a real submit without a workspace config stops with one line."""
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


@needs_sdk
def test_dry_run_yaml_reloads(tmp_path):
    job_file, data = tmp_path / "job.yml", tmp_path / "data"
    data.mkdir()
    result = submit("--dry-run", job_file, "--instance-count", 2, "--gpus-per-node", 4, "--data", data,
                    "--data-prefix", "wiki_text_sentence", "--env", "NCCL_DEBUG=INFO", "--", "--seq-length", 8192,
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    job = load_job(job_file)
    assert job.type == "command" and Path(job.code) == ROOT
    assert job.resources.instance_count == 2
    assert job.distribution.type == "pytorch" and job.distribution.process_count_per_instance == 1
    assert (job.inputs["data"].type, job.inputs["data"].path) == ("uri_folder", str(data))
    assert job.inputs["ds_config"].path == str(ROOT / "ds_configs" / "ring_sp2.json")
    assert job.environment_variables["NCCL_DEBUG"] == "INFO" and job.environment_variables["NCCL_SOCKET_IFNAME"]
    pins = job.environment.conda_file["dependencies"][-1]["pip"]
    assert "torch==2.13.0" in pins and "deepspeed==0.19.8" in pins and "python=3.11" in job.environment.conda_file[
        "dependencies"]
    assert "python -m deepspeed.launcher.launch" in job.command and "--node_rank=$NODE_RANK" in job.command
    assert "--data-path ${{inputs.data}}/wiki_text_sentence --vocab-file ${{inputs.data}}/vocab.txt" in job.command
    assert "--deepspeed_config ${{inputs.ds_config}}" in job.command and job.command.endswith("--seq-length 8192")


@needs_sdk
def test_submit_without_workspace_config_is_one_line(tmp_path):
    result = submit("--data", tmp_path, cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("submit.py: error:")]
    assert result.returncode == 2 and len(errors) == 1 and "no AzureML workspace config found" in errors[0]
    assert "Traceback" not in result.stderr


def test_missing_ds_config_is_one_line(tmp_path):
    result = submit("--dry-run", tmp_path / "job.yml", "--data", tmp_path, "--ds-config", tmp_path / "no.json",
                    cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("submit.py: error:")]
    assert result.returncode == 2 and len(errors) == 1 and "no.json" in errors[0], result.stderr
    assert not (tmp_path / "job.yml").exists()
