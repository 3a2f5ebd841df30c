"""The env:// rendezvous address, checked first thing in a rank, before the seconds of imports
(torch, DeepSpeed) and of validation that come before the rendezvous itself:
  - a MASTER_ADDR that does not resolve: torch would retry it until --rendezvous-timeout, with a
    c10d warning per try and a C++ stack, though waiting cannot help;
  - on rank 0, a MASTER_PORT that another program (another run) listens on here: rank 0's store
    could not listen on it.
Whether MASTER_ADDR is one of rank 0's own addresses is not checked: in containers and clusters it
is often a name or service address that reaches rank 0 through a mapping, and is not bound on its
host. No torch import: a check that finds nothing costs nothing.
"""
import errno
import os
import socket
import sys

from megatron.errors import ConfigError, leave_the_line_to_rank_0
from megatron.parallel.launch_env import launch_script, prints_for_its_node, rendezvous_setting

PORT_FIX = ("pass a free port: the launcher's --master_port (MASTER_PORT for the launch scripts, --master-port "
            "for the tools)")
ADDRESS_FIX = ("pass the address of the node with rank 0: the launcher's --master_addr (MASTER_ADDR for the launch "
               "scripts and bert_multinode.sh)")
# getaddrinfo's answers that a retry cannot change (not EAI_AGAIN, a name server that did not answer)
UNKNOWN_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def check() -> None:
    """A ConfigError for this rank's rendezvous address when it cannot work; nothing without one
    (a single process, MPI) or under torchrun's agent, which hosts the store on MASTER_PORT itself."""
    if "MASTER_PORT" in os.environ:
        refuse_unusable_port(os.environ["MASTER_PORT"])
    if not all(name in os.environ for name in ("RANK", "MASTER_ADDR", "MASTER_PORT")) \
            or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return
    host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        if error.errno in UNKNOWN_NAME:
            raise ConfigError(f"MASTER_ADDR {host} does not resolve ({error.strerror})", address_fix()) from None
    if os.environ["RANK"].strip() == "0" and port.strip().isdigit() and port_in_use(int(port)):
        raise port_in_use_error(f"{host}:{port}")


def refuse_unusable_port(port: str) -> None:
    """A ConfigError for a MASTER_PORT outside 1-65535: the port probe and torch's store fail on it with a
    traceback (OverflowError), or, for 0 (the system picks a port, which the other ranks cannot know),
    rank 0's store listens where no rank looks and the ranks wait out --rendezvous-timeout. Without a
    launcher (no RANK) it is an old job's export that the run of one process would use (0 works there:
    it meets only itself)."""
    given = port.strip()
    number = given.isascii() and given.isdigit()
    if number and (1 if "RANK" in os.environ else 0) <= int(given) <= 65535:
        return
    reason = " (0 lets the system pick one, which the other ranks cannot know)" if number and int(given) == 0 else ""
    fix = port_fix() if "RANK" in os.environ else ("unset MASTER_PORT, left in the environment (a run without a "
                                                 "launcher picks a free port itself), or set it to a free port")
    raise ConfigError(f"MASTER_PORT {given if number else repr(port)} is not a TCP port the ranks can meet at, "
                      f"1-65535{reason}", fix)


def port_fix() -> str:
    """A MASTER_PORT's fix, naming what this launch's user sets: a launch script's environment, else the flags."""
    return f"set {rendezvous_setting('MASTER_PORT')} to a free port" if launch_script() else PORT_FIX


def address_fix() -> str:
    """A MASTER_ADDR's fix, as port_fix."""
    if launch_script():
        return f"set {rendezvous_setting('MASTER_ADDR')} to the address of the node with rank 0"
    return ADDRESS_FIX


def port_in_use_error(address: str, host_name: str | None = None) -> ConfigError:
    """`host_name`: the machine the port is in use on (this one's name if None)."""
    return ConfigError(f"rank 0 cannot host the rendezvous at {address}: the port is in use on "
                       f"{host_name or socket.gethostname()} (another run?)", port_fix())


def check_launch_port(host: str, port: int) -> None:
    """A launch script's check before its launch, on the node that hosts rank 0: a MASTER_PORT that another
    program (another run) listens on here, one line at once, not rank 0's after the launcher's start and the
    rank's imports (half a minute on a loaded machine)."""
    if port_in_use(port):
        raise port_in_use_error(f"{host}:{port}")


def exit_if_unusable(prog: str) -> None:
    """check(), its error the one line of rank 0 and of each node's first rank (MASTER_ADDR is given
    per node), exit 2; the other ranks wait for that line to be printed (leave_the_line_to_rank_0)."""
    try:
        check()
    except ConfigError as error:
        if prints_for_its_node():
            print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        else:
            leave_the_line_to_rank_0()
        sys.exit(2)


def port_in_use(port: int) -> bool:
    """Whether a TCP port cannot be listened on here for all addresses, as rank 0's store listens;
    the probe is closed at once (SO_REUSEADDR: it leaves nothing that holds the port)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False
