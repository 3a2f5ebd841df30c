"""Peak memory and time of one forward+backward vs sequence length, on CPU.

Two kinds of step: the attention core alone, and a 4-layer BERT with its loss (where the
saved activations of all layers add up). Variants: `ring`, `linformer` and `bigbird` at
SP = 1, 2, 4 (real processes over gloo, one thread each) and SP=1 baselines: `dense` (torch
SDPA, whose CPU flash kernel is itself O(s) in memory) and, for the core, `naive`
(softmax(QK^T + mask)V materialised, the [s, s] score matrix a ring without recompute keeps).
Linformer and BigBird run with VARIANT_OPTIONS.

The longest sequence under a memory cap is `longest_sequence.py`, which reuses the memory
measurement here (`measure_peak`) and the model and step builders.

Memory: each rank runs with glibc's mmap threshold fixed at 64 KiB, so every tensor buffer is
mmap-ed and returned to the OS when freed and the resident set tracks live tensors. Before a
measured step the peak-RSS counter is reset (/proc/self/clear_refs = 5); the figure is
VmHWM - VmRSS(before): the step's own peak, max over ranks. Includes gloo's receive buffers.

    .venv/bin/python benchmarks/attention_memory.py [--seq-lengths 1024 2048 ...]
"""
import argparse
import gc
import itertools
import os
import sys
import time
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError, start_up_stops_in_one_line
from megatron.quiet import quiet_deepspeed

# Before DeepSpeed's first import (megatron.engine's, below): no accelerator warning on stdout ahead of
# argparse's one line or --help. Every benchmark that loads DeepSpeed imports this module before megatron's.
with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    quiet_deepspeed()
    import torch
    import torch.distributed as dist

    from megatron.data.batch import BertBatch
    from megatron.engine import checkpoint_layers
    from megatron.model import attention
    from megatron.model.attention import rules
    from megatron.model.bert import BertConfig, BertModel
    from megatron.model.loss import bert_batch_loss
    from megatron.parallel import state
    from megatron.parallel.grads import allreduce_sequence_parallel_grads
    from megatron.parallel.reduce import sum_over_sequence
    from megatron.parallel.spawn import run_on_ranks
    from results import BenchmarkParser, machine, positive, run_benchmark, save_plot, write_section

HEADS, HEAD_DIM = 4, 32
NAIVE_MAX_SEQ = 8192  # the naive baseline needs ~3 x 4 * heads * s^2 bytes
PLOT = Path(__file__).resolve().parent / "attention_memory.png"
VARIANT_OPTIONS = {  # Linformer: E = F, one per layer for all heads ("headwise + key-value sharing")
    "linformer": dict(linformer_k=256, linformer_share_heads=True, linformer_share_kv=True),
    "bigbird": dict(bigbird_block_size=64, bigbird_num_window_blocks=3, bigbird_num_random_blocks=2),
}
LENGTHS_HELP = ("lengths every variant accepts with VARIANT_OPTIONS (Linformer k=256; BigBird at least 7 blocks "
                "of 64, a multiple of 64 x SP): others are refused, naming the nearest that fits")


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
    if variant == "naive":
        core = naive
    else:
        core = attention.build(BertConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, seq_length=seq,
                                          max_position_embeddings=seq, num_layers=1, attention=variant,
                                          attention_dropout=0.0, **VARIANT_OPTIONS.get(variant, {})))
    g = torch.Generator().manual_seed(state.get_sequence_parallel_rank())
    q, k, v = (torch.randn(1, seq // size, HEADS, HEAD_DIM, generator=g, requires_grad=True) for _ in range(3))
    segment_ids = torch.ones(1, seq // size, dtype=torch.long)  # one unpadded segment
    mask = segment_ids if variant != "naive" else segment_ids == 0
    return lambda: core(q, k, v, mask).sum().backward()


# "modern": ModernBERT's layers (rope, local window 128 with a global ring layer every third, GeGLU,
# no biases, pre-LN) on the ring for the global layers
MODERN = dict(position_embedding_type="rope", rotary_base=160000.0, local_attention_window=128,
              global_attention_every=3, mlp_type="geglu", add_bias_linear=False, layernorm_layout="pre",
              first_layer_attention_norm=False, type_vocab_size=0)


def bert_config(variant: str, seq: int, hidden: int = HEADS * HEAD_DIM, heads: int = HEADS, layers: int = 4,
                vocab: int = 1000) -> BertConfig:
    """A small BERT without dropout (ring refuses attention dropout) and VARIANT_OPTIONS ("modern":
    MODERN's layers, ring global layers)."""
    options = MODERN if variant == "modern" else VARIANT_OPTIONS.get(variant, {})
    return BertConfig(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads, num_layers=layers,
                      seq_length=seq, max_position_embeddings=seq, attention="ring" if variant == "modern" else variant,
                      attention_dropout=0.0, hidden_dropout=0.0, **options)


def length_problem(seq: int, runs) -> str | None:
    """Why one of `runs` ((variant, SP size)) cannot be built at `seq` with its fixed settings
    (VARIANT_OPTIONS: Linformer's k, BigBird's blocks), or None when all can."""
    for variant, size in runs:
        if variant not in rules.RULES:  # naive: the materialised baseline builds at any length
            continue
        try:
            rules.check(bert_config(variant, seq), size)
        except ConfigError as error:
            return f"{variant} at SP={size}: {error.problem}"
    return None


def check_lengths(parser: argparse.ArgumentParser, flag: str, seq_lengths: list, runs, fix: str = "") -> None:
    """Refuses, before anything is measured, a length that a run cannot be built at. A refusal and
    not a skip: the benchmark is the comparison of its variants at the same lengths with the same
    settings, and shrinking Linformer's k to fit would measure another model."""
    for seq in seq_lengths:
        problem = length_problem(seq, runs)
        if problem:
            nearest = next(s for s in itertools.count(seq) if not length_problem(s, runs))
            parser.error(f"{flag} {seq} does not suit {problem}; give lengths every variant accepts "
                         f"(the nearest is {nearest}){fix}")


def random_chunk(config: BertConfig, size: int, batch: int = 1, seed: int = 0) -> BertBatch:
    """This seq rank's chunk of a random batch (15% of tokens predicted), the same batch on every rank."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, config.seq_length)
    tokens = torch.randint(5, config.vocab_size, shape, generator=g)
    full = BertBatch.unpacked(tokens, torch.zeros_like(tokens), torch.zeros_like(tokens, dtype=torch.bool), tokens,
                              torch.rand(*shape, generator=g) < 0.15, torch.zeros(batch, dtype=torch.long))
    return full.sequence_chunk(state.get_sequence_parallel_rank(), size)


def bert_step(variant: str, size: int, seq: int):
    """One fwd+bwd of a 4-layer BERT (h = heads x d) with MLM + SOP loss on this rank's chunk."""
    config = bert_config(variant, seq)
    model = BertModel(config)
    chunk = random_chunk(config, size)

    def step():
        mlm_logits, sop_logits = model(*chunk.model_inputs())
        bert_batch_loss(mlm_logits, sop_logits, chunk, sum_over_sequence).total.backward()
    return step


def train_step(config: BertConfig, size: int, checkpoint_activations: bool = False):
    """One whole training step as the engine runs it: fwd, bwd, gradients SUMMED over the seq
    group (megatron/parallel/grads.py), AdamW step. The model and optimizer live in the closure."""
    model = BertModel(config)
    if checkpoint_activations:
        checkpoint_layers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    chunk = random_chunk(config, size)

    def step():
        optimizer.zero_grad()
        mlm_logits, sop_logits = model(*chunk.model_inputs())
        bert_batch_loss(mlm_logits, sop_logits, chunk, sum_over_sequence).total.backward()
        allreduce_sequence_parallel_grads(model.parameters())
        optimizer.step()
    return step


STEPS = {"attention": attention_step, "bert": bert_step}


def measure_peak(build_step, size: int, count_model: bool = False) -> tuple:
    """(peak MiB, seconds) of one `build_step()()` on this rank; with count_model, building the
    step (model parameters, optimizer) counts too."""
    # a previous step's model can sit in reference cycles (checkpoint_layers binds each layer's
    # forward to itself); freed by the cycle collector mid-step, it would hide part of this peak
    gc.collect()
    if count_model:
        open("/proc/self/clear_refs", "w").write("5")
        before = _status_kib("VmRSS")
    step = build_step()
    if size > 1:
        dist.barrier()
    if not count_model:
        open("/proc/self/clear_refs", "w").write("5")
        before = _status_kib("VmRSS")
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = (_status_kib("VmHWM") - before) / 1024
    del step
    return peak, seconds


def _peak(kind: str, variant: str, size: int, seq: int) -> tuple:
    return measure_peak(lambda: STEPS[kind](variant, size, seq), size)


def measure(kind: str, variant: str, size: int, seq_lengths: list) -> list:
    """(seq_length, peak MiB, seconds) of one fwd+bwd on this rank, per length."""
    if size > 1:
        state.initialize(sequence=size)
    _peak(kind, variant, size, seq_lengths[0])  # warm-up
    return [(seq, *_peak(kind, variant, size, seq)) for seq in seq_lengths]


SP_VARIANTS = [(variant, size) for variant in ("ring", "linformer", "bigbird") for size in (1, 2, 4)]
PLANS = {  # kind -> (variant, SP size) runs; the SP=1 dense/naive ones are the baselines
    "attention": SP_VARIANTS + [("dense", 1), ("naive", 1)],
    "bert": SP_VARIANTS + [("dense", 1)],
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
    top = seq_lengths[-1]
    notes = []
    for variant in ("ring", "linformer", "bigbird"):
        peak = {size: dict((r[0], r[1]) for r in results[f"{variant} SP={size}"]) for size in (1, 2, 4)}
        seconds = {size: dict((r[0], r[2]) for r in results[f"{variant} SP={size}"]) for size in (1, 2, 4)}
        note = (f"{variant}: at s={top} peak SP=1/SP=2 = {peak[1][top] / peak[2][top]:.2f}, SP=1/SP=4 = "
                f"{peak[1][top] / peak[4][top]:.2f} (ideal 2 and 4)")
        if len(seq_lengths) > 1:  # growth needs a second length
            below = seq_lengths[-2]
            note += (f"; SP=1 peak grows {peak[1][top] / peak[1][below]:.2f}x and time "
                     f"{seconds[1][top] / seconds[1][below]:.2f}x from s={below} to s={top} "
                     f"(linear: {top / below:.1f}x)")
        notes.append(note + ".")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {note}" for note in notes)


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
        mem_ax.legend(fontsize=7, ncol=2)
    fig.suptitle("One forward+backward, fp32, CPU (SP ranks: processes over gloo, 1 thread each)")
    fig.tight_layout()
    save_plot(fig, PLOT)


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lengths", type=positive(int), nargs="+", default=[1024, 2048, 4096, 8192, 16384],
                        help=LENGTHS_HELP)
    parser.add_argument("--bert-seq-lengths", type=positive(int), nargs="+", default=[2048, 4096, 8192, 16384],
                        help=LENGTHS_HELP)
    args = parser.parse_args(argv)
    check_lengths(parser, "--seq-lengths", args.seq_lengths, PLANS["attention"])
    check_lengths(parser, "--bert-seq-lengths", args.bert_seq_lengths, PLANS["bert"])
    return args


def main():
    args = parse_args()
    lengths = {"attention": args.seq_lengths, "bert": args.bert_seq_lengths}
    all_results = {kind: run(kind, lengths[kind]) for kind in PLANS}
    plot(all_results)
    tables = "\n\n".join(f"**{TITLES[kind]}**\n\n{report(results, lengths[kind])}"
                          for kind, results in all_results.items())
    options = "; ".join(f"{variant}: " + ", ".join(f"{k}={v}" for k, v in opts.items())
                        for variant, opts in VARIANT_OPTIONS.items())
    write_section("Attention memory (ring vs dense)", f"""
Machine: {machine()}. Command: `.venv/bin/python benchmarks/attention_memory.py --seq-lengths
{' '.join(map(str, args.seq_lengths))} --bert-seq-lengths {' '.join(map(str, args.bert_seq_lengths))}`.
Variant settings: {options}.
fp32, no padding; each SP rank is a process with one thread (times on
{len(os.sched_getaffinity(0))} cores are shared by all ranks, so they are not a speed result).
Memory is the step's peak resident-set growth, max over ranks, with glibc's mmap threshold
fixed so freed tensors leave the resident set (module docstring); inputs and parameters
created before the step are not counted. `dense` is torch SDPA, whose CPU flash kernel keeps
no s x s matrix either; `naive` materialises softmax(QK^T)V, i.e. the s x s/P score matrix a
ring without recompute keeps.

{tables}

Reading the core-alone table: its inputs (q, k, v of the rank's chunk) are made before the step
and not counted, while the ring's own buffers are: the chunk of K, V it received, the next one in
flight and, in backward, the travelling dK, dV, plus gloo's send/receive copies. Those scale
with s/P but are several chunk-sized tensors, so at SP=2 the ring core's growth exceeds the
single-rank core's, whose step only adds its output and gradients. What a rank must hold for a
whole step is the BERT table: there, ring, Ulysses and Linformer memory falls about P-fold.

The longest sequence a whole training step fits under a per-rank cap: `longest_sequence.py`.

![attention memory](attention_memory.png)
""")


if __name__ == "__main__":
    run_benchmark(main)
