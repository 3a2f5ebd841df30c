"""The longest sequence one whole training step fits under a per-rank memory cap, on CPU.

The issue's definition: one training step (forward, backward, gradient sum over the seq group,
AdamW step; `attention_memory.train_step`) of the small model (4 layers, h=256, 4 heads, vocab
1000), batch 1, activation checkpointing on (DeepSpeed's, `engine.checkpoint_layers`), for each
variant at SP = 1, 2, 4 (real processes over gloo, one thread each). The cap holds for every
rank and counts all the step adds to its resident set from before the model is built:
parameters, gradients, both Adam moments (the position table grows with s and sits whole on
every rank), activations and gloo's buffers (`attention_memory.measure_peak`, with glibc's mmap
threshold fixed so freed tensors leave the resident set).

Search (`longest_fitting`): from two probe lengths, regula falsi on the measured peaks until a
length that fits and the one SEARCH_STEP above it, which does not, are both measured; nothing
is extrapolated.

    .venv/bin/python benchmarks/longest_sequence.py [--cap-mib 96] [--variants ring ulysses linformer bigbird]
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch
    import torch.distributed as dist

    from attention_memory import VARIANT_OPTIONS, bert_config, measure_peak, train_step
    from megatron.errors import ConfigError
    from megatron.model.bert import BertModel
    from megatron.parallel import state
    from megatron.parallel.spawn import run_on_ranks
    from results import BenchmarkParser, machine, positive, run_benchmark, save_plot, write_section

PLOT = Path(__file__).resolve().parent / "longest_sequence.png"
MODEL = dict(hidden=256, heads=4, layers=4)
VARIANTS = ("ring", "ulysses", "linformer", "bigbird", "modern")  # modern: attention_memory.MODERN
SIZES = (1, 2, 4)
SEARCH_STEP = 512  # resolution; a multiple of P * BigBird's block (64) for P <= 4, and of the head count


def _peak_all_ranks(variant: str, size: int, seq: int) -> tuple:
    """(peak MiB, seconds), each the max over ranks, of building the model and one training step."""
    config = bert_config(variant, seq, **MODEL)
    peak = measure_peak(lambda: train_step(config, size, checkpoint_activations=True), size, count_model=True)
    peak = torch.tensor(peak, dtype=torch.float64)
    if size > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return peak[0].item(), peak[1].item()


def longest_fitting(measure, probes: tuple, cap_mib: float, step: int = SEARCH_STEP) -> tuple:
    """(longest multiple of `step` with measure(s)[0] <= cap, {s: measure(s)} of every s tried).

    Regula falsi on the measured peaks (monotone and about linear in s): each new length is read
    off the line through the two measured points nearest the cap, until a length that fits and
    the one `step` above it, which does not, are both measured.
    """
    measured = {s: measure(s) for s in probes}
    while True:
        fits = sorted(s for s in measured if measured[s][0] <= cap_mib)
        over = sorted(s for s in measured if measured[s][0] > cap_mib)
        low, high = (fits[-1] if fits else None), (over[0] if over else None)
        if low is not None and high is not None and high - low <= step:
            return low, measured
        if low is None and high <= step:
            raise ConfigError(f"even s={high} needs {measured[high][0]:.0f} MiB, above the {cap_mib:g} MiB cap",
                              f"raise --cap-mib to {math.ceil(measured[high][0])} or more")
        if low is not None and high is not None:
            a, b = low, high
        else:  # extrapolate from the two longest that fit, or the two shortest that do not
            a, b = fits[-2:] if fits else over[:2]
        slope = (measured[b][0] - measured[a][0]) / (b - a)
        guess = a + (cap_mib - measured[a][0]) / slope if slope > 0 else 2 * b
        if high is None:  # at most double: a slope read off short lengths can be too flat
            guess = min(guess, 2 * b)
        guess = int(guess) // step * step
        lowest, highest = (low + step if low is not None else step), (high - step if high is not None else None)
        guess = max(lowest, guess if highest is None else min(guess, highest))
        measured[guess] = measure(guess)


def longest_under(variant: str, size: int, cap_mib: float, probes: tuple) -> dict:
    """The longest s (a multiple of SEARCH_STEP) whose training step stays within cap_mib on every rank."""
    if size > 1:
        state.initialize(sequence=size)
    _peak_all_ranks(variant, size, SEARCH_STEP * size)  # warm-up: thread pools, gloo connections, lazy imports
    try:
        seq, measured = longest_fitting(lambda s: _peak_all_ranks(variant, size, s), probes, cap_mib)
    except ConfigError as error:  # said by the caller in one line, not as this rank's traceback
        return {"refused": (error.problem, error.fix)}
    # the line through the points at s >= seq / 2: at short lengths the optimizer step, not
    # the activations, sets the peak
    line = [(s, peak) for s, (peak, _) in measured.items() if s >= seq // 2]
    slope, intercept = torch.linalg.lstsq(torch.tensor([[s, 1.0] for s, _ in line], dtype=torch.float64),
                                          torch.tensor([[peak] for _, peak in line], dtype=torch.float64)).solution[:, 0]
    return {"seq": seq, "peak": measured[seq][0], "seconds": measured[seq][1],
            "next_peak": measured[seq + SEARCH_STEP][0], "slope_kib_per_token": slope.item() * 1024,
            "intercept_mib": intercept.item(), "points": sorted((s, peak) for s, (peak, _) in measured.items())}


def search(variants: list, cap_mib: float) -> dict:
    """{(variant, size): longest_under result}."""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)  # inherited by the spawned ranks
    found = {}
    for variant in variants:
        for size in SIZES:
            probes = (1024 * size, 2048 * size)
            found[variant, size] = run_on_ranks(longest_under, size, variant, size, cap_mib, probes, timeout=3600)[0]
            if "refused" in found[variant, size]:
                problem, fix = found[variant, size]["refused"]
                raise ConfigError(f"{variant} at SP={size}: {problem}", fix)
            print("longest", variant, size, {k: v for k, v in found[variant, size].items() if k != "points"},
                  flush=True)
    return found


def table(found: dict, variants: list) -> str:
    lines = ["| variant | SP | longest s | gain vs SP=1 | peak MiB at s | peak MiB at s + 512 | step s at s | "
             "MiB per 1K tokens | fixed MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for variant in variants:
        for size in SIZES:
            row = found[variant, size]
            lines.append(f"| {variant} | {size} | {row['seq']} | {row['seq'] / found[variant, 1]['seq']:.2f}x | "
                         f"{row['peak']:.0f} | {row['next_peak']:.0f} | {row['seconds']:.1f} | "
                         f"{row['slope_kib_per_token']:.1f} | {row['intercept_mib']:.0f} |")
    return "\n".join(lines)


def plot(found: dict, variants: list, cap_mib: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem_ax, len_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {1: "-", 2: "--", 4: ":"}
    for index, variant in enumerate(variants):
        for size in SIZES:
            seqs, peaks = zip(*found[variant, size]["points"])
            mem_ax.plot(seqs, peaks, styles[size], marker="o", color=f"C{index}", label=f"{variant} SP={size}")
        width = 0.8 / len(variants)
        len_ax.bar([i + (index - (len(variants) - 1) / 2) * width for i in range(len(SIZES))],
                   [found[variant, size]["seq"] for size in SIZES], width=width, color=f"C{index}", label=variant)
    mem_ax.axhline(cap_mib, color="red", lw=0.8, label=f"cap {cap_mib:g} MiB")
    mem_ax.set_xscale("log", base=2)
    mem_ax.set_xlabel("sequence length")
    mem_ax.set_ylabel("peak memory per rank (MiB, max over ranks)")
    mem_ax.grid(True, which="both", alpha=0.3)
    mem_ax.legend(fontsize=7, ncol=2)
    len_ax.set_xticks(range(len(SIZES)), [f"SP={size}" for size in SIZES])
    len_ax.set_ylabel(f"longest s under {cap_mib:g} MiB per rank")
    len_ax.legend(fontsize=8)
    fig.suptitle("One training step (fwd, bwd, AdamW), 4 layers h=256, batch 1, activation checkpointing, fp32, CPU")
    fig.tight_layout()
    save_plot(fig, PLOT)


def write_modern_section(found: dict, cap_mib: float, seconds: float) -> None:
    gains = f"{found['modern', 2]['seq'] / found['modern', 1]['seq']:.2f}x / {found['modern', 4]['seq'] / found['modern', 1]['seq']:.2f}x"
    write_section("Longest sequence under a memory cap: modern encoder layers (CPU)", f"""
Machine: {machine()}. Command: `.venv/bin/python benchmarks/longest_sequence.py --variants modern --cap-mib
{cap_mib:g}` ({seconds:.0f} s). The step and cap of the section above, with ModernBERT's layers
(attention_memory.MODERN: rope, local window 128 with a global ring layer every third, GeGLU, no
biases, pre-LN): no position table, so nothing of size s is replicated on every rank; local layers
exchange a halo of 64 tokens with each neighbour. Plain AdamW (no ZeRO): parameters, gradients
and moments stay replicated, the floor that bounds the gain at SP = 4.

{table(found, ["modern"])}

P-fold gain (SP=2 / SP=4 over SP=1; ideal 2x / 4x): {gains}.
""")


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cap-mib", type=positive(float), default=96.0, help="per-rank memory cap")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args(argv)
    floor, variant = max((optimizer_floor_mib(variant), variant) for variant in args.variants)
    if args.cap_mib < floor:
        parser.error(f"--cap-mib {args.cap_mib:g} is below the {floor:.0f} MiB that the parameters, gradients and "
                     f"AdamW moments of {variant}'s model take at s={SEARCH_STEP} (16 bytes a parameter), before any "
                     f"activation; give a --cap-mib of {math.ceil(floor)} or more")
    return args


def optimizer_floor_mib(variant: str) -> float:
    """What every rank holds at the optimizer step, whatever the length: parameters, gradients and both AdamW
    moments (replicated, 4 x 4 bytes a parameter) of the model at the shortest length the search measures. A cap
    below it was found after a rank measured for a while, as a nested traceback."""
    model = BertModel(bert_config(variant, SEARCH_STEP, **MODEL))
    return 16 * sum(parameter.numel() for parameter in model.parameters()) / 2**20


def main():
    args = parse_args()
    started = time.perf_counter()
    found = search(args.variants, args.cap_mib)
    if args.variants == ["modern"]:  # its own section beside the classic variants'
        write_modern_section(found, args.cap_mib, time.perf_counter() - started)
        return
    plot(found, args.variants, args.cap_mib)
    options = "; ".join(f"{variant}: " + ", ".join(f"{k}={v}" for k, v in opts.items())
                        for variant, opts in VARIANT_OPTIONS.items() if variant in args.variants)
    gains = ", ".join(f"{variant} {found[variant, 2]['seq'] / found[variant, 1]['seq']:.2f}x / "
                      f"{found[variant, 4]['seq'] / found[variant, 1]['seq']:.2f}x" for variant in args.variants)
    model = BertModel(bert_config("ring", SEARCH_STEP, **MODEL))
    fixed_mib = 16 * (sum(p.numel() for p in model.parameters())
                      - model.embeddings.position_embeddings.weight.numel()) / 2**20
    write_section("Longest sequence under a memory cap (CPU)", f"""
Machine: {machine()}; measured on CPU, no GPU lent (the BERT-base on one GPU figure is open).
Command: `.venv/bin/python benchmarks/longest_sequence.py --cap-mib {args.cap_mib:g}`
({time.perf_counter() - started:.0f} s). Variant settings: {options}.

One whole training step (forward, backward, gradient sum over the seq group, AdamW) of a
4-layer BERT, h=256, 4 heads, vocab 1000, batch 1, fp32, activation checkpointing on (every
layer, DeepSpeed's), no padding; SP ranks are processes over gloo with 1 thread each. The cap
is **{args.cap_mib:g} MiB per rank** and counts everything the step adds to a rank's resident set from
before the model is built: parameters, gradients, Adam moments, activations, gloo buffers.
`longest s` fits and `s + {SEARCH_STEP}` does not, both measured (module docstring); the last
two columns are the least-squares line through the lengths measured at s/2 and above.

{table(found, args.variants)}

P-fold gain (SP=2 / SP=4 over SP=1; ideal 2x / 4x): {gains}.

Reading it: a rank's peak is the larger of two phases. In backward, the checkpointed layer
inputs plus one layer's recompute and gradients, all O(s/P). At the optimizer step (plain AdamW
here, every state replicated): parameters, gradients and both Adam moments, 4 x 4 bytes per
parameter ({fixed_mib:.0f} MiB for this model without its position table), plus the learned position table, whose s x h
rows sit whole on every rank (4 KiB per token with gradient and moments). At SP=1 the backward
phase sets the peak; as P grows its share shrinks by P until the replicated optimizer phase takes
over, which is what keeps ring and Ulysses below 4x at SP=4 (see the rising `fixed MiB`). The
engine's ZeRO (stage >= 1 shards the moments over data x seq) lowers that floor. Linformer gains
nothing: its projection E (k x s per layer, with gradient and moments: 16 KiB per token over 4
layers) is replicated too, and is most of its memory. BigBird's per-token activations are the
largest (each query block gathers window, global and random key blocks), so sharding them pays
most. No variant keeps an s x s/P score matrix (ring and Ulysses run SDPA's flash
kernel and recompute from the saved log-sum-exp), so linformer and bigbird are not longer than
ring here; their gain is compute, linear in s.

![longest sequence](longest_sequence.png)
""")


if __name__ == "__main__":
    run_benchmark(main)
