"""examples_deepspeed/: each launch script trains 2 steps of a tiny BERT through the deepspeed
launcher (2 CPU ranks over gloo when there are fewer than 2 GPUs), and a two-node launch on one
machine: bert_multinode.sh run twice, node ranks 0 and 1, master 127.0.0.1, one rank per node."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from megatron.data.default_dataset import prepare_default_dataset
from megatron.parallel.spawn import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "examples_deepspeed"
# PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH come after PROCS; LAYERS HIDDEN HEADS after the variant's argument
LAYOUT = ["1", "2", "128", "4", "4"]
SHAPE = ["2", "64", "4"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("default_data")
    prepare_default_dataset(directory)
    return str(directory)


def launch_env(run_dir: Path, **extra) -> dict:
    env = {**os.environ, "RUN_DIR": str(run_dir), "MASTER_PORT": str(free_port()), **extra}
    if torch.cuda.device_count() < 2:
        env["CUDA_VISIBLE_DEVICES"] = ""  # 2 CPU ranks over gloo
    return env


def train_flags(data_dir: str) -> list:
    return ["--train-iters", "2", "--log-interval", "1", "--eval-iters", "1", "--default-data-dir", data_dir]


def losses(run_dir: Path) -> list:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "train"]


def run_script(script: str, run_dir: Path, *arguments) -> None:
    """Two ranks on this machine, 2 steps; checks the run finished and saved its checkpoint."""
    result = subprocess.run([str(SCRIPTS / script), "2", *arguments], env=launch_env(run_dir), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "iteration 2/2" in result.stdout and (run_dir / "checkpoints" / "iter_0000002").is_dir()


# bert_distributed.sh (ring) runs in test_two_node_launch_on_one_machine as the single-node reference
# bigbird needs >= 7 blocks per sequence: 128 / 16 = 8; it runs as 2 pipeline stages (the PP > 1 branch)
@pytest.mark.parametrize("script,variant,option,value,pp,sp", [
    ("bert_distributed_linformer.sh", "linformer", "k", 32, 1, 2),
    ("bert_distributed_bigbird.sh", "bigbird", "block_size", 16, 2, 1)])
def test_variant_script_trains_two_steps(tmp_path, data_dir, script, variant, option, value, pp, sp):
    run_script(script, tmp_path, "1" if pp == 1 else "2", str(sp), *LAYOUT[2:], str(value), *SHAPE,
               *train_flags(data_dir))
    written = json.loads((tmp_path / "ds_config.json").read_text())
    assert (written["sequence_parallel"]["size"], written["sequence_parallel"]["attention"]) == (sp, variant)
    assert written["sequence_parallel"][variant][option] == value  # the positional LINFORMER_K / BLOCK_SIZE
    assert ("pipeline" in written) == (pp > 1)  # the pipeline template, taken for PP > 1
    assert len(losses(tmp_path)) == 2


def test_bad_positional_argument_is_one_line(tmp_path):
    result = subprocess.run([str(SCRIPTS / "bert_distributed.sh"), "2", "1", "two", *LAYOUT[2:], *SHAPE],
                            env=launch_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["bert_distributed.sh: error: SP = 'two' is not a positive integer; pass "
                                          "PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH LAYERS HIDDEN HEADS"]


def test_multinode_dry_run_prints_the_hostfile_launch(tmp_path):
    result = subprocess.run([str(SCRIPTS / "bert_multinode.sh"), "--dry-run", str(ROOT / "hostfile.example"), "2",
                             "bert_distributed.sh", "8", "1", "8", "16384", "1", "4", "24", "1024", "16"],
                            env=launch_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--num_gpus 8 --master_port" in result.stdout
    assert f"--hostfile {ROOT / 'hostfile.example'} --num_nodes 2 " in result.stdout and "--no_ssh" not in result.stdout
    # 16 ranks: data-parallel 2, so grad-acc = 4 / (1 x 2) = 2, derived at start-up from the null
    assert json.loads((tmp_path / "ds_config.json").read_text())["gradient_accumulation_steps"] is None


def test_two_node_launch_on_one_machine(tmp_path, data_dir):
    """Two launchers (node ranks 0 and 1) meet at 127.0.0.1; rank 0 on node-a, rank 1 on node-b
    split each sequence (SP=2, ring). They must train, and give the losses of the same job
    launched on one node with 2 ranks (the single-node script run in this test)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    single, multi = tmp_path / "single", tmp_path / "multi"
    port = str(free_port())
    nodes = [subprocess.Popen([str(SCRIPTS / "bert_multinode.sh"), str(hostfile), "2", "bert_distributed.sh", "1",
                               *LAYOUT, *SHAPE, *train_flags(data_dir)],
                              env=launch_env(multi, NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for rank, (node, output) in enumerate(zip(nodes, outputs)):
        assert node.returncode == 0, output[-3000:]
        assert f"nnodes=2, num_local_procs=1, node_rank={rank}" in output
        assert "{'node-a': [0], 'node-b': [1]}" in output  # global rank 1 lives on the second node
    assert "iteration 2/2" in outputs[0]

    run_script("bert_distributed.sh", single, *LAYOUT, *SHAPE, *train_flags(data_dir))
    assert len(losses(multi)) == 2 and losses(multi) == losses(single)
