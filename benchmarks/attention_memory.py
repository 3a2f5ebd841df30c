"""Peak memory and time of one attention forward+backward vs sequence length, on CPU.

Variants: `ring` at SP = 1, 2, 4 (real processes over gloo, one thread each), and two SP=1
baselines: `dense` (torch SDPA, whose CPU flash kernel is itself O(s) in memory) and `naive`
(softmax(QK^T + mask)V materialised, the [s, s] score matrix a ring without recompute keeps).

Memory: each rank runs with glibc's mmap threshold fixed at 64 KiB, so every tensor buffer is
mmap-ed and returned to the OS when freed and the resident set tracks live tensors. Before a
measured step the peak-RSS counter is reset (/proc/self/clear_refs = 5); the figure is
VmHWM - VmRSS(before): the step's own peak, max over ranks. Includes gloo's receive buffers.

    .venv/bin/python benchmarks/attention_memory.py [--seq-lengths 1024 2048 ...]
"""
import argparse
import os
import time
from pathlib import Path

import torch

from megatron.model.attention.dense import sdpa
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from results import machine, write_section

HEADS, HEAD_DIM = 4, 32
NAIVE_MAX_SEQ = 8192  # the naive baseline needs ~3 x 4 * heads * s^2 bytes
PLOT = Path(__file__).resolve().parent / "attention_memory.png"


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def naive(q, k, v, key_padding_mask):
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)


def measure(variant: str, size: int, seq_lengths: list) -> list:
    """(seq_length, peak MiB, seconds) of one fwd+bwd on this rank's chunk, per length."""
    from megatron.model import attention
    from megatron.model.bert import BertConfig

    if size > 1:
        state.initialize(sequence=size)
    rank = state.get_sequence_parallel_rank()
    rows = []
    for i, seq in enumerate([seq_lengths[0]] + list(seq_lengths)):  # the first run is a warm-up
        if variant in ("dense", "naive"):
            core = sdpa if variant == "dense" else naive
        else:
            core = attention.build(BertConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                              seq_length=seq, max_position_embeddings=seq, num_layers=1,
                                              attention=variant, attention_dropout=0.0))
        chunk = seq // size
        g = torch.Generator().manual_seed(rank)
        q, k, v = (torch.randn(1, chunk, HEADS, HEAD_DIM, generator=g, requires_grad=True) for _ in range(3))
        mask = torch.zeros(1, chunk, dtype=torch.bool)
        if size > 1:
            torch.distributed.barrier()
        open("/proc/self/clear_refs", "w").write("5")
        before = _status_kib("VmRSS")
        start = time.perf_counter()
        core(q, k, v, mask).sum().backward()
        seconds = time.perf_counter() - start
        if i > 0:
            rows.append((seq, (_status_kib("VmHWM") - before) / 1024, seconds))
        del q, k, v
    return rows


def run(seq_lengths: list) -> dict:
    """{label: [(seq, peak MiB max over ranks, seconds max over ranks)]}"""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)  # inherited by the spawned ranks
    plan = [("ring", 1), ("ring", 2), ("ring", 4), ("dense", 1), ("naive", 1)]
    results = {}
    for variant, size in plan:
        lengths = [s for s in seq_lengths if variant != "naive" or s <= NAIVE_MAX_SEQ]
        per_rank = run_on_ranks(measure, size, variant, size, lengths, timeout=3600)
        label = f"{variant} SP={size}"
        results[label] = [(rows[0][0], max(r[1] for r in rows), max(r[2] for r in rows))
                          for rows in zip(*per_rank)]
        print(label, results[label], flush=True)
    return results


def report(results: dict, seq_lengths: list) -> str:
    labels = list(results)
    head = "| seq | " + " | ".join(f"{label} MiB" for label in labels) + " | " + \
        " | ".join(f"{label} s" for label in labels) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(labels))]
    for seq in seq_lengths:
        cells = {label: dict((row[0], row) for row in rows).get(seq) for label, rows in results.items()}
        mem = [f"{cells[label][1]:.1f}" if cells[label] else "-" for label in labels]
        sec = [f"{cells[label][2]:.3f}" if cells[label] else "-" for label in labels]
        lines.append(f"| {seq} | " + " | ".join(mem) + " | " + " | ".join(sec) + " |")
    ring = {size: dict((r[0], r[1]) for r in results[f"ring SP={size}"]) for size in (1, 2, 4)}
    top = seq_lengths[-1]
    growth = ring[1][top] / ring[1][seq_lengths[-2]]
    return "\n".join(lines) + (
        f"\n\nAt s={top}: ring SP=1/SP=2 peak ratio {ring[1][top] / ring[2][top]:.2f}, "
        f"SP=1/SP=4 {ring[1][top] / ring[4][top]:.2f} (ideal 2 and 4); ring SP=1 peak grows "
        f"{growth:.2f}x from s={seq_lengths[-2]} to s={top} (linear: {top / seq_lengths[-2]:.1f}x).")


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, rows in results.items():
        seqs = [r[0] for r in rows]
        mem_ax.plot(seqs, [r[1] for r in rows], marker="o", label=label)
        time_ax.plot(seqs, [r[2] for r in rows], marker="o", label=label)
    for ax, ylabel in ((mem_ax, "peak memory per rank (MiB)"), (time_ax, "fwd+bwd time (s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    mem_ax.legend()
    fig.suptitle(f"One attention fwd+bwd, batch 1, {HEADS} heads x {HEAD_DIM}, fp32, CPU")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    args = parser.parse_args()
    results = run(args.seq_lengths)
    plot(results)
    write_section("Attention memory (ring vs dense)", f"""
Machine: {machine()}. Command: `.venv/bin/python benchmarks/attention_memory.py`.
One forward+backward of the attention core alone, batch 1, {HEADS} heads x {HEAD_DIM}, fp32,
no padding; each SP rank is a process with one thread. Memory is the step's peak resident-set
growth (max over ranks) with glibc's mmap threshold fixed so freed tensors leave the resident
set; see the module docstring. `dense` is torch SDPA (its CPU flash kernel keeps no s x s
matrix either); `naive` materialises softmax(QK^T)V, the s x s/P score matrix a ring without
recompute would keep. Times on {len(os.sched_getaffinity(0))} cores are shared by all ranks.

{report(results, args.seq_lengths)}

![attention memory](attention_memory.png)
""")


if __name__ == "__main__":
    main()
