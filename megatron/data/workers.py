"""--num-workers against the CPUs this process may use, checked with the flags: torch forks every
worker asked for (100000 of them hang the rank for minutes) and warns, in four lines with file paths,
only once it does. A few times the CPUs is refused in one line; more workers than CPUs is one
`warning:` line of the trainer's (by each node's first rank), torch's own warning then filtered.
tools/preprocess_data.py's --workers follows the same rule (workers_beyond_cpus)."""
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
    too_many = workers_beyond_cpus("--num-workers", num_workers, "the rank would fork them all before its first step",
                                   "(0 builds the samples in the rank)")
    warnings.filterwarnings("ignore", message=TORCH_WARNING, category=UserWarning)
    if too_many and local_rank() == 0:
        print(f"warning: {too_many}: the workers of each rank share them with the ranks and may slow the run; fewer "
              "are as fast", file=sys.stderr, flush=True)


def warn_cpu_oversubscription() -> None:
    """On CPU ranks (DS_ACCELERATOR=cpu: no GPU), one `warning:` line from each machine's first rank when its
    ranks (the launcher's LOCAL_SIZE, torchrun's LOCAL_WORLD_SIZE) or an OMP_NUM_THREADS outnumber the CPUs:
    6 ranks on 2 CPUs (a GPU machine's command, e.g. the README's 8-rank one, run where there is none), or
    OMP_NUM_THREADS=512, trained without a word, each step many times slower. Two ranks of torch's own
    thread count on 2 CPUs (the main job's CPU run) are not warned about."""
    if os.environ.get("DS_ACCELERATOR") != "cpu" or local_rank() != 0:
        return
    cpus = usable_cpus()
    ranks = next((int(os.environ[name]) for name in ("LOCAL_SIZE", "LOCAL_WORLD_SIZE")
                  if os.environ.get(name, "").strip().isdigit()), 1)
    threads = os.environ.get("OMP_NUM_THREADS", "").strip()
    if ranks > cpus:
        print(f"warning: {ranks} CPU ranks (no GPU is used) share this machine's {cpus} CPUs: each step runs "
              f"them in turn, much slower; launch at most {cpus} ranks here, or run on GPUs", file=sys.stderr,
              flush=True)
    elif threads.isdigit() and int(threads) > cpus:
        print(f"warning: OMP_NUM_THREADS={threads} is more than the {cpus} CPUs this process may use: the threads of "
              f"each rank contend; unset it (torch then uses the CPUs) or set it to at most {max(1, cpus // ranks)}",
              file=sys.stderr, flush=True)


def workers_beyond_cpus(flag: str, count: int, cost: str, fewer: str = "") -> str | None:
    """The one rule for a worker-count flag (the trainer's --num-workers, preprocess_data.py's --workers): above
    WORKERS_PER_CPU_LIMIT x the usable CPUs refused (`cost`: what forking them all does), above the CPUs
    '<flag> N is more than the C CPUs ...' for the caller's warning line, else None. `fewer` ends the fix."""
    cpus = usable_cpus()
    counted = f"{cpus} CPUs this process may use (os.cpu_count(): {os.cpu_count()})"
    if count > WORKERS_PER_CPU_LIMIT * cpus:
        raise ConfigError(f"{flag} {count} is more than {WORKERS_PER_CPU_LIMIT} x the {counted}: {cost}",
                          f"pass {flag} {min(cpus, 2)}" + (f" {fewer}" if fewer else ""))
    return f"{flag} {count} is more than the {counted}" if count > cpus else None
