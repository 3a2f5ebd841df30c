"""examples_deepspeed/: each launch script trains a tiny BERT through the deepspeed launcher (2 CPU
ranks over gloo when there are fewer than 2 GPUs): bigbird 2 steps, linformer stopped by SIGTERM and
resumed, ring as the reference of a two-node launch on one machine (bert_multinode.sh run twice,
node ranks 0 and 1, master 127.0.0.1, one rank per node)."""
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from megatron import checkpoint, checkpoint_weights, run_log
from megatron.parallel.spawn import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "examples_deepspeed"
PYTHON = sys.executable
# PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH come after PROCS; LAYERS HIDDEN HEADS after the variant's argument
LAYOUT = ["1", "2", "128", "4", "4"]
SHAPE = ["2", "64", "4"]
ACCELERATOR_WARNING = "Setting accelerator to CPU"
# the modernbert preset at the tiny SHAPE: layer 0 global (ring), layer 1 local (window 32)
MODERN = ["--model-preset", "modernbert-base", "--ffn-hidden-size", "96", "--local-attention-window", "32"]  # DeepSpeed's "... we were unable to detect it"


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


def run_script(script: str, run_dir: Path, *arguments, iterations: int = 2) -> None:
    """Two ranks on this machine, 2 steps; checks the run finished and saved its checkpoint."""
    result = subprocess.run([str(SCRIPTS / script), "2", *arguments], env=launch_env(run_dir), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"iteration {iterations}/{iterations}" in result.stdout
    assert ACCELERATOR_WARNING not in result.stdout + result.stderr  # nor from DeepSpeed's launcher processes
    assert (run_dir / "checkpoints" / f"iter_{iterations:07d}").is_dir()


def check_variant_config(run_dir: Path, variant: str, option: str, value: int, pp: int, sp: int) -> None:
    """The JSON a variant script wrote for its run."""
    written = json.loads((run_dir / "ds_config.json").read_text())
    assert (written["sequence_parallel"]["size"], written["sequence_parallel"]["attention"]) == (sp, variant)
    assert written["sequence_parallel"][variant][option] == value  # the positional LINFORMER_K / BLOCK_SIZE
    assert ("pipeline" in written) == (pp > 1)  # the pipeline template, taken for PP > 1
    assert written["sequence_parallel"].get("pack_samples", False) == (variant != "linformer")  # packed by default


# every script trains for real: bert_distributed.sh (ring) in test_two_node_launch_on_one_machine as the
# single-node reference, bert_distributed_linformer.sh (SP=2) in the SIGTERM test below
def test_bigbird_script_trains_two_steps(tmp_path, data_dir):
    """bigbird needs >= 7 blocks per sequence: 128 / 16 = 8; it runs as 2 pipeline stages (the PP > 1
    branch of the script)."""
    run_script("bert_distributed_bigbird.sh", tmp_path, "2", "1", *LAYOUT[2:], "16", *SHAPE, *train_flags(data_dir))
    check_variant_config(tmp_path, "bigbird", "block_size", 16, pp=2, sp=1)
    assert len(losses(tmp_path)) == 2


@pytest.mark.parametrize("fails", ["report_once", "parser"])
def test_a_start_up_error_line_outlives_the_launcher_ending_the_ranks(tmp_path, fails):
    """The deepspeed launcher ends every rank once one exits non-zero. A start-up error (before the
    process group: a one-line error, or the flag parser's) is printed by rank 0 alone: rank 1,
    failing alike but sooner, must not exit first and have the launcher end rank 0 before it prints
    (rank 0 is made 3 s slower here; a rank ends by os._exit, so nothing else delays it)."""
    script = tmp_path / "fails.py"
    failure = {"report_once": "report_once('fails.py: error: the same mistake on every rank; fix it'); exit_rank(2)",
               "parser": "build_parser().parse_args(['--no-such-flag'])"}[fails]
    script.write_text("import os, sys, time\n"
                      f"sys.path.insert(0, {str(ROOT)!r})\n"
                      "from megatron.parallel.peers import report_once\n"
                      "from megatron.training import build_parser, exit_rank\n"
                      "time.sleep(3 if os.environ['RANK'] == '0' else 0)\n"
                      f"{failure}\n")
    env = launch_env(tmp_path)
    result = subprocess.run([str(Path(PYTHON).parent / "deepspeed"), "--num_gpus", "2", "--master_port",
                             env["MASTER_PORT"], str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    said = {"report_once": "fails.py: error: the same mistake on every rank; fix it",
            "parser": "error: unrecognized arguments: --no-such-flag"}[fails]
    assert result.stderr.count(said) == 1, result.stderr


def test_bad_positional_argument_is_one_line(tmp_path):
    result = subprocess.run([str(SCRIPTS / "bert_distributed.sh"), "2", "1", "two", *LAYOUT[2:], *SHAPE],
                            env=launch_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["bert_distributed.sh: error: SP = 'two' is not a positive integer; pass "
                                          "PROCS PP SP SEQ_LEN MICRO_BATCH GLOBAL_BATCH LAYERS HIDDEN HEADS"]



@pytest.mark.parametrize("env, message", [
    ({"MASTER_PORT": "0"}, "MASTER_PORT = '0' is below 1; set MASTER_PORT to a free TCP port"),
    ({"NUM_NODES": "x"}, "NUM_NODES = 'x' is not a non-negative integer; set NUM_NODES"),
    ({"NUM_NODES": "2"}, "NUM_NODES 2 is set without HOSTFILE; launch several machines with bert_multinode.sh"),
    ({"NODE_RANK": "1"}, "NODE_RANK 1 is set without HOSTFILE; launch several machines with bert_multinode.sh"),
    ({"STOP_TIMEOUT": "5s"}, "STOP_TIMEOUT = '5s' is not a non-negative integer; set STOP_TIMEOUT to the seconds")])
def test_launch_environment_mistakes_name_the_variable(tmp_path, env, message):
    """the messages said PORT / NODES (the script's own names); NUM_NODES or NODE_RANK without a
    hostfile sized the JSON for machines the launcher would never start (a lone run per machine);
    a STOP_TIMEOUT that is no number of seconds failed only after a SIGTERM, as `unbound variable`."""
    result = subprocess.run([str(SCRIPTS / "bert_distributed.sh"), "2", *LAYOUT, *SHAPE], capture_output=True,
                            text=True, env={**launch_env(tmp_path), "DRY_RUN": "1", **env}, timeout=60)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"bert_distributed.sh: error: {message}")


@pytest.mark.parametrize("user_setting,expected", [(None, "cpu"), ("cpu", "cpu"), ("cuda", "cuda")])
def test_launcher_names_the_cpu_accelerator_unless_the_user_did(user_setting, expected, tmp_path):
    """run_launcher (every launch script's) starts DeepSpeed's launcher with DS_ACCELERATOR=cpu when no
    GPU is visible, so that its processes do not log "Setting accelerator to CPU. If you have GPU or
    other accelerator, we were unable to detect it." (the real launches above check the output); a
    DS_ACCELERATOR the user set is kept (here the python beside the launcher, which checks it, finds the device)."""
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    env.update(CUDA_VISIBLE_DEVICES="", **({"DS_ACCELERATOR": user_setting} if user_setting else {}))
    (tmp_path / "python").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "python").chmod(0o755)
    launcher = 'echo "${DS_ACCELERATOR-unset}"'
    result = subprocess.run(["bash", "-c", f'source "$1"; run_launcher bash -c {shlex.quote(launcher)}', "probe",
                             str(SCRIPTS / "launcher_group.sh")], env=env, capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{expected}\n", "")


def test_launcher_refuses_a_ds_accelerator_this_machine_lacks():
    """DS_ACCELERATOR=cuda without a GPU (a cluster profile on a CPU machine) stopped DeepSpeed's runner with
    "RuntimeError: Unable to proceed, no GPU resources available" and its traceback: one line, status 2."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cuda"}
    launcher = str(Path(sys.executable).parent / "deepspeed")
    result = subprocess.run(["bash", "-c", f'source "$1"; run_launcher {shlex.quote(launcher)} --help', "probe",
                             str(SCRIPTS / "launcher_group.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("probe: error: DS_ACCELERATOR=cuda names a device this machine lacks: ")
    assert len(result.stderr.splitlines()) == 1


STAND_IN_RANK = """import os, signal, sys, time
def stop(signum, frame):
    with open({record!r}, "w") as record:
        record.write(signal.Signals(signum).name)
    sys.exit(128 + signum)
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, stop)
with open({ready!r}, "w") as ready:
    ready.write(str(os.getpid()))
time.sleep(60)
"""
STAND_IN_LAUNCH = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, sys.argv[1]]))"


@contextlib.contextmanager
def stand_in_rank_running(script: subprocess.Popen, ready: Path, timeout: float = 60):
    """Once the stand-in rank of `script` wrote its pid into `ready` (the script still running); kills that rank
    afterwards if the script left it behind."""
    try:
        deadline = time.monotonic() + timeout
        while not ready.exists() or not ready.read_text():
            assert script.poll() is None and time.monotonic() < deadline, script.communicate()
            time.sleep(0.05)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int(ready.read_text()), signal.SIGKILL)  # a rank the script left behind


def test_a_closed_terminal_stops_the_ranks_as_sigterm_does(tmp_path):
    """SIGHUP to a launch script (its terminal closed, an SSH session dropped) ended the script alone,
    leaving the ranks training, to die at their next line on the dead terminal: run_launcher passes it
    to the ranks (which stop as on SIGTERM) and returns 129 once they have ended. A stand-in launcher
    whose command line names DeepSpeed's launch.py, and its rank: a second."""
    rank, ready, record = tmp_path / "rank.py", tmp_path / "ready", tmp_path / "record"
    rank.write_text(STAND_IN_RANK.format(record=str(record), ready=str(ready)))
    script = subprocess.Popen(["bash", "-c", 'source "$1"; shift; run_launcher "$@"', "probe",
                               str(SCRIPTS / "launcher_group.sh"), PYTHON, "-c", STAND_IN_LAUNCH, str(rank),
                               "deepspeed.launcher.launch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    with stand_in_rank_running(script, ready):
        script.send_signal(signal.SIGHUP)
        output = script.communicate(timeout=60)
    assert (script.returncode, output, record.read_text()) == (128 + signal.SIGHUP, ("", ""), "SIGHUP")


def test_stop_timeout_counts_from_the_signal_while_the_ranks_wait_on_each_other(tmp_path):
    """A rank that does not stop on SIGTERM (it waits in a collective for a node still training): the script
    waited for its launcher until --distributed-timeout-minutes ended the rank, minutes past STOP_TIMEOUT. It
    kills the group STOP_TIMEOUT s after the signal, with its line."""
    rank, ready, record = tmp_path / "rank.py", tmp_path / "ready", tmp_path / "record"
    rank.write_text(STAND_IN_RANK.format(record=str(record), ready=str(ready))
                    .replace("    sys.exit(128 + signum)\n", "").replace("time.sleep(60)", "time.sleep(600)"))
    script = subprocess.Popen(["bash", "-c", 'source "$1"; shift; run_launcher "$@"', "probe",
                               str(SCRIPTS / "launcher_group.sh"), PYTHON, "-c", STAND_IN_LAUNCH, str(rank),
                               "deepspeed.launcher.launch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, "STOP_TIMEOUT": "2"})
    with stand_in_rank_running(script, ready):
        script.send_signal(signal.SIGTERM)
        try:
            output = script.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(script.pid, signal.SIGKILL)
    assert (script.returncode, output, record.read_text()) == (128 + signal.SIGTERM, (
        "", "probe: error: ranks still running 2 s after the signal: killed; the last checkpoint in --save is the "
            "one to resume from\n"), "SIGTERM")


def dry_run(script: str, run_dir: Path, *arguments, **env) -> tuple:
    """(the JSON it would write, the launcher command line); checks that it wrote nothing."""
    result = subprocess.run([str(SCRIPTS / script), *arguments], env=launch_env(run_dir, **env), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert not run_dir.exists() or not any(run_dir.iterdir())  # a dry run writes nothing
    lines = result.stdout.splitlines()  # DeepSpeed may log a line before the JSON
    start, end = lines.index("{"), len(lines) - 1 - lines[::-1].index("}")
    # where the printed command reads the JSON from (pasted without it, the command found no file)
    assert lines[start - 1].startswith(f"# RUN_DIR/ds_config.json ({run_dir}/ds_config.json) would hold this JSON")
    return json.loads("\n".join(lines[start:end + 1])), lines[-1]


@pytest.mark.parametrize("script,flags,message", [
    ("bert_distributed.sh", ["--attention", "ulysses"], "--attention after the positional arguments would override "
                                                        "the script's ring attention; use bert_distributed.sh (ring)"),
    ("bert_distributed.sh", ["--seq", "256"], "--seq (for --seq-length) after the positional arguments would override "
                                              "SEQ_LEN = 128"),
    ("bert_distributed.sh", ["--deepspeed_config=my.json"], "--deepspeed_config after the positional arguments would "
                                                            "replace the JSON the script writes to RUN_DIR/ds_config"),
    ("bert_distributed_linformer.sh", ["--linformer-k", "16"], "--linformer-k after the positional arguments would "
                                                               "override LINFORMER_K = 32"),
    ("bert_distributed.sh", ["--dry-run"], "--dry-run after the positional arguments would go to pretrain_bert.py and "
                                           "launch; set DRY_RUN=1"),
    # the deepspeed launcher's flags: pretrain_bert.py refused them on every node after the launch
    ("bert_distributed.sh", ["--include", "localhost"], "--include is a flag of the deepspeed launcher, which "
                                                        "bert_distributed.sh calls for you (after the positional "
                                                        "arguments it would go to pretrain_bert.py); list only the "
                                                        "hosts to use in HOSTFILE"),
    ("bert_distributed.sh", ["--master_port=29501"], "--master_port is a flag of the deepspeed launcher, which "
                                                     "bert_distributed.sh calls for you (after the positional "
                                                     "arguments it would go to pretrain_bert.py); set MASTER_PORT")])
def test_flags_the_positionals_fix_are_refused(tmp_path, script, flags, message):
    """They trained silently with settings other than the JSON in RUN_DIR that the script had validated
    (a late --dry-run launched for real, then failed in the trainer)."""
    variant = ["32"] if "linformer" in script else []
    result = subprocess.run([str(SCRIPTS / script), "2", *LAYOUT, *variant, *SHAPE, "--train-iters", "2", *flags],
                            env=launch_env(tmp_path, DRY_RUN="1"), capture_output=True, text=True, timeout=60)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{script}: error: {message}"), lines


@pytest.mark.parametrize("flags,message,dry", [
    (["--bogus-flag", "3"], "unrecognized arguments: --bogus-flag 3", "1"),
    (["--train-iters", "abc"], "argument --train-iters: invalid int value", "1"),
    (["--save", ""], "--save is given an empty value ('')", "1"),  # was blamed on the script's --save-interval
    (["--lr", "-1"], "--lr -1.0 is negative", "1"),  # the ranks' flag checks: a dry run passed it
    # a real launch, with a launcher flag the script's RUNNER table does not name
    (["--ssh_port", "2222"], "unrecognized arguments: --ssh_port 2222", "0")])
def test_the_trainers_flags_are_parsed_before_the_launch(tmp_path, flags, message, dry):
    """An unknown or mistyped flag passed the dry run (docs/launching.md's check before a multi-node
    launch) and failed only after the launch, on every node: the script runs the trainer's parser
    first, in a dry run and before a real launch (DRY_RUN=0: no launcher, no JSON written)."""
    result = subprocess.run([str(SCRIPTS / "bert_distributed.sh"), "2", *LAYOUT, *SHAPE, *flags],
                            env=launch_env(tmp_path, DRY_RUN=dry), capture_output=True, text=True, timeout=120)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"pretrain_bert.py: error: {message}")
    assert "{" not in result.stdout  # refused before the JSON is printed
    assert "launch.py" not in result.stdout + result.stderr  # and before the launcher started
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_flags_beside_the_fixed_ones_pass(tmp_path):
    """The trainer's own flags that share a prefix with a fixed one, and the defaults flags win over (a
    longer position table: what starting from weights with more positions than SEQ_LEN needs)."""
    config, command = dry_run("bert_distributed.sh", tmp_path, "2", *LAYOUT, *SHAPE, "--attention-dropout", "0.1",
                              "--deepspeed", "--model-preset", "modernbert-base", "--train-iters", "2",
                              "--max-position-embeddings", "256", DRY_RUN="1")
    assert command.endswith("--attention-dropout 0.1 --deepspeed --model-preset modernbert-base --train-iters 2 "
                            "--max-position-embeddings 256 ")


@pytest.mark.parametrize("script", ["bert_distributed.sh", "bert_multinode.sh"])
def test_sh_instead_of_bash_is_one_line(tmp_path, script):
    """`sh script` failed with `source: not found` or `set: Illegal option -o pipefail`."""
    if subprocess.run(["sh", "-c", "echo ${BASH_VERSION:-}"], capture_output=True, text=True).stdout.strip():
        pytest.skip("sh is bash here")
    result = subprocess.run(["sh", str(SCRIPTS / script), "2", *LAYOUT, *SHAPE], env=launch_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"{script}: error: this is a bash script, run by another shell; run it with bash: bash {SCRIPTS / script} ..."]


def test_multinode_dry_run_prints_the_hostfile_launch(tmp_path):
    config, command = dry_run("bert_multinode.sh", tmp_path, "--dry-run", str(ROOT / "hostfile.example"), "2",
                              "examples_deepspeed/bert_distributed.sh", "8", "1", "8", "16384", "1", "4", "24", "1024",
                              "16")  # SCRIPT as a path from the repository root: its name is taken
    assert "--num_gpus 8 --master_port" in command
    assert f"--hostfile {ROOT / 'hostfile.example'} --num_nodes 2 " in command and "--no_ssh" not in command
    # 16 ranks: data-parallel 2, so grad-acc = 4 / (1 x 2) = 2, derived at start-up from the null
    assert config["gradient_accumulation_steps"] is None


MULTINODE_USAGE = "usage: bert_multinode.sh [--dry-run] HOSTFILE NUM_NODES SCRIPT ARGS ..."


@pytest.mark.parametrize("argv, status, stderr", [
    (["hostfile", "2", "--dry-run", "bert_distributed.sh", "2"], 2, f"error: --dry-run goes first; {MULTINODE_USAGE}"),
    (["-v", "2", "bert_distributed.sh", "2"], 2, f"error: unknown option -v; {MULTINODE_USAGE}"),
    (["hostfile", "2", "--help", "bert_distributed.sh"], 0, None), (["-h"], 0, None), (["--dry-run", "-h"], 0, None)])
def test_multinode_options_go_before_its_positional_arguments(tmp_path, argv, status, stderr):
    """A dash word where HOSTFILE, NUM_NODES or SCRIPT goes ran basename or realpath on it: their own errors or help
    (`basename: unrecognized option '--dry-run'`, `realpath: invalid option`), exit 1, then a line on the wrong
    argument; -h and --help were a usage line with exit 2. Now one line, exit 2, and -h / --help the usage, exit 0."""
    result = subprocess.run([str(SCRIPTS / "bert_multinode.sh"), *argv], env=launch_env(tmp_path), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == status, result.stderr
    if stderr:
        assert (result.stdout, result.stderr) == ("", f"bert_multinode.sh: {stderr}\n")
    else:
        assert result.stderr == "" and result.stdout.startswith(f"{MULTINODE_USAGE}\nSeveral machines from a hostfile")


@pytest.mark.parametrize("script, arguments, line", [
    ("bert_distributed.sh", ["3", "1", "2"], "PP 1 x SP 2 does not divide the world size 3 (PROCS 3); set PROCS to a "
                                             "multiple of 2, or change SP to 1 or 3 to run on 3 ranks"),
    ("bert_multinode.sh", ["3", "1", "4"], "PP 1 x SP 4 does not divide the world size 6 (NUM_NODES 2 x PROCS 3); "
                                           "set NUM_NODES x PROCS to a multiple of 4, or change SP to 1, 2, 3 or 6 "
                                           "to run on 6 ranks")])
def test_a_layout_that_does_not_divide_the_world_names_the_scripts_arguments(tmp_path, script, arguments, line):
    """The fix was the trainer's, "launch 4 processes ... with deepspeed --num_gpus 4, or pass
    --sequence-parallel-size 2": the scripts run the launcher themselves and refuse that flag."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=3\nworker-2 slots=3\n")
    before = ["--dry-run", str(hostfile), "2", "bert_distributed.sh"] if script == "bert_multinode.sh" else []
    result = subprocess.run([str(SCRIPTS / script), *before, *arguments, *LAYOUT[2:], *SHAPE],
                            env=launch_env(tmp_path / "run", DRY_RUN="1"), capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.splitlines() == [f"bert_distributed.sh: error: {line}"]


def test_a_hostfile_without_num_nodes_launches_on_every_host_it_lists(tmp_path):
    """HOSTFILE given to a launch script without NUM_NODES launched on its first host alone (`--hostfile HOSTFILE
    --num_nodes 1`); `deepspeed --hostfile` alone uses every host, and so does the script: SP 4 over 2 hosts of 2
    ranks fits the world of 4 (on one host it would not)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=2\nworker-2 slots=2\n")
    config, command = dry_run("bert_distributed.sh", tmp_path / "run", "2", "1", "4", *LAYOUT[2:], *SHAPE, DRY_RUN="1",
                              HOSTFILE=str(hostfile))
    assert f"--hostfile {hostfile} --num_nodes 2 " in command and config["sequence_parallel"]["size"] == 4


def test_numbers_are_decimal_and_a_dry_run_writes_nothing(tmp_path):
    """`08` is 8 ranks, not a bash octal error that skipped the config and launched a stale one;
    `010` is 10 ranks, validated at world size 10 (global batch 20 = micro 4 x data 5)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for procs, global_batch in (("08", "16"), ("010", "20")):
        config, command = dry_run("bert_distributed.sh", run_dir, procs, "1", "2", "128", "4", global_batch, *SHAPE,
                                  DRY_RUN="1")
        assert f"--num_gpus {int(procs)} --master_port" in command
        assert config["train_batch_size"] == int(global_batch)
    # 08 ranks with a batch that fits 10 only: the config step fails and nothing launches
    result = subprocess.run([str(SCRIPTS / "bert_distributed.sh"), "08", "1", "2", "128", "4", "20", *SHAPE],
                            env=launch_env(run_dir), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "data-parallel size 4" in result.stderr.splitlines()[-1], result.stderr
    assert "deepspeed" not in result.stdout and not any(run_dir.iterdir())


def test_two_node_launch_on_one_machine(tmp_path, data_dir):
    """Two launchers (node ranks 0 and 1) meet at 127.0.0.1; rank 0 on node-a, rank 1 on node-b
    split each sequence (SP=2, ring global layers, halo-exchanging local layers: the modernbert
    preset, shrunk). They must train, and give the losses of the same job launched on one node
    with 2 ranks (the single-node script run in this test)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    single, multi = tmp_path / "single", tmp_path / "multi"
    port = str(free_port())
    nodes = [subprocess.Popen([str(SCRIPTS / "bert_multinode.sh"), str(hostfile), "2", "bert_distributed.sh", "1",
                               *LAYOUT, *SHAPE, *train_flags(data_dir), *MODERN],
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
        assert ACCELERATOR_WARNING not in output
    assert "iteration 2/2" in outputs[0]
    # node 1's JSON beside node 0's in the RUN_DIR they share, compared at start-up: one file, the last written,
    # was read by every rank (another node's micro batch taken silently)
    written = [json.loads((multi / name).read_text()) for name in ("ds_config.json", "ds_config.node1.json")]
    assert written[0] == written[1]

    run_script("bert_distributed.sh", single, *LAYOUT, *SHAPE, *train_flags(data_dir), *MODERN)
    # the same job in the same layout; not bitwise: one fresh-clone run saw the second step's loss 1.1e-7
    # (relative) apart, rounding of the ranks' CPU kernels that the first step did not show
    assert len(losses(multi)) == 2 and losses(multi) == pytest.approx(losses(single), rel=1e-6, abs=0)
    model = json.loads((single / "config.json").read_text())["model"]
    assert (model["position_embedding_type"], model["local_attention_window"], model["mlp_type"]) == ("rope", 32, "geglu")


def train_records(run_dir: Path) -> dict:
    """iteration -> (loss, lr, consumed samples); a repeated iteration must repeat the same values."""
    records = {}
    for record in run_log.read_metrics(run_dir / "metrics.jsonl"):
        if record["kind"] == "train":
            fields = (record["loss"], record["lr"], record["consumed_samples"])
            assert records.setdefault(record["iteration"], fields) == fields, record
    return records


def processes_using(path: Path) -> list:
    rows = subprocess.run(["ps", "-e", "-o", "pid=,stat=,args="], capture_output=True, text=True).stdout.splitlines()
    return [row for row in rows if str(path) in row and " Z" not in f" {row.split()[1]}"]


def test_sigterm_stops_every_rank_and_the_saved_checkpoint_resumes_exactly(tmp_path, data_dir):
    """SIGTERM to the launch script (a scheduler's preemption): every rank stops after the same
    step, a final checkpoint is saved, no process of the run is left, exit 143 with one line; the
    run resumed from that checkpoint equals an uninterrupted one (losses, lr, weights), which saves
    at its end only. The script is bert_distributed_linformer.sh (SP=2, LINFORMER_K 32): its JSON is
    checked on the uninterrupted run."""
    iterations = 10  # room for the steps that run while the signal travels (a loaded machine)
    flags = [*train_flags(data_dir), "--train-iters", str(iterations), "--save-interval", "1000",
             "--eval-interval", "1000", "--hidden-dropout", "0.1"]  # dropout: the RNG state must resume too
    script, positionals = "bert_distributed_linformer.sh", ["1", "2", *LAYOUT[2:], "32", *SHAPE]
    killed = tmp_path / "killed"
    process = subprocess.Popen([str(SCRIPTS / script), "2", *positionals, *flags], env=launch_env(killed),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (killed / "metrics.jsonl").is_file() or max(train_records(killed), default=0) < 2:
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # the script only, as `kill <pid>` or a scheduler does
        stderr = process.communicate(timeout=120)[1]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert not processes_using(killed), processes_using(killed)  # no orphan rank goes on training
    stopped = [line for line in stderr.splitlines() if "stopped by SIGTERM" in line]
    assert len(stopped) == 1 and "Traceback" not in stderr, stderr[-3000:]
    last = max(train_records(killed))
    assert 2 <= last < iterations and checkpoint.latest_tag(str(killed / "checkpoints")) == checkpoint.tag_for(last)
    assert f"pretrain_bert.py: stopped by SIGTERM after iteration {last}; checkpoint " in stopped[0]

    run_script(script, killed, *positionals, *flags, "--load", str(killed / "checkpoints"), iterations=iterations)
    straight = tmp_path / "straight"
    run_script(script, straight, *positionals, *flags, iterations=iterations)
    check_variant_config(straight, "linformer", "k", 32, pp=1, sp=2)
    assert train_records(killed) == train_records(straight) and len(train_records(straight)) == iterations
    got, want = (checkpoint_weights.bert_state_from_checkpoint(str(run / "checkpoints")) for run in (killed, straight))
    assert set(got) == set(want) and all(torch.equal(got[name], want[name]) for name in want)


def test_a_launcher_ended_by_a_signal_names_the_last_checkpoint(tmp_path):
    """A rank killed by SIGKILL takes the others with it (launch.py kills them before they can say
    what they saved), and a killed launch.py leaves ranks that save on their own: after a launcher
    status 128 + N the script names the newest checkpoint of --save (the last --save among the
    flags), once every process of its group has ended, and keeps the status."""
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "latest").write_text("iter_0000040\n")
    launcher = tmp_path / "launcher"  # a rank left saving in the group (2 s), then the launcher killed
    launcher.write_text(f"#!/bin/bash\n(sleep 2; echo iter_0000042 > {save}/latest) &\nkill -KILL $$\n")
    launcher.chmod(0o755)
    script = (f"source {SCRIPTS / 'launcher_group.sh'}; save_dir /elsewhere --save-interval 5 --save {save}; "
              f"run_launcher {launcher}")
    result = subprocess.run(["bash", "-c", script], env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGKILL
    assert result.stderr.splitlines()[-1] == (
        f"bash: error: a rank or its launcher ended by SIGKILL (status 137) short of --train-iters; last checkpoint "
        f"{save}/iter_0000042: rerun the same command to resume it (--load {save})"), result.stderr


def test_the_scripts_load_their_save_folder_so_a_rerun_resumes(tmp_path):
    """A requeue runs the same command: the scripts pass --load of the --save folder (nothing saved
    yet: from scratch), which a --save among the flags moves too."""
    _, command = dry_run("bert_distributed.sh", tmp_path, "2", *LAYOUT, *SHAPE, DRY_RUN="1")
    assert f"--save {tmp_path / 'checkpoints'} --load {tmp_path / 'checkpoints'} " in command
    _, command = dry_run("bert_distributed.sh", tmp_path, "2", *LAYOUT, *SHAPE, "--save=ck", DRY_RUN="1")
    assert "--save ck --load ck " in command


STUB_VENV = """#!/bin/bash
# python3.11 -m venv [--clear] DIR, as a stub: a venv of stubs (python prints 0 GPUs, pip and the launcher do nothing)
echo "python3.11 $*" >> "$CALLS"
dir="${@: -1}"
[ "$3" != --clear ] || rm -rf "$dir"
mkdir -p "$dir/bin"
printf '#!/bin/sh\\necho "$0 $*" >> "$CALLS"; case "$*" in *deepspeed_command*) exit ${LAUNCH_STATUS:-0};; esac; echo 0\\n' > "$dir/bin/python"
chmod +x "$dir/bin/python"
if [ -n "${INTERRUPT:-}" ]; then  # Ctrl-C while ensurepip runs: the group gets SIGINT, pip is never made
    echo "Traceback (most recent call last): ... KeyboardInterrupt" >&2
    kill -INT 0
    sleep 5
fi
printf '#!/bin/sh\\necho "$0 $*" >> "$CALLS"\\n' > "$dir/bin/pip"
chmod +x "$dir/bin/pip"
"""


def _ctrl_c_as_in_a_terminal():
    """SIGINT at its default, as a terminal's command has it: a test run started in the background (`cmd &`
    in a script) inherits it ignored, and bash cannot trap a signal ignored at its start."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_main_job_recovers_from_an_install_interrupted_in_the_venv(tmp_path):
    """Ctrl-C while `python3.11 -m venv` ran ensurepip printed a 20-line KeyboardInterrupt traceback and left
    a .venv without pip, which every rerun took as made (`.venv/bin/pip: No such file or directory`, 127).
    Now: one line, and the rerun makes .venv again (here with a stub python3.11 and a venv of stubs)."""
    checkout, stubs = tmp_path / "checkout", tmp_path / "stubs"
    (checkout / "examples_deepspeed").mkdir(parents=True)
    for name in ("pretrain_default.sh", "launcher_group.sh"):
        (checkout / "examples_deepspeed" / name).write_text((SCRIPTS / name).read_text())
    stubs.mkdir()
    (stubs / "python3.11").write_text(STUB_VENV)
    (stubs / "python3.11").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "CALLS": str(calls), "CUDA_VISIBLE_DEVICES": ""}
    script = ["bash", "examples_deepspeed/pretrain_default.sh"]
    first = subprocess.run(script, cwd=checkout, env={**env, "INTERRUPT": "1"}, capture_output=True, text=True,
                           timeout=60, start_new_session=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    assert first.returncode == 130 and first.stderr.splitlines() == [
        "pretrain_default.sh: stopped while installing .venv; run the same command again to finish the install"], first
    assert (checkout / ".venv" / "bin" / "python").exists() and not (checkout / ".venv" / "bin" / "pip").exists()
    again = subprocess.run(script, cwd=checkout, env=env, capture_output=True, text=True, timeout=60,
                           start_new_session=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("pretrain_default.sh: .venv is incomplete (an interrupted install): making it again")
    assert "python3.11 -m venv --clear .venv" in calls.read_text().splitlines()
    assert (checkout / ".venv" / ".installed").exists() and (checkout / ".venv" / "bin" / "pip").exists()
    calls.write_text("")
    done = subprocess.run(script, cwd=checkout, env=env, capture_output=True, text=True, timeout=60,
                          start_new_session=True)
    assert done.returncode == 0 and "incomplete" not in done.stdout and "python3.11" not in calls.read_text()
    assert "pip install" in calls.read_text()  # the helpers are not built here
    (checkout / "megatron" / "data").mkdir(parents=True)
    (checkout / "megatron" / "data" / "helpers.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    calls.write_text("")
    assert subprocess.run(script, cwd=checkout, env=env, capture_output=True, timeout=60).returncode == 0
    assert "pip install" not in calls.read_text()  # a rerun installs nothing new: skipped (it took a minute)
    (checkout / "requirements.txt").write_text("numpy==2.4.6\n")
    assert subprocess.run(script, cwd=checkout, env=env, capture_output=True, timeout=60).returncode == 0
    assert "pip install" in calls.read_text()  # new pins: installed
    # a stop of the training (Ctrl-C: the launcher's 130): the last line says the script resumes itself; the
    # rank's own said `resume with --load runs/default/checkpoints`, and DeepSpeed's [ERROR] line came last
    stopped = subprocess.run(script, cwd=checkout, env={**env, "LAUNCH_STATUS": "130"}, capture_output=True,
                             text=True, timeout=60, start_new_session=True)
    assert stopped.returncode == 130 and stopped.stderr.splitlines()[-1] == (
        "pretrain_default.sh: stopped; run bash examples_deepspeed/pretrain_default.sh again to resume from "
        "runs/default/checkpoints (it loads it itself)"), stopped.stderr


LAUNCH_RECORDING_VENV = """#!/bin/sh
# .venv/bin/python of a checkout: the trainer's flag check runs in the real python, a launch is recorded with its folder
case "$*" in
    *check_trainer_flags*) exec {python} "$@" ;;
    *deepspeed_command*) echo "$PWD: $*" >> "$CALLS" ;;
    *fill_mask*) echo "$PWD: $*" >> "$CALLS" ;;
esac
"""


def main_job_checkout(tmp_path: Path, venv_python: str = LAUNCH_RECORDING_VENV) -> Path:
    """A checkout of pretrain_default.sh whose .venv runs venv_python (default: records the launch), installed."""
    checkout = tmp_path / "checkout"
    (checkout / "examples_deepspeed").mkdir(parents=True)
    for name in ("pretrain_default.sh", "launcher_group.sh"):
        (checkout / "examples_deepspeed" / name).write_text((SCRIPTS / name).read_text())
    (checkout / "megatron").symlink_to(ROOT / "megatron")  # the trainer's parser, which the check runs
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").write_text(venv_python.format(python=shlex.quote(PYTHON)))
    (checkout / ".venv" / "bin" / "pip").write_text("#!/bin/sh\n")
    for name in ("python", "pip"):
        (checkout / ".venv" / "bin" / name).chmod(0o755)
    return checkout


def test_the_main_job_reads_its_flags_in_the_callers_folder_and_checks_them_before_the_launch(tmp_path):
    """pretrain_default.sh cd'd into the repository: `--save myck` typed in another folder wrote into the
    repository (printed as `checkpoint: myck`), `--vocab-file d/vocab.txt` there 'did not exist'; it ignored
    MASTER_PORT, the port its second run's error told to change; and an extra flag the trainer refuses, or
    a --save a live run holds, failed only after 20-30 s of launch. Now the launch runs in the caller's folder
    with the script's own paths absolute, on MASTER_PORT, and those are refused before it."""
    checkout, user = main_job_checkout(tmp_path), tmp_path / "user"
    user.mkdir()
    calls = tmp_path / "calls.txt"
    script = ["bash", str(checkout / "examples_deepspeed" / "pretrain_default.sh")]
    port = str(free_port())  # checked free before the launch
    env = {**os.environ, "CALLS": str(calls), "CUDA_VISIBLE_DEVICES": "", "MASTER_PORT": port}
    run = subprocess.run([*script, "--save", "myck", "--log-dir", "mylog", "--vocab-file", "d/vocab.txt"], cwd=user,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    launch, fill_mask = calls.read_text().splitlines()
    assert launch.startswith(f"{user}: ") and fill_mask.startswith(f"{user}: ")
    assert f" --master_port {port} {checkout}/pretrain_bert.py " in launch
    assert f" --deepspeed_config {checkout}/ds_configs/ring_sp2.json " in launch
    assert launch.endswith(f" --log-dir {checkout}/runs/default --save myck --log-dir mylog --vocab-file d/vocab.txt")
    assert f"{checkout}/tools/fill_mask.py --load myck " in fill_mask
    busy = user / "busy"
    busy.mkdir()
    (busy / ".lock").write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid()}))
    calls.write_text("")
    for flags, line in ((["--bogus-flag", "3"], "pretrain_bert.py: error: unrecognized arguments: --bogus-flag 3; "),
                        (["--master_port", "29501"], "pretrain_default.sh: error: --master_port is a flag of the "
                                                     "deepspeed launcher"),
                        (["--save", "busy"], f"pretrain_bert.py: error: --save busy is in use by a live run: pid "
                                             f"{os.getpid()} on this host")):
        refused = subprocess.run([*script, *flags], cwd=user, env=env, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and refused.stderr.startswith(line) and refused.stderr.count("\n") == 1, \
            refused.stderr
    assert calls.read_text() == ""  # nothing launched


STAND_IN_LAUNCHER_VENV = """#!/bin/sh
# .venv/bin/python of a checkout: the trainer's flag check runs in the real python, the launch is the stand-in launcher
case "$*" in
    *check_trainer_flags*) exec {python} "$@" ;;
    *deepspeed_command*) exec {python} -c "$STAND_IN_LAUNCH" "$RANK" deepspeed.launcher.launch ;;
esac
"""


def test_the_main_job_started_with_sigint_ignored_ignores_it_and_stops_its_ranks_on_sigterm(tmp_path):
    """Started with `&` from a batch script (SIGINT ignored, as bash makes such jobs), pretrain_default.sh exited 130
    at a SIGINT and left its launcher and ranks training: its install trap's `trap - INT` made SIGINT fatal, which
    run_launcher's trap cannot catch then. Now it ignores SIGINT, as docs/resuming.md says, and SIGTERM stops the
    ranks (a stand-in launcher and rank)."""
    checkout = main_job_checkout(tmp_path, STAND_IN_LAUNCHER_VENV)
    rank, ready, record = tmp_path / "rank.py", tmp_path / "ready", tmp_path / "record"
    rank.write_text(STAND_IN_RANK.format(record=str(record), ready=str(ready)))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "STAND_IN_LAUNCH": STAND_IN_LAUNCH, "RANK": str(rank),
           "MASTER_PORT": str(free_port())}  # checked free before the launch
    script = subprocess.Popen(["bash", str(checkout / "examples_deepspeed" / "pretrain_default.sh")], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    with stand_in_rank_running(script, ready, timeout=120):
        script.send_signal(signal.SIGINT)
        time.sleep(1)
        assert script.poll() is None and not record.exists(), "SIGINT ended the script or its rank"  # ignored
        script.send_signal(signal.SIGTERM)
        _, stderr = script.communicate(timeout=60)
    assert (script.returncode, record.read_text()) == (128 + signal.SIGTERM, "SIGTERM"), stderr
    assert stderr.splitlines()[-1].startswith("pretrain_default.sh: stopped; run bash "), stderr


def test_a_launch_script_refuses_the_folders_a_live_run_holds_before_its_launch(tmp_path):
    """bert_distributed.sh started again into a RUN_DIR that a live run trains in met that run's rendezvous port
    (on the same MASTER_PORT) or its locks only after the launch; its pre-launch check names the folders."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    holder = json.dumps({"host": os.uname().nodename, "pid": os.getpid()})
    for lock in (run_dir / "checkpoints" / ".lock", run_dir / ".log.lock"):
        lock.write_text(holder)
    result = subprocess.run([str(SCRIPTS / "bert_distributed.sh"), "2", *LAYOUT, *SHAPE], env=launch_env(run_dir),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"pretrain_bert.py: error: --save {run_dir}/checkpoints is in use by a live run: pid {os.getpid()} on this "
        f"host ({os.uname().nodename}) holds {run_dir}/checkpoints/.lock; wait for that run to end or stop it, or "
        "choose another --save and --log-dir directory"], result.stderr
    assert sorted(path.name for path in run_dir.iterdir()) == [".log.lock", "checkpoints"]  # no ds_config.json


STUB_TRAINER_PYTHON = """#!/bin/sh
# PYTHON of a launch script: its checks recorded, the JSON written as {}, the launch as $LAUNCH says
case "$*" in
    *check_script_launch*) echo "$*" >> "$CALLS" ;;
    *deepspeed_command*)
        [ -z "$WROTE" ] || touch "$RUN_DIR/$WROTE"  # what a rank wrote there
        # Ctrl-C to the script as the launcher starts, run_launcher's traps in place or not yet. The launcher's
        # own wait forks nothing after the signal: a child forked as the group's SIGINT lands keeps running
        [ "$LAUNCH" != SIGINT ] || { trap 'kill $s; exit 130' INT; sleep 30 & s=$!; kill -INT "$PPID"; wait; }
        exit "$LAUNCH" ;;
    *tools/ds_config.py*) while [ $# -gt 1 ]; do [ "$1" != --output ] || echo {} > "$2"; shift; done ;;
esac
"""


@pytest.mark.parametrize("launch, wrote, existed, kept", [
    ("SIGINT", "", False, False), ("2", "", False, False), ("1", "", False, False),
    ("SIGINT", "metrics.jsonl", False, True), ("SIGINT", "", True, True)],
    ids=["ctrl_c", "refused", "failed", "a_rank_wrote", "existed_before"])
def test_a_run_dir_the_launch_never_used_is_removed_whatever_its_status(tmp_path, launch, wrote, existed, kept):
    """Ctrl-C (or SIGTERM, or a failure) before any rank wrote into the RUN_DIR the script made left it holding
    ds_config.json alone: only a start-up refusal (2) removed it. A RUN_DIR that existed, or that a rank wrote in,
    stays. The launch check is given the master node's port, this node's without a hostfile (stand-in python)."""
    bin_dir, run_dir, calls = tmp_path / "bin", tmp_path / "made" / "run", tmp_path / "calls"
    bin_dir.mkdir()
    for name, text in (("python", STUB_TRAINER_PYTHON), ("deepspeed", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    if existed:
        run_dir.mkdir(parents=True)
    env = launch_env(run_dir, PYTHON=str(bin_dir / "python"), CALLS=str(calls), LAUNCH=launch, WROTE=wrote)
    result = subprocess.run([str(SCRIPTS / "bert_distributed.sh"), "2", *LAYOUT, *SHAPE], env=env, capture_output=True,
                            text=True, timeout=20, preexec_fn=_ctrl_c_as_in_a_terminal)  # no rank left
    assert result.returncode == (130 if launch == "SIGINT" else int(launch)), result.stderr
    assert f" bert_distributed.sh 127.0.0.1:{env['MASTER_PORT']} 1 2 " in calls.read_text()
    assert run_dir.exists() is kept and (tmp_path / "made").exists() is kept  # the folders it made, all
    if kept:
        assert sorted(path.name for path in run_dir.iterdir()) == sorted(["ds_config.json", *filter(None, [wrote])])
