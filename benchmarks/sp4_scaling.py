"""SP=4 on the same 2 cores: ring (1 x 4), ulysses (4 x 1) and hybrid (Ulysses 2 x ring 2).

The companion of sp_scaling.py (SP=2): the same 4-layer BERT (h=128, 4 heads) training step
(`attention_memory.train_step`), SP=1 as one process with 2 threads against SP=4 as four
processes with 1 thread each on the same 2 cores (two ranks share a core), so

    efficiency = t(SP=1, 2 threads) / t(SP=4, 4 ranks x 1 thread)      (ideal about 1.0)

and the three layouts of P=4 are compared side by side in one run. Median of --steps steps
after a warm-up, each step timed on its slowest rank.

    .venv/bin/python benchmarks/sp4_scaling.py [--seq-lengths 2048 4096] [--steps 3]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch.distributed as dist

    from attention_memory import bert_config, train_step
    from megatron.parallel import state
    from megatron.parallel.spawn import run_on_ranks
    from results import BenchmarkParser, machine, positive, run_benchmark, write_section

CORES = 2
LAYOUTS = (("ring", 1), ("ulysses", 4), ("hybrid", 2))  # (variant, Ulysses degree at SP=4)
HEADING = "Sequence-parallel scaling at SP=4: ring, ulysses, hybrid (CPU)"


def time_layouts(size: int, seq_lengths: list, steps: int) -> dict:
    """{(variant, seq): [seconds per timed step]} on this rank. The three layouts share one set of
    ranks (the seq group serves ring and ulysses, its Ulysses x ring split hybrid) and take turns
    step by step, so that all of them see the same machine load."""
    if size > 1:
        state.initialize(sequence=size, ulysses=dict(LAYOUTS)["hybrid"])
    out = {}
    for seq in seq_lengths:
        step_of = {}
        for variant, ulysses in LAYOUTS:
            config = bert_config(variant, seq)
            if variant == "hybrid":
                config.ulysses_size = ulysses
            step_of[variant] = train_step(config, size)
        for i in range(steps + 1):  # the first round is a warm-up
            for variant, step in step_of.items():
                if size > 1:
                    dist.barrier()
                start = time.perf_counter()
                step()
                if i:
                    out.setdefault((variant, seq), []).append(time.perf_counter() - start)
    return out


def run(seq_lengths: list, steps: int) -> dict:
    """{(variant, size): {seq: median over steps of the slowest rank's seconds}}."""
    results = {}
    for size in (1, 4):
        per_rank = run_on_ranks(time_layouts, size, size, seq_lengths, steps, timeout=3600,
                                threads_per_rank=max(CORES // size, 1))
        for variant, _ in LAYOUTS:
            results[variant, size] = {seq: statistics.median(max(t) for t in zip(*(r[variant, seq] for r in per_rank)))
                                      for seq in seq_lengths}
            print(variant, size, results[variant, size], flush=True)
    return results


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lengths", type=positive(int), nargs="+", default=[2048, 4096])
    parser.add_argument("--steps", type=positive(int), default=3)
    return parser.parse_args(argv)


def main():
    args = parse_args()
    load_before, started = os.getloadavg(), time.perf_counter()
    results = run(args.seq_lengths, args.steps)
    load_after = os.getloadavg()
    lines = ["| variant | U x R | seq | SP=1 s/step | SP=4 s/step | SP=4 tokens/s | efficiency t1/t4 |",
             "|---|---|---|---|---|---|---|"]
    for variant, ulysses in LAYOUTS:
        for seq in args.seq_lengths:
            t1, t4 = results[variant, 1][seq], results[variant, 4][seq]
            lines.append(f"| {variant} | {ulysses} x {4 // ulysses} | {seq} | {t1:.3f} | {t4:.3f} | {seq / t4:.0f} | "
                         f"{t1 / t4:.2f} |")
    load = max(load_before[0], load_after[0])
    warning = (f"**Measured under a load average of {load:.1f} on {CORES} cores (other work on the machine): the SP=1 "
               f"times, and so the efficiencies, are not valid** (a {CORES}-thread step stalls whenever one of its "
               "threads is descheduled); the SP=4 columns, single-threaded ranks with the three layouts taking "
               "turns, still compare the layouts with each other. Rerun on an idle machine.\n"
               if load > 2 * CORES else "")
    write_section(HEADING, f"""
Machine: {machine()}. Command: `.venv/bin/python benchmarks/sp4_scaling.py --seq-lengths
{' '.join(map(str, args.seq_lengths))} --steps {args.steps}` ({time.perf_counter() - started:.0f} s). Load average before:
{', '.join(f'{x:.1f}' for x in load_before)}; after: {', '.join(f'{x:.1f}' for x in load_after)}.
{warning}
The SP=2 section's model and step (4-layer BERT, h=128, 4 heads, batch 1, fp32, whole training
step); SP=1: one process with {CORES} threads; SP=4: four processes over gloo with 1 thread each on
the same {CORES} cores (two ranks per core), as ring (1 x 4), ulysses (4 x 1) and hybrid (Ulysses
2 x ring 2), the three taking turns step by step in one set of ranks (same load for all). Median of
{args.steps} steps after a warm-up, slowest rank per step. On CPU every link is
shared memory, so this shows the cores' view (hybrid's all-to-all plus a 2-step ring against
ring's 4 steps and ulysses' all-to-all alone); which layout wins on GPUs is the communication
model's question (next section).

{chr(10).join(lines)}
""")


if __name__ == "__main__":
    run_benchmark(main)
