"""Checks a DeepSpeed hostfile before a multi-node launch (examples_deepspeed/bert_multinode.sh calls it).

    python tools/check_hostfile.py HOSTFILE [--num-nodes N] [--ranks-per-node R]

The format is DeepSpeed's (deepspeed/launcher/runner.py): one `<host> slots=<gpus>` line per machine,
optionally followed by a `# comment`; `#` comment lines and blank lines ignored. With --ranks-per-node
(the launch's PROCS, DeepSpeed's --num_gpus), each of the first N hosts must have that many slots:
DeepSpeed would start R ranks on a machine with fewer GPUs. DeepSpeed's own parser stops with a ValueError traceback and
the whole file on a bad line; this names the line and the fix, exit code 2, before anything starts.
"""
import argparse
import re
import sys
from pathlib import Path

from megatron.errors import ConfigError, run_tool

FORMAT = "write one line per machine: <host> slots=<gpus>"
LINE = re.compile(r"(\S+)\s+slots=(\d+)(?:\s+#.*)?")  # DeepSpeed ignores what follows the slots


def read_hostfile(path) -> dict:
    """{host: slots} in file order; every line is checked."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"hostfile {path} is a directory", "pass the hostfile itself (" + FORMAT + ")")
    if not path.is_file():
        raise ConfigError(f"hostfile {path} does not exist", FORMAT)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"hostfile {path} cannot be read as text ({getattr(error, 'strerror', None) or error})",
                          FORMAT) from None
    hosts = {}
    for number, line in enumerate(text.splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        match = LINE.fullmatch(text)
        if not match:
            raise ConfigError(f"hostfile {path} line {number} {text!r} is not '<host> slots=<gpus>'", FORMAT)
        host, slots = match.group(1), int(match.group(2))
        if host in hosts:
            raise ConfigError(f"hostfile {path} lists {host} twice (line {number})", "list each machine once")
        if slots < 1:
            raise ConfigError(f"hostfile {path} line {number} gives {host} slots=0", "give each machine slots >= 1")
        hosts[host] = slots
    if not hosts:
        raise ConfigError(f"hostfile {path} lists no hosts", FORMAT)
    return hosts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="check_hostfile.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hostfile")
    parser.add_argument("--num-nodes", type=int, help="machines the launch uses (at most the hosts listed)")
    parser.add_argument("--ranks-per-node", type=int, help="ranks the launch starts on each machine (PROCS)")
    args = parser.parse_args(argv)
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise ConfigError(f"--ranks-per-node {args.ranks_per_node} must be >= 1", "pass the ranks each machine starts")
    hosts = read_hostfile(args.hostfile)
    if args.num_nodes is not None and not 1 <= args.num_nodes <= len(hosts):
        raise ConfigError(f"NUM_NODES {args.num_nodes} but hostfile {args.hostfile} lists {len(hosts)} hosts",
                          f"pass NUM_NODES between 1 and {len(hosts)} or add hosts to the hostfile")
    if args.ranks_per_node is not None:
        used = list(hosts.items())[:args.num_nodes or len(hosts)]
        short = [(host, slots) for host, slots in used if slots < args.ranks_per_node]
        if short:
            host, slots = short[0]
            raise ConfigError(f"PROCS {args.ranks_per_node} ranks per node but hostfile {args.hostfile} gives {host} "
                              f"slots={slots}", f"pass PROCS at most {min(s for _, s in used)} or raise the slots "
                              "of that machine")
    print(f"{args.hostfile}: {len(hosts)} hosts, {sum(hosts.values())} slots")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool("check_hostfile.py", main))
