"""Checks a DeepSpeed hostfile before a multi-node launch (examples_deepspeed/bert_multinode.sh calls it).

    python tools/check_hostfile.py HOSTFILE [--num-nodes N] [--ranks-per-node R] [--ssh | --no-ssh]

The format is DeepSpeed's (deepspeed/launcher/runner.py): one `<host> slots=<gpus>` line per machine,
read as DeepSpeed reads it (`^(\\S+)\\s+slots=(\\d+)`; what follows the slots is ignored: a `# comment`,
`gpus=0,1`); `#` comment lines and blank lines ignored. With --ranks-per-node
(the launch's PROCS, DeepSpeed's --num_gpus), each of the first N hosts must have that many slots:
DeepSpeed would start R ranks on a machine with fewer GPUs. With --ssh, the first host must answer
passwordless ssh, which DeepSpeed's launcher checks (with a traceback) after the run's JSON is written.
DeepSpeed's own parser stops with a ValueError traceback and the whole file on a bad line; this names
the line and the fix, exit code 2, before anything starts. A launch over ssh (more than one node, no
--no-ssh) also exports the lines of DeepSpeed's .deepspeed_env files (in the home folder and the current
one; DS_ENV_FILE renames them) to every node, splitting each line at its first `=` (runner.py): a comment or
a blank line there is a ValueError traceback, and a name that is no variable breaks each node's command;
the bad line is named.
"""
import argparse
import functools
import ipaddress
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, OneLineParser, run_tool
from megatron.parallel.master_address import port_in_use_error

FORMAT = "write one line per machine: <host> slots=<gpus>"
LINE = re.compile(r"(\S+)\s+slots=(\d+)")  # DeepSpeed's pattern, matched at the line's start; the rest is ignored
BOM = "\ufeff"
HOST_PORT = re.compile(r"[^:\[\]]+:\d+")  # `worker-1:2222`; not an IPv6 address (two colons or more)
# the launch scripts' names for the flags (--script-names), else the tool's own
NAMES = {False: {"nodes": "--num-nodes", "ranks": "--ranks-per-node", "ranks_given": "--ranks-per-node {}",
                 "no_ssh": "start each machine's ranks on it (deepspeed --no_ssh --node_rank I --master_addr ADDR)"},
         True: {"nodes": "NUM_NODES", "ranks": "PROCS", "ranks_given": "PROCS {} ranks per node",
                "no_ssh": "run the same command on every machine with NODE_RANK and MASTER_ADDR (no ssh)"}}


def read_hostfile(path) -> dict:
    """{host: slots} in file order; every line is checked."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"hostfile {path} is a directory", "pass the hostfile itself (" + FORMAT + ")")
    if not path.is_file():
        kind = special_file_kind(path)
        if kind:  # DeepSpeed's runner tests os.path.isfile: it would skip the hostfile and start local ranks only
            raise ConfigError(f"hostfile {path} is {kind}, not a file, and DeepSpeed reads only a regular file",
                              "write the hostfile's lines to a file and pass that")
        raise ConfigError(f"hostfile {path} does not exist", FORMAT)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"hostfile {path} cannot be read as text ({getattr(error, 'strerror', None) or error})",
                          FORMAT) from None
    if text.startswith(BOM):  # DeepSpeed reads it as part of the first host's name, which ssh then cannot reach
        raise ConfigError(f"hostfile {path} starts with a byte-order mark", "save it as plain UTF-8 (without BOM)")
    hosts = {}
    for number, line in enumerate(text.splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        match = LINE.match(text)
        if not match:
            raise ConfigError(f"hostfile {path} line {number} {text!r} is not '<host> slots=<gpus>'", FORMAT)
        host, slots = match.group(1), int(match.group(2))
        if HOST_PORT.fullmatch(host):  # DeepSpeed would ssh to a machine named `worker-1:2222`
            name, port = host.split(":")
            raise ConfigError(f"hostfile {path} line {number} gives {host}, a host with a port, which DeepSpeed takes "
                              "as the host's name", f"list the host alone and set its port in ~/.ssh/config "
                              f"(Host {name} / Port {port}), which ssh, and so DeepSpeed, reads")
        same = next((listed for listed in hosts if listed.lower() == host.lower()), None)  # DNS ignores case
        if same is not None:
            where = f"line {number}" if same == host else f"line {number}; {same} before"
            raise ConfigError(f"hostfile {path} lists {host} twice ({where})", "list each machine once")
        this = hosts and is_this_machine(host)  # a first host asks nothing of this machine
        same = next((listed for listed in hosts if is_this_machine(listed)), None) if this else None
        if same is not None:  # two launches on this machine, their ranks on the same GPUs
            raise ConfigError(f"hostfile {path} lists this machine twice: {host} (line {number}) and {same} both name "
                              "it", "list each machine once")
        if slots < 1:
            raise ConfigError(f"hostfile {path} line {number} gives {host} slots=0", "give each machine slots >= 1")
        hosts[host] = slots
    if not hosts:
        raise ConfigError(f"hostfile {path} lists no hosts", FORMAT)
    return hosts


VARIABLE = re.compile(r"[A-Za-z_]\w*")  # what a shell's `export NAME=value` (pdsh) and mpirun -x take
ENV_FORMAT = "write each line as NAME=value (no comments, no blank lines, no export)"


def deepspeed_env_files() -> list[Path]:
    """The .deepspeed_env files DeepSpeed's launcher reads for a launch over ssh, in its order: the home folder's,
    then the current folder's (runner.py's DEEPSPEED_ENVIRONMENT_PATHS; DS_ENV_FILE names the file)."""
    name = os.getenv("DS_ENV_FILE", ".deepspeed_env")
    return [path for path in (Path(os.path.expanduser("~"), name), Path(".", name)) if path.is_file()]


def check_deepspeed_env(path: Path) -> None:
    """Each line of `path` NAME=value, as DeepSpeed's launcher reads every line (`key, val = line.split('=', 1)`)
    and exports it to each node: a line without `=` (a comment, a blank line) is its ValueError traceback, a
    name that is no variable (`# note=x`, `export A=1`) breaks the nodes' command."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}, which DeepSpeed's launcher exports to every node, cannot be read as text "
                          f"({getattr(error, 'strerror', None) or error})", f"fix or remove {path}") from None
    for number, line in enumerate(lines, start=1):
        name, equals, _ = line.partition("=")
        if not equals:
            what = "is blank" if not line.strip() else f"{line.strip()!r} has no '='"
            raise ConfigError(f"{path} line {number} {what}: DeepSpeed's launcher reads every line of it as NAME=value "
                              "and stops with a ValueError traceback", f"remove that line ({ENV_FORMAT})")
        if not VARIABLE.fullmatch(name.strip()):
            raise ConfigError(f"{path} line {number} {line.strip()!r} sets {name.strip()!r}, which is no variable "
                              "name: DeepSpeed's launcher would put it in every node's command as it is",
                              f"fix or remove that line ({ENV_FORMAT})")


def is_this_machine(host: str) -> bool:
    """Whether `host` names this machine: its loopback (localhost, 127.x.x.x, ::1), its host name (as `hostname`
    prints it, or its fully qualified name) or an address of one of its interfaces. The host itself is not looked
    up: a hostfile's other names would each ask DNS, which can hang."""
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        name = host.lower()
        # a name without a dot is no fully qualified one: only a dotted name asks for this machine's (own_fqdn)
        return name == socket.gethostname().lower() or ("." in name and name == own_fqdn())
    return address.is_loopback or address in own_addresses()


FQDN_WAIT_S = 2.0  # a resolver that has not answered by then (a broken one: the DNS timeout, 5 s a try) is left


@functools.cache
def own_fqdn() -> str | None:
    """This machine's fully qualified name, lowercase: socket.getfqdn looks its host name up (DNS), which blocks
    for the resolver's timeout on a machine whose resolver does not answer. Not waited for beyond FQDN_WAIT_S
    (None then: a dotted name is then not taken for this machine's), in a thread the process does not wait for."""
    found = []
    lookup = threading.Thread(target=lambda: found.append(socket.getfqdn().lower()), daemon=True)
    lookup.start()
    lookup.join(FQDN_WAIT_S)
    return found[0] if found else None


@functools.cache
def own_addresses() -> set:
    """The addresses of this machine's interfaces (psutil, a DeepSpeed requirement, reads them without a lookup)."""
    import psutil

    return {ipaddress.ip_address(entry.address.split("%")[0]) for entries in psutil.net_if_addrs().values()
            for entry in entries if entry.family in (socket.AF_INET, socket.AF_INET6)}


def special_file_kind(path: Path) -> str | None:
    """What `path` is when it exists but is neither a regular file nor a folder: a pipe (a `<(...)` process
    substitution, /dev/fd/N), a device (/dev/null), a socket; None when it does not exist."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISFIFO, "a pipe (as <(...) gives)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


# run on the first host, where DeepSpeed's runner starts rank 0 (and reads MASTER_ADDR from its `hostname -I`), by the
# python it starts the ranks with there (this one's path; its runner runs sys.executable on every host) and this
# repository's check (its path is the launched pretrain_bert.py's): no answer (no such python or repository there)
# leaves the port to rank 0's own check
PORT_PROBE = ("import sys; sys.path[:0] = [sys.argv[1]]; from megatron.parallel.master_address import port_in_use; "
              "print('MASTER_PORT', 'in use' if port_in_use(int(sys.argv[2])) else 'free')")


def check_ssh(host: str, no_ssh: str, master_port: int | None = None) -> None:
    """DeepSpeed's launcher check (`ssh -o PasswordAuthentication=no HOST hostname`), never prompting; with
    `master_port`, in the same ssh call, whether rank 0's store could listen on it there (port_in_use): a port
    another run holds was rank 0's line only after the launch and the ranks' imports on every node."""
    remote = "hostname"
    if master_port is not None:
        remote += (f"; {shlex.quote(sys.executable)} -c {shlex.quote(PORT_PROBE)} "
                   f"{shlex.quote(str(this_repo.ROOT))} {master_port} 2> /dev/null; true")
    command = ["ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "ConnectTimeout=5", host, remote]
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        said = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1].strip()
    except FileNotFoundError:
        result, said = None, "no ssh command on this machine"
    except subprocess.TimeoutExpired:
        result, said = None, "no answer within 30 s"
    if result is None or result.returncode != 0:
        fix = (f"run `ssh {host}` once to accept its host key" if "Host key verification failed" in said else
               f"set up ssh keys so that `ssh {host}` asks for nothing")
        raise ConfigError(f"cannot reach {host}, the hostfile's first host, by passwordless ssh ({said}), which "
                          "DeepSpeed's launcher needs", f"{fix}, or {no_ssh}")
    if master_port is not None and "MASTER_PORT in use" in result.stdout.splitlines():
        name = (result.stdout.splitlines() or [host])[0].strip() or host
        raise port_in_use_error(f"{host}:{master_port}", name)


def main(argv=None, parsed: dict | None = None) -> int:
    """The exit code; `parsed` gets the parsed flags ("args"), for the name run_tool's line starts with."""
    parser = OneLineParser(prog="check_hostfile.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hostfile")
    parser.add_argument("--num-nodes", type=int, help="machines the launch uses (at most the hosts listed)")
    parser.add_argument("--ranks-per-node", type=int, help="ranks the launch starts on each machine (PROCS)")
    reach = parser.add_mutually_exclusive_group()
    reach.add_argument("--ssh", action="store_true", help="check that the first host answers passwordless ssh")
    parser.add_argument("--master-port", type=int, metavar="PORT",
                        help="with --ssh: also check, in the same ssh call, that PORT is free on the first host, where "
                             "rank 0 hosts the rendezvous (MASTER_PORT)")
    reach.add_argument("--no-ssh", action="store_true",
                        help="the launch starts each machine's ranks on it (deepspeed --no_ssh, NODE_RANK): DeepSpeed "
                             "reads no .deepspeed_env file, which is then not checked")
    parser.add_argument("--script-names", metavar="SCRIPT",
                        help="name the launch scripts' NUM_NODES, PROCS and NODE_RANK in errors, which start with "
                             "SCRIPT: error: (the launch script's name; bert_common.sh)")
    parser.add_argument("--print-num-nodes", action="store_true",
                        help="print the machines the launch uses (--num-nodes, else every host listed, as DeepSpeed's "
                             "launcher takes them without --num_nodes) instead of the hostfile's summary")
    args = parser.parse_args(argv)
    if parsed is not None:
        parsed["args"] = args
    names = NAMES[args.script_names is not None]
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise ConfigError(f"--ranks-per-node {args.ranks_per_node} must be >= 1", "pass the ranks each machine starts")
    hosts = read_hostfile(args.hostfile)
    if args.num_nodes is not None and not 1 <= args.num_nodes <= len(hosts):
        listed, allowed = ("1 host", "1") if len(hosts) == 1 else (f"{len(hosts)} hosts", f"between 1 and {len(hosts)}")
        raise ConfigError(f"{names['nodes']} {args.num_nodes} but hostfile {args.hostfile} lists {listed}",
                          f"pass {names['nodes']} {allowed} or add hosts to the hostfile")
    if args.ranks_per_node is not None:
        used = list(hosts.items())[:args.num_nodes or len(hosts)]
        short = [(host, slots) for host, slots in used if slots < args.ranks_per_node]
        if short:
            host, slots = short[0]
            raise ConfigError(f"{names['ranks_given'].format(args.ranks_per_node)} but hostfile {args.hostfile} "
                              f"gives {host} slots={slots}", f"pass {names['ranks']} at most "
                              f"{min(s for _, s in used)} or raise the slots of that machine")
    if not args.no_ssh and (args.num_nodes or len(hosts)) > 1:  # DeepSpeed reads them for a launch over ssh only
        for path in deepspeed_env_files():
            check_deepspeed_env(path)
    if args.ssh:
        check_ssh(next(iter(hosts)), names["no_ssh"], args.master_port)
    if args.print_num_nodes:
        print(args.num_nodes or len(hosts))
    else:
        print(f"{args.hostfile}: {len(hosts)} host{'s' if len(hosts) > 1 else ''}, {sum(hosts.values())} slots")
    return 0


def cli(argv=None) -> int:
    """The exit code, a mistake one line (run_tool) that starts with --script-names' SCRIPT where given: the
    launch script its user ran."""
    flags = {}
    return run_tool(lambda: getattr(flags.get("args"), "script_names", None) or "check_hostfile.py",
                    lambda: main(argv, flags))


if __name__ == "__main__":
    sys.exit(cli())
