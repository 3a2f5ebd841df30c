"""Sequence-parallel scaling on a fixed pair of cores: SP=2 (2 ranks x 1 thread) vs SP=1 (1 rank x 2 threads).

Both run the same whole training step (forward, backward, gradient sum over the seq group,
AdamW; `attention_memory.train_step`) on the same global batch (1 sample) and sequence, on the
same 2 cores. Ideal sequence parallelism splits the work into halves that run side by side, one
core each, so SP=2 then takes exactly as long as SP=1 spreading the whole work over the same two
cores with intra-op threads:

    efficiency = t(SP=1, 2 threads) / t(SP=2, 2 ranks x 1 thread)      (ideal 1.0)

It exceeds 1 where two intra-op threads scale worse than two processes. t is the median over
--steps timed steps after one warm-up, each step's time being the slowest rank's.

Ring communication hiding: at SP=2 every other step runs with `SeqComm.shift` (the ring's block
exchange) replaced by a local copy of the same tensor, so every block still costs its compute
but nothing crosses ranks; alternating keeps both under the same machine load. t_comm / t_local
is the issue's ratio (1.0: all hidden). The exchange alone, one step's messages sent back to
back with no compute (`comm alone`), gives the hidden share: 1 - (t_comm - t_local) / comm_alone.

    .venv/bin/python benchmarks/sp_scaling.py [--seq-lengths 1024 2048 4096] [--steps 5] [--profile]

--profile (automatic when ring misses 0.8 at the longest sequence) writes torch.profiler tables
of one ring step per rank at SP=1 and SP=2 under benchmarks/profiles/ (with --write; else a temporary folder).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch
    import torch.distributed as dist

    from attention_memory import LENGTHS_HELP, bert_config, check_lengths, train_step
    from megatron.model.attention.comm import SeqComm
    from megatron.parallel import state
    from megatron.parallel.spawn import run_on_ranks
    import results
    from results import BenchmarkParser, machine, positive, run_benchmark, save_plot, write_section

PLOT = HERE / "sp_scaling.png"
PROFILES = HERE / "profiles"
VARIANTS = ("ring", "ulysses", "linformer", "bigbird")
CORES = 2
TARGET = 0.8  # the ring efficiency target


def _local_shift(self, tensor):
    """`SeqComm.shift` without communication: the 'received' block is a copy of the sent one."""
    received = tensor.clone()
    return lambda: received


def _recording_shift(log: list):
    """`SeqComm.shift` that also logs each message's size, for the comm-alone replay."""
    shift = SeqComm.shift

    def recorded(self, tensor):
        log.append((tensor.numel(), tensor.dtype))
        return shift(self, tensor)
    return recorded


def _replay(messages: list) -> float:
    """Seconds to send `messages` around the ring one after another, with no compute between."""
    exchanger = SeqComm(state.get_sequence_parallel_group(), state.get_sequence_parallel_ranks())
    buffers = [torch.zeros(numel, dtype=dtype) for numel, dtype in messages]
    dist.barrier()
    start = time.perf_counter()
    for tensor in buffers:
        exchanger.shift(tensor)()
    return time.perf_counter() - start


def time_steps(variant: str, size: int, seq_lengths: list, steps: int) -> dict:
    """{seq: {mode: [seconds per timed step], "comm_alone": seconds or None, "messages": ring
    messages per step}} on this rank.

    Modes: "comm"; for ring at SP > 1 also "local" (the exchange replaced by a local copy),
    alternated step by step with "comm" so that both see the same machine load.
    """
    if size > 1:
        state.initialize(sequence=size)
    messages = []
    shifts = {"comm": _recording_shift(messages)}
    if variant == "ring" and size > 1:
        shifts["local"] = _local_shift
    out = {}
    for seq in seq_lengths:
        step = train_step(bert_config(variant, seq), size)
        times = {mode: [] for mode in shifts}
        for i in range(steps + 1):  # the first round is a warm-up: allocator, thread pools, gloo connections
            for mode, shift in shifts.items():
                SeqComm.shift = shift  # counts (and replaces) every core's shifts, not only the ring's
                if mode == "comm":
                    del messages[:]
                if size > 1:
                    dist.barrier()
                start = time.perf_counter()
                step()
                if i:
                    times[mode].append(time.perf_counter() - start)
        one_step = list(messages) if "local" in shifts else []  # the last "comm" step's messages
        times["comm_alone"] = statistics.median(_replay(one_step) for _ in range(3)) if one_step else None
        times["messages"] = len(one_step)
        out[seq] = times
    return out


# profiler op names -> where the time goes (self CPU time, so nothing is counted twice)
CATEGORIES = {
    # the ring's autograd Function minus its ops: waiting on isend/irecv (gloo's wait is no op) and Python
    "ring waits + Python": ("RingAttentionFunction",),
    "attention kernels": ("scaled_dot_product", "flash_attention"),
    "matmul": ("aten::addmm", "aten::mm", "aten::bmm"),
    "communication": ("gloo", "c10d", "send", "recv", "all_reduce", "barrier", "all_to_all", "allgather"),
    "optimizer": ("_foreach", "adamw", "Optimizer"),
}


def time_by_category(events, wall_us: float) -> dict:
    """Self CPU ms per category; 'other ops' is the remaining op time, 'outside ops' the step's
    wall time no op accounts for (Python, waiting on a non-blocking send or receive)."""
    out = dict.fromkeys([*CATEGORIES, "other ops"], 0.0)
    for event in events:
        name = event.key
        category = next((c for c, keys in CATEGORIES.items() if any(k in name for k in keys)), "other ops")
        out[category] += event.self_cpu_time_total / 1e3
    out["outside ops"] = max(wall_us / 1e3 - sum(out.values()), 0.0)
    return out


def profile_step(variant: str, size: int, seq: int, directory: str) -> tuple:
    """Writes this rank's torch.profiler table of one step (after a warm-up); -> (path, ms per category)."""
    from torch.profiler import ProfilerActivity, profile

    if size > 1:
        state.initialize(sequence=size)
    step = train_step(bert_config(variant, seq), size)
    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        wall_us = (time.perf_counter() - start) * 1e6
    rank = dist.get_rank() if size > 1 else 0
    path = Path(directory) / f"{variant}_sp{size}_s{seq}_rank{rank}.txt"
    path.write_text(f"{variant} SP={size} s={seq} rank {rank}, {torch.get_num_threads()} threads, one training step "
                    f"({wall_us / 1e3:.0f} ms)\n\n"
                    + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    return str(path), time_by_category(prof.key_averages(), wall_us)


def _slowest_rank(per_rank: list, size: int) -> dict:
    """{label: {seq: {"seconds": median over steps of the slowest rank's time, "comm_alone"}}}."""
    out = {}
    for seq, first in per_rank[0].items():
        alone = [rank[seq]["comm_alone"] for rank in per_rank if rank[seq]["comm_alone"] is not None]
        for mode in first.keys() - {"comm_alone", "messages"}:
            steps = [max(times) for times in zip(*(rank[seq][mode] for rank in per_rank))]
            label = f"SP={size}" + (" local" if mode == "local" else "")
            out.setdefault(label, {})[seq] = {"seconds": statistics.median(steps),
                                              "comm_alone": max(alone) if alone else None}
    return out


def run(seq_lengths: list, steps: int) -> dict:
    """{(variant, label): {seq: {"seconds", "comm_alone"}}} with labels "SP=1", "SP=2" and, for
    ring, "SP=2 local"."""
    results = {}
    for size in (1, 2):
        for variant in VARIANTS:
            per_rank = run_on_ranks(time_steps, size, variant, size, seq_lengths, steps, timeout=3600,
                                    threads_per_rank=CORES // size)
            for label, rows in _slowest_rank(per_rank, size).items():
                results[variant, label] = rows
                print(variant, label, rows, flush=True)
    return results


def efficiency(results: dict, variant: str, seq: int) -> float:
    return results[variant, "SP=1"][seq]["seconds"] / results[variant, "SP=2"][seq]["seconds"]


def scaling_table(results: dict, seq_lengths: list) -> str:
    lines = ["| variant | seq | SP=1 s/step | SP=2 s/step | SP=1 tokens/s | SP=2 tokens/s | efficiency t1/t2 |",
             "|---|---|---|---|---|---|---|"]
    for variant in VARIANTS:
        for seq in seq_lengths:
            t1, t2 = (results[variant, label][seq]["seconds"] for label in ("SP=1", "SP=2"))
            lines.append(f"| {variant} | {seq} | {t1:.3f} | {t2:.3f} | {seq / t1:.0f} | {seq / t2:.0f} | "
                         f"{t1 / t2:.2f} |")
    return "\n".join(lines)


def comm_table(results: dict, seq_lengths: list) -> str:
    lines = ["| seq | t with comm s | t local copy s | t_comm / t_local | comm alone s | exposed comm s | hidden share |",
             "|---|---|---|---|---|---|---|"]
    for seq in seq_lengths:
        with_comm, local = results["ring", "SP=2"][seq], results["ring", "SP=2 local"][seq]
        exposed = with_comm["seconds"] - local["seconds"]
        hidden = 1 - max(exposed, 0.0) / with_comm["comm_alone"]
        lines.append(f"| {seq} | {with_comm['seconds']:.3f} | {local['seconds']:.3f} | "
                     f"{with_comm['seconds'] / local['seconds']:.2f} | {with_comm['comm_alone']:.3f} | "
                     f"{exposed:.3f} | {max(hidden, 0.0):.2f} |")
    return "\n".join(lines)


def plot(results: dict, seq_lengths: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed_ax, eff_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant in VARIANTS:
        for label, style in (("SP=1", "-"), ("SP=2", "--")):
            line = speed_ax.plot(seq_lengths, [seq / results[variant, label][seq]["seconds"] for seq in seq_lengths],
                                 style, marker="o", label=f"{variant} {label}",
                                 color=f"C{VARIANTS.index(variant)}")
        eff_ax.plot(seq_lengths, [efficiency(results, variant, seq) for seq in seq_lengths], marker="o",
                    label=variant, color=line[0].get_color())
    eff_ax.plot(seq_lengths, [results["ring", "SP=1"][seq]["seconds"] / results["ring", "SP=2 local"][seq]["seconds"]
                              for seq in seq_lengths], ":", marker="x", color="C0", label="ring, comm -> local copy")
    eff_ax.axhline(1.0, color="grey", lw=0.8)
    eff_ax.axhline(TARGET, color="red", lw=0.8, ls="--", label=f"target {TARGET}")
    speed_ax.set_ylabel("training tokens/s (whole step)")
    eff_ax.set_ylabel("efficiency t(SP=1, 2 threads) / t(SP=2, 2 x 1 thread)")
    for ax in (speed_ax, eff_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    speed_ax.set_yscale("log")
    fig.suptitle(f"4-layer BERT h=128 training step, batch 1, fp32, CPU ({CORES} cores)")
    fig.tight_layout()
    save_plot(fig, PLOT)


def profile_ring(seq: int) -> dict:
    """{"SP=1 rank 0" / "SP=2 rank r": (profile path, ms per category)} of one ring step. The tables go
    under the committed benchmarks/profiles/ with --write only, else into a temporary folder."""
    directory = PROFILES if results.WRITE else Path(tempfile.mkdtemp(prefix="sp_scaling_profiles_"))
    directory.mkdir(exist_ok=True)
    out = {}
    for size in (1, 2):
        per_rank = run_on_ranks(profile_step, size, "ring", size, seq, str(directory), timeout=3600,
                                threads_per_rank=CORES // size)
        out.update({f"SP={size} rank {rank}": row for rank, row in enumerate(per_rank)})
    return out


def profile_table(profiles: dict) -> str:
    labels = list(profiles)
    lines = ["| ms per step | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for category in [*CATEGORIES, "other ops", "outside ops"]:
        lines.append(f"| {category} | " + " | ".join(f"{profiles[label][1][category]:.0f}" for label in labels) + " |")
    lines.append("| total | " + " | ".join(f"{sum(profiles[label][1].values()):.0f}" for label in labels) + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lengths", type=positive(int), nargs="+", default=[1024, 2048, 4096], help=LENGTHS_HELP)
    parser.add_argument("--steps", type=positive(int), default=5, help="timed steps per run, after one warm-up")
    parser.add_argument("--profile", action="store_true", help="also profile ring at SP=1 and SP=2")
    args = parser.parse_args(argv)
    check_lengths(parser, "--seq-lengths", args.seq_lengths,
                  [(variant, size) for variant in VARIANTS for size in (1, 2)])
    return args


def main():
    args = parse_args()
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = run(args.seq_lengths, args.steps)
    top = args.seq_lengths[-1]
    ring_efficiency = efficiency(results, "ring", top)
    profiles = profile_ring(top) if args.profile or ring_efficiency < TARGET else {}
    load_after = os.getloadavg()
    plot(results, args.seq_lengths)
    profile_note = ""
    if profiles:
        files = ", ".join(f"`{Path(path).relative_to(HERE) if Path(path).is_relative_to(HERE) else path}`"
                          for path, _ in profiles.values())
        profile_note = f"""Where one ring step's time goes at s={top} (torch.profiler, self CPU time per op
category; SP=1 with {CORES} threads, SP=2 per rank with 1 thread; tables sorted by self time: {files}):

{profile_table(profiles)}

Reading it: SP=1 runs the whole attention on {CORES} threads, each SP=2 rank half of it on one, so equal
`attention kernels` rows mean the attention splits perfectly; what SP=2 adds is the ring's share
(`ring waits + Python`, `communication`, part of `outside ops`).
"""
    load = max(load_before[0], load_after[0])  # this benchmark itself adds up to CORES
    load_warning = ""
    if load > 2 * CORES:
        load_warning = (f"**Measured under a load average of {load:.1f} on {CORES} cores: not a valid scaling "
                        f"result.** A {CORES}-thread SP=1 step stalls whenever one of its threads is descheduled, "
                        "and a rank waits on the other at every ring exchange; rerun on an idle machine "
                        "(`make bench-sp-scaling`).\n")
    elif load > CORES:
        load_warning = (f"Load average up to {load:.1f} on {CORES} cores around this run (other work at its start "
                        "or end): the ratios are approximate.\n")
    write_section("Sequence-parallel scaling (CPU)", f"""
Machine: {machine()}; measured on CPU, no GPU lent. Command: `.venv/bin/python benchmarks/sp_scaling.py
--seq-lengths {' '.join(map(str, args.seq_lengths))} --steps {args.steps}{' --profile' if args.profile else ''}` ({time.perf_counter() - started:.0f} s).
Load average (1, 5, 15 min) before: {', '.join(f'{x:.1f}' for x in load_before)}; after: {', '.join(f'{x:.1f}' for x in load_after)}
(anything well above {CORES} means other work shared the cores and the ratios are noisy).
{load_warning}
4-layer BERT (h=128, 4 heads, vocab 1000, no dropout), batch 1, fp32; one whole training step
(forward, backward, gradient sum over the seq group, AdamW). SP=1: one process with {CORES} threads;
SP=2: two processes over gloo with 1 thread each, the same {CORES} cores. Median of {args.steps} steps
after a warm-up, each step timed on its slowest rank. With the cores fixed, ideal SP=2 takes the
SP=1 time, so **efficiency = t(SP=1) / t(SP=2)** (ideal 1.0; target >= {TARGET} for ring at s=4096).

{scaling_table(results, args.seq_lengths)}

**Ring communication at SP=2**: `t local copy` replaces ring.py's block exchange (`SeqComm.shift`)
by a copy of the same tensor (same compute, no traffic), in steps alternating with the real ones; `comm alone` sends one step's ring
messages back to back with no compute; hidden share = 1 - (t_comm - t_local) / comm alone. Exposed
time beyond `comm alone` is not transfer but one rank waiting for the other at an exchange.

{comm_table(results, args.seq_lengths)}

Ring at s={top}: efficiency {ring_efficiency:.2f} (target {TARGET}).

{profile_note}

![sequence-parallel scaling](sp_scaling.png)
""")


if __name__ == "__main__":
    run_benchmark(main)
