r"""tools/check_hostfile.py accepts what DeepSpeed's hostfile parser accepts (`^(\S+)\s+slots=(\d+)`,
the rest of the line ignored) and checks each used machine's slots against the ranks per node the
launch starts, in its own flag names when run directly."""
import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def check(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "check_hostfile.py"), *map(str, argv)],
                          capture_output=True, text=True, timeout=60)


def load_tool():
    spec = importlib.util.spec_from_file_location("check_hostfile", ROOT / "tools" / "check_hostfile.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_what_follows_the_slots_is_ignored_as_deepspeed_does(tmp_path):
    """`slots=8#c` and `slots=8 gpus=0,1` were refused as "not '<host> slots=<gpus>'"."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# three machines\nworker-1 slots=8   # the rack's first\nworker-2 slots=4#second\n\n"
                        "worker-3 slots=2 gpus=0,1\n")
    result = check(hostfile, "--num-nodes", 2)
    assert result.returncode == 0 and result.stdout == f"{hostfile}: 3 hosts, 14 slots\n", result.stderr
    (tmp_path / "bad").write_text("worker-1 slots = 8\n")
    result = check(tmp_path / "bad")
    assert result.returncode == 2 and "line 1 'worker-1 slots = 8' is not '<host> slots=<gpus>'" in result.stderr


def test_slots_are_checked_against_the_ranks_per_node(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=8\nworker-2 slots=4\nworker-3 slots=2\n")
    assert check(hostfile, "--num-nodes", 2, "--ranks-per-node", 4).returncode == 0  # worker-3 is not used
    result = check(hostfile, "--num-nodes", 2, "--ranks-per-node", 8)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"check_hostfile.py: error: --ranks-per-node 8 but hostfile {hostfile} gives worker-2 slots=4; "
        "pass --ranks-per-node at most 4 or raise the slots of that machine"]
    result = check(hostfile, "--num-nodes", 4)  # said NUM_NODES, the launch script's name, when run directly
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"check_hostfile.py: error: --num-nodes 4 but hostfile {hostfile} lists 3 hosts; pass --num-nodes between 1 "
        "and 3 or add hosts to the hostfile"]
    # the multi-node launch script passes its PROCS, named as such, in a line named by the script the user ran, as
    # its other errors are (a dry run: nothing starts)
    script = subprocess.run([str(ROOT / "examples_deepspeed" / "bert_multinode.sh"), "--dry-run", str(hostfile), "2",
                             "bert_distributed.sh", "8", "1", "8", "16384", "1", "8", "24", "1024", "16"],
                            env={**os.environ, "RUN_DIR": str(tmp_path / "run")}, capture_output=True, text=True,
                            timeout=120)
    assert script.returncode == 2 and script.stderr.splitlines()[-1] == (
        f"bert_distributed.sh: error: PROCS 8 ranks per node but hostfile {hostfile} gives worker-2 slots=4; pass "
        "PROCS at most 4 or raise the slots of that machine"), script.stderr[-2000:]


def test_the_launch_scripts_read_the_nodes_a_launch_uses(tmp_path):
    """--print-num-nodes (the launch scripts' HOSTFILE without NUM_NODES): every host listed, as deepspeed's
    --hostfile alone takes them, else --num-nodes."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=8\nworker-2 slots=8\nworker-3 slots=8\n")
    assert check(hostfile, "--print-num-nodes").stdout == "3\n"
    assert check(hostfile, "--print-num-nodes", "--num-nodes", 2).stdout == "2\n"


def test_a_host_listed_twice_in_another_case_is_refused(tmp_path):
    """`worker-1` and `WORKER-1` passed as two hosts: host names are case-insensitive (DNS), so it is
    one machine given twice the ranks of one."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=2\nWORKER-1 slots=2\n")
    with pytest.raises(load_tool().ConfigError, match=f"^hostfile {hostfile} lists WORKER-1 twice \\(line 2; "
                                                     "worker-1 before\\); list each machine once$"):
        load_tool().read_hostfile(hostfile)
    hostfile.write_text("worker-1 slots=2\nworker-1 slots=2\n")
    with pytest.raises(load_tool().ConfigError, match=f"^hostfile {hostfile} lists worker-1 twice \\(line 2\\); "
                                                     "list each machine once$"):
        load_tool().read_hostfile(hostfile)


def test_ranks_per_node_below_one_is_refused(tmp_path):
    """--ranks-per-node 0 (or -3) passed every hostfile."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=8\n")
    result = check(hostfile, "--ranks-per-node", 0)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "check_hostfile.py: error: --ranks-per-node 0 must be >= 1; pass the ranks each machine starts"]


def test_a_host_key_not_yet_accepted_is_named_as_such(monkeypatch):
    """BatchMode ssh cannot accept a new host key; 'set up ssh keys' was the wrong advice for it."""
    tool = load_tool()
    refused = subprocess.CompletedProcess([], 255, "", "Host key verification failed.\n")
    monkeypatch.setattr(tool.subprocess, "run", lambda *args, **kwargs: refused)
    with pytest.raises(tool.ConfigError, match="run `ssh worker-1` once to accept its host key, or run"):
        tool.check_ssh("worker-1", "run on every machine with NODE_RANK")


def test_the_master_port_is_checked_on_the_first_host_in_the_ssh_call(monkeypatch):
    """A launch over ssh (bert_multinode.sh without NODE_RANK) did not check MASTER_PORT before it started: a port
    another run holds on the first host (rank 0's) was rank 0's line after every node's launch and imports. The
    ssh call that checks the host's passwordless ssh probes the port there too; here `ssh` runs the command on this
    machine. A host without this python or repository gives no answer, which leaves the port to rank 0."""
    import socket

    tool = load_tool()
    real_run = subprocess.run
    monkeypatch.setattr(tool.subprocess, "run",
                        lambda command, **kwargs: real_run(["sh", "-c", command[-1]], **kwargs))
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(tool.ConfigError) as error:
            tool.check_ssh("worker-1", "run on every machine with NODE_RANK", port)
        assert str(error.value).startswith(f"rank 0 cannot host the rendezvous at worker-1:{port}: the port is in use "
                                           f"on {socket.gethostname()} (another run?); ")
        tool.check_ssh("worker-1", "run on every machine with NODE_RANK")  # no port given: not probed
        monkeypatch.setattr(sys, "executable", "/nonexistent/python")
        tool.check_ssh("worker-1", "run on every machine with NODE_RANK", port)  # no answer: rank 0's check
    monkeypatch.undo()
    monkeypatch.setattr(tool.subprocess, "run",
                        lambda command, **kwargs: real_run(["sh", "-c", command[-1]], **kwargs))
    tool.check_ssh("worker-1", "run on every machine with NODE_RANK", port)  # free now


def test_a_hostfile_that_is_a_pipe_or_a_device_is_named_as_such(tmp_path):
    """`<(printf ...)` (a pipe, /dev/fd/63) and /dev/null were "does not exist" (bert_multinode.sh's realpath made
    the pipe /proc/N/fd/pipe:[...]); DeepSpeed's runner skips what os.path.isfile refuses and starts local ranks."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a pipe (as <(...) gives)"), ("/dev/null", "a character device")):
        result = check(path)
        assert result.returncode == 2 and result.stderr == (
            f"check_hostfile.py: error: hostfile {path} is {kind}, not a file, and DeepSpeed reads only a regular "
            "file; write the hostfile's lines to a file and pass that\n")
    launch = subprocess.run(["bash", "-c", f"{ROOT}/examples_deepspeed/bert_multinode.sh --dry-run "
                             "<(printf 'worker-1 slots=2\\n') 1 bert_distributed.sh 2 1 2 128 2 4 2 64 4"],
                            capture_output=True, text=True, timeout=120)
    assert launch.returncode == 2 and launch.stderr.startswith("bert_distributed.sh: error: hostfile /dev/fd/"), \
        launch.stderr
    assert " is a pipe (as <(...) gives), not a file" in launch.stderr


@pytest.mark.parametrize("lines,message", [
    ("localhost slots=2\n127.0.0.1 slots=2\n", "lists this machine twice: 127.0.0.1 (line 2) and localhost both name "
                                               "it; list each machine once"),
    ("worker-0 slots=2\nworker-1:2222 slots=8\n", "line 2 gives worker-1:2222, a host with a port, which DeepSpeed "
                                                  "takes as the host's name; list the host alone and set its port in "
                                                  "~/.ssh/config (Host worker-1 / Port 2222)"),
], ids=["loopback_twice", "host_port"])
def test_the_same_machine_twice_or_a_host_with_a_port_is_refused(tmp_path, lines, message):
    """Both were accepted: localhost and 127.0.0.1 start two launches on one machine's GPUs; DeepSpeed ssh's to a
    host literally named `worker-1:2222`. IPv6 addresses (colons) stay hosts."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(lines)
    result = check(hostfile)
    assert result.returncode == 2 and result.stderr.startswith(f"check_hostfile.py: error: hostfile {hostfile} "
                                                               f"{message}"), result.stderr
    hostfile.write_text("fe80::1 slots=8\n::1 slots=2\n")
    assert check(hostfile).stdout == f"{hostfile}: 2 hosts, 10 slots\n"


def test_this_machine_by_its_own_name_or_address_is_this_machine(tmp_path):
    """localhost with this machine's name (`hostname`), or that name with one of its interfaces' addresses, passed
    as two machines (localhost and 127.0.0.1 did not): two launches on one machine's GPUs."""
    import psutil

    name = socket.gethostname()
    addresses = [entry.address for entries in psutil.net_if_addrs().values() for entry in entries
                 if entry.family == socket.AF_INET and not entry.address.startswith("127.")]
    hostfile = tmp_path / "hostfile"
    for first, second in [("localhost", name), *((name, address) for address in addresses[:1])]:
        hostfile.write_text(f"{first} slots=2\n{second} slots=2\n")
        line = f"hostfile {hostfile} lists this machine twice: {second} (line 2) and {first} both name it"
        with pytest.raises(load_tool().ConfigError, match=f"^{re.escape(line)}; list each machine once$"):
            load_tool().read_hostfile(hostfile)


def test_this_machines_full_name_is_asked_only_for_a_dotted_host_and_not_waited_for(tmp_path, monkeypatch):
    """socket.getfqdn (a DNS lookup of this machine's name) blocked for the resolver's timeout, seconds on a machine
    whose resolver does not answer, for every hostfile of two hosts or more: a name without a dot (worker-2) is no
    fully qualified name and asks nothing; a dotted one waits for the answer FQDN_WAIT_S at most."""
    import threading

    tool, hostfile = load_tool(), tmp_path / "hostfile"
    asked, resolver = [], threading.Event()  # a resolver that answers once the test ends
    monkeypatch.setattr(tool.socket, "getfqdn", lambda: asked.append(1) or resolver.wait() and "")
    monkeypatch.setattr(tool, "FQDN_WAIT_S", 0.1, raising=False)  # a tool without the bound fails below
    try:
        for hosts in (["worker-1", "worker-2", "worker-3"], ["worker-1.example.com", "worker-2.example.com"]):
            hostfile.write_text("".join(f"{host} slots=2\n" for host in hosts))
            read = []
            reader = threading.Thread(target=lambda: read.append(tool.read_hostfile(hostfile)), daemon=True)
            reader.start()
            reader.join(10)
            assert read == [dict.fromkeys(hosts, 2)], "waited for the resolver"
        assert asked == [1]  # the dotted names', once
    finally:
        resolver.set()


def test_one_listed_host_is_said_in_the_singular(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=2\n")
    result = check(hostfile, "--num-nodes", 2)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"check_hostfile.py: error: --num-nodes 2 but hostfile {hostfile} lists 1 host; pass --num-nodes 1 or add "
        "hosts to the hostfile"]
    assert check(hostfile).stdout == f"{hostfile}: 1 host, 2 slots\n"


@pytest.mark.parametrize("text, said", [
    ("WANDB_RUN_ID=abc\n# resume the run\nWANDB_RESUME=allow\n", "line 2 '# resume the run' has no '='"),
    ("WANDB_RUN_ID=abc\n\n", "line 2 is blank"),
    ("export WANDB_RUN_ID=abc\n", "line 1 'export WANDB_RUN_ID=abc' sets 'export WANDB_RUN_ID', which is no variable"),
])
def test_a_deepspeed_env_line_the_launcher_cannot_read_is_named(tmp_path, monkeypatch, text, said):
    """DeepSpeed's launcher splits every line of .deepspeed_env at '=' (runner.py: `key, val = var.split('=',
    maxsplit=1)`, a ValueError traceback for a comment or a blank line) and exports it to each node over ssh. The
    home folder's and the current folder's are checked, the bad line named; a launch per node (--no-ssh, NODE_RANK)
    or on one node does not read them."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    env_file = tmp_path / "home" / ".deepspeed_env"
    env_file.write_text(text)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-1 slots=2\nworker-2 slots=2\n")
    tool = load_tool()
    with pytest.raises(tool.ConfigError) as error:
        tool.main([str(hostfile)])
    assert str(error.value).startswith(f"{env_file} {said}"), str(error.value)
    assert str(error.value).count("; ") == 1 and "NAME=value" in error.value.fix
    assert tool.main([str(hostfile), "--no-ssh"]) == 0 and tool.main([str(hostfile), "--num-nodes", "1"]) == 0
    env_file.write_text("WANDB_RUN_ID=abc\nWANDB_RESUME=allow")  # no newline at the end: read as DeepSpeed reads it
    (tmp_path / ".deepspeed_env").write_text("A=1\nB=\n")
    assert tool.main([str(hostfile)]) == 0
    (tmp_path / ".deepspeed_env").write_text("A=1\n# a comment\n")  # the current folder's, read too
    with pytest.raises(tool.ConfigError, match=r"^\.deepspeed_env line 2 "):
        tool.main([str(hostfile)])
    script = subprocess.run([str(ROOT / "examples_deepspeed" / "bert_multinode.sh"), "--dry-run", str(hostfile), "2",
                             "bert_distributed.sh", "2", "1", "8", "128", "1", "2", "2", "64", "4"],
                            env={**os.environ, "RUN_DIR": str(tmp_path / "run")}, capture_output=True, text=True,
                            timeout=120)  # the multi-node launch script's dry run checks them too
    assert script.returncode == 2 and ".deepspeed_env line 2 '# a comment' has no '='" in script.stderr, script.stderr
