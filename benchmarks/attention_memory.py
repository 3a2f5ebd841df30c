"""Peak memory and time of one forward+backward vs sequence length, on CPU.

Two kinds of step: the attention core alone, and a 4-layer BERT with its loss (where the
saved activations of all layers add up). Variants: `ring` at SP = 1, 2, 4 (real processes over
gloo, one thread each) and SP=1 baselines: `dense` (torch SDPA, whose CPU flash kernel is
itself O(s) in memory) and, for the core, `naive` (softmax(QK^T + mask)V materialised, the
[s, s] score matrix a ring without recompute keeps).

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

from megatron.data.batch import BertBatch
from megatron.model import attention
from megatron.model.attention.dense import sdpa
from megatron.model.bert import BertConfig, BertModel
from megatron.model.loss import bert_batch_loss
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


def attention_step(variant: str, size: int, seq: int):
    """One fwd+bwd of the attention core alone on this rank's [1, s/P, heads, d] chunk."""
    if variant in ("dense", "naive"):
        core = sdpa if variant == "dense" else naive
    else:
        core = attention.build(BertConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, seq_length=seq,
                                          max_position_embeddings=seq, num_layers=1, attention=variant,
                                          attention_dropout=0.0))
    g = torch.Generator().manual_seed(state.get_sequence_parallel_rank())
    q, k, v = (torch.randn(1, seq // size, HEADS, HEAD_DIM, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.zeros(1, seq // size, dtype=torch.bool)
    return lambda: core(q, k, v, mask).sum().backward()


def bert_step(variant: str, size: int, seq: int):
    """One fwd+bwd of a 4-layer BERT (h = heads x d) with MLM + SOP loss on this rank's chunk."""
    config = BertConfig(vocab_size=1000, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_layers=4,
                        seq_length=seq, max_position_embeddings=seq, attention=variant,
                        attention_dropout=0.0, hidden_dropout=0.0)
    model = BertModel(config)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 1000, (1, seq), generator=g)
    batch = BertBatch(tokens, torch.zeros_like(tokens), torch.zeros_like(tokens, dtype=torch.bool), tokens,
                      torch.rand(1, seq, generator=g) < 0.15, torch.zeros(1, dtype=torch.long))
    chunk = batch.sequence_chunk(state.get_sequence_parallel_rank(), size)

    def step():
        mlm_logits, sop_logits = model(*chunk.model_inputs())
        bert_batch_loss(mlm_logits, sop_logits, chunk).total.backward()
    return step


STEPS = {"attention": attention_step, "bert": bert_step}


def measure(kind: str, variant: str, size: int, seq_lengths: list) -> list:
    """(seq_length, peak MiB, seconds) of one fwd+bwd on this rank, per length."""
    if size > 1:
        state.initialize(sequence=size)
    rows = []
    for i, seq in enumerate([seq_lengths[0]] + list(seq_lengths)):  # the first run is a warm-up
        step = STEPS[kind](variant, size, seq)
        if size > 1:
            torch.distributed.barrier()
        open("/proc/self/clear_refs", "w").write("5")
        before = _status_kib("VmRSS")
        start = time.perf_counter()
        step()
        seconds = time.perf_counter() - start
        if i > 0:
            rows.append((seq, (_status_kib("VmHWM") - before) / 1024, seconds))
        del step
    return rows


PLANS = {  # kind -> (variant, SP size) runs; the SP=1 dense/naive ones are the baselines
    "attention": [("ring", 1), ("ring", 2), ("ring", 4), ("dense", 1), ("naive", 1)],
    "bert": [("ring", 1), ("ring", 2), ("ring", 4), ("dense", 1)],
}
TITLES = {
    "attention": f"attention core alone, batch 1, {HEADS} heads x {HEAD_DIM}",
    "bert": f"4-layer BERT (h={HEADS * HEAD_DIM}) with MLM+SOP loss, batch 1",
}


def run(kind: str, seq_lengths: list) -> dict:
    """{label: [(seq, peak MiB max over ranks, seconds max over ranks)]}"""
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)  # inherited by the spawned ranks
    results = {}
    for variant, size in PLANS[kind]:
        lengths = [s for s in seq_lengths if variant != "naive" or s <= NAIVE_MAX_SEQ]
        per_rank = run_on_ranks(measure, size, kind, variant, size, lengths, timeout=3600)
        label = f"{variant} SP={size}"
        results[label] = [(rows[0][0], max(r[1] for r in rows), max(r[2] for r in rows))
                          for rows in zip(*per_rank)]
        print(kind, label, results[label], flush=True)
    return results


def report(results: dict, seq_lengths: list) -> str:
    labels = list(results)
    head = "| seq | " + " | ".join(f"{label} MiB" for label in labels) + " | " + \
        " | ".join(f"{label} s" for label in labels) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(labels))]
    for seq in seq_lengths:
        cells = {label: dict((row[0], row) for row in rows).get(seq) for label, rows in results.items()}
        mem = [f"{cells[label][1]:.1f}" if cells[label] else "-" for label in labels]
        sec = [f"{cells[label][2]:.2f}" if cells[label] else "-" for label in labels]
        lines.append(f"| {seq} | " + " | ".join(mem) + " | " + " | ".join(sec) + " |")
    ring = {size: dict((r[0], r[1]) for r in results[f"ring SP={size}"]) for size in (1, 2, 4)}
    top, below = seq_lengths[-1], seq_lengths[-2]
    return "\n".join(lines) + (
        f"\n\nAt s={top}: ring peak SP=1/SP=2 = {ring[1][top] / ring[2][top]:.2f}, "
        f"SP=1/SP=4 = {ring[1][top] / ring[4][top]:.2f} (ideal 2 and 4); ring SP=1 peak grows "
        f"{ring[1][top] / ring[1][below]:.2f}x from s={below} to s={top} (linear: {top / below:.1f}x).")


def plot(all_results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(all_results), 2, figsize=(11, 4 * len(all_results)), squeeze=False)
    for (kind, results), (mem_ax, time_ax) in zip(all_results.items(), axes):
        for label, rows in results.items():
            seqs = [r[0] for r in rows]
            mem_ax.plot(seqs, [r[1] for r in rows], marker="o", label=label)
            time_ax.plot(seqs, [r[2] for r in rows], marker="o", label=label)
        for ax, ylabel in ((mem_ax, "peak memory per rank (MiB)"), (time_ax, "fwd+bwd time (s)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel(ylabel)
            ax.set_title(TITLES[kind], fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
        mem_ax.legend(fontsize=8)
    fig.suptitle("One forward+backward, fp32, CPU (SP ranks: processes over gloo, 1 thread each)")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--bert-seq-lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    args = parser.parse_args()
    lengths = {"attention": args.seq_lengths, "bert": args.bert_seq_lengths}
    all_results = {kind: run(kind, lengths[kind]) for kind in PLANS}
    plot(all_results)
    tables = "\n\n".join(f"**{TITLES[kind]}**\n\n{report(results, lengths[kind])}"
                          for kind, results in all_results.items())
    write_section("Attention memory (ring vs dense)", f"""
Machine: {machine()}. Command: `.venv/bin/python benchmarks/attention_memory.py`.
fp32, no padding; each SP rank is a process with one thread (times on
{len(os.sched_getaffinity(0))} cores are shared by all ranks, so they are not a speed result).
Memory is the step's peak resident-set growth, max over ranks, with glibc's mmap threshold
fixed so freed tensors leave the resident set (module docstring); inputs and parameters
created before the step are not counted. `dense` is torch SDPA, whose CPU flash kernel keeps
no s x s matrix either; `naive` materialises softmax(QK^T)V, i.e. the s x s/P score matrix a
ring without recompute keeps.

{tables}

![attention memory](attention_memory.png)
""")


if __name__ == "__main__":
    main()
