"""--num-workers against the CPUs this process may use, checked with the flags: torch forks every
worker asked for (100000 of them hang the rank for minutes) and warns, in four lines with file paths,
only once it does. A few times the CPUs is refused in one line; more workers than CPUs is one
`warning:` line of the trainer's (by each node's first rank), torch's own warning then filtered."""
import os
import sys
import warnings

from megatron.errors import ConfigError
from megatron.parallel.launch_env import local_rank

WORKERS_PER_CPU_LIMIT = 4  # beyond this many workers per CPU a rank spends its time forking and switching
TORCH_WARNING = "This DataLoader will create"  # torch.utils.data.DataLoader.check_worker_number_rationality


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as torch counts them), else os.cpu_count()."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_num_workers(num_workers: int | None) -> None:
    """Refuses a negative --num-workers or one above WORKERS_PER_CPU_LIMIT x the usable CPUs; warns
    (one line) above the CPUs."""
    if num_workers is None or num_workers == 0:
        return
    if num_workers < 0:
        raise ConfigError(f"--num-workers {num_workers} must be >= 0",
                          "pass --num-workers 0 (samples built in the rank) or more")
    cpus = usable_cpus()
    counted = f"{cpus} CPUs this process may use (os.cpu_count(): {os.cpu_count()})"
    if num_workers > WORKERS_PER_CPU_LIMIT * cpus:
        raise ConfigError(f"--num-workers {num_workers} is more than {WORKERS_PER_CPU_LIMIT} x the {counted}: the "
                          "rank would fork them all before its first step",
                          f"pass --num-workers {min(cpus, 2)} (0 builds the samples in the rank)")
    warnings.filterwarnings("ignore", message=TORCH_WARNING, category=UserWarning)
    if num_workers > cpus and local_rank() == 0:
        print(f"warning: --num-workers {num_workers} is more than the {counted}: the workers of each rank share "
              "them with the ranks and may slow the run; fewer are as fast", file=sys.stderr, flush=True)
