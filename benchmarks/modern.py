"""Modern encoder layers (issue 22 item 4): our ModernBERT-shaped model against Hugging Face's
ModernBertForMaskedLM, no hidden quadratic work, and the local layers' halo traffic. On CPU the
model is the preset shrunk to SHAPE, in fp32; on a GPU (benchmarks/gpu_check.sh) it is
ModernBERT-base's own shape in bf16 autocast, and the section and plot are the "(cuda)" ones.

(a) Full training steps (forward, backward, AdamW) in one process, alternated (A B B A ...), the
    same weights (fp32 and the same thread count on CPU, bf16 autocast on a GPU), one sample of one
    segment per step (no padding):
    * `ours`: BertModel with the modernbert-base preset's layer options (rope 160000 / 10000,
      local window 128 with a global layer every 3rd, GeGLU, no biases, pre-LN, no attention norm
      in layer 0, no token types, ModernBERT's MLM head) at SHAPE's sizes; global layers dense at
      SP = 1; the local layers run the banded halo core (attention/local.py): O(s x W); MLM logits
      at the masked positions only;
    * `hf`: transformers.ModernBertForMaskedLM, attn_implementation="sdpa", as a user runs it
      (sparse_prediction off: MLM logits at every position); its local layers are full s x s
      attention under an s x s window mask (SDPA with a boolean mask: the CPU's flash kernel, a
      GPU's memory-efficient one);
    * `hf-sparse`: the same with sparse_prediction=True (logits at the masked positions, as ours):
      what is left is the layers' difference.
    HF's step time grows with s^2; a length whose estimated HF step (fitted on the shorter lengths)
    exceeds --max-step-seconds is not run for HF, and the table says so with the estimate.
(b) No hidden quadratic work: our model FLOP rate (megatron/flops.py, local layers counted as
    O(s x W)) at each length over the rate at the shortest; and one local layer alone (the local
    core's forward + backward, attention/local.LocalAttention at SP = 1, plan made once per
    micro-batch as in the model) per token at each length over its cost at the shortest, next to
    the same window as a masked s x s SDPA call (HF's way).
(c) Bytes one rank sends per local layer at SP = P (P virtual ranks in one process,
    attention/simulate.py: every point-to-point batch is logged), against the model.

    .venv/bin/python benchmarks/modern.py                      # the CPU set (make bench-modern)
    .venv/bin/python benchmarks/modern.py --seq-lengths 512 1024 --repeats 1
"""
import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch
    import torch.nn.functional as F

    from launches import launches_table, profile_step  # noqa: E402
    from results import BenchmarkParser, machine, positive, run_benchmark, save_plot, write_section  # noqa: E402
    from train_step import (DEVICE, MASK_PROB, MMAP_THRESHOLD, Ours, adamw, alternate, autocast,  # noqa: E402
                            make_batch, optimizer_step, summary, versions)

    from megatron import hf_modernbert  # noqa: E402
    from megatron.data.batch import BertBatch  # noqa: E402
    from megatron.flops import training_flops_per_sample  # noqa: E402
    from megatron.model.args import MODEL_PRESETS  # noqa: E402
    from megatron.model.attention import local, plans, simulate  # noqa: E402
    from megatron.model.bert import BertConfig, BertModel  # noqa: E402

PRESET = {**MODEL_PRESETS["modernbert-base"], "vocab_size": 50368}  # ModernBERT's vocab: a preset leaves it to the run
ON_GPU = DEVICE.type == "cuda"
DTYPE = torch.bfloat16 if ON_GPU else torch.float32  # what the local layer alone runs in (the steps: autocast)
# on CPU the preset shrunk: hidden 256, 6 layers, 4 heads (head dim 64, as ModernBERT's), ffn at the
# preset's ratio; on a GPU ModernBERT-base itself (22 layers, hidden 768)
SHAPE = {} if ON_GPU else dict(num_layers=6, hidden_size=256, num_attention_heads=4,
                               ffn_hidden_size=256 * PRESET["ffn_hidden_size"] // PRESET["hidden_size"])
PLOT = HERE / ("modern_cuda.png" if ON_GPU else "modern.png")
HEADING = f"Modern encoder layers vs Hugging Face ModernBERT ({'cuda' if ON_GPU else 'CPU'})"
CONTESTANTS = ("ours", "hf", "hf-sparse")
NO_WARMUP_ABOVE_S = 10.0  # a longer step skips its warm-up: the models warmed up at the shorter lengths
FEWER_REPEATS_ABOVE_S = 30.0  # a longer step is repeated --long-repeats times
OVERSUBSCRIBED = """
**The load exceeded the cores: these figures understate ours.** With more runnable threads than
cores, every parallel region of torch's thread pool can wait a scheduler slice at its barrier; the
local core runs many small per-tile ops (4 kernel calls and their gradient adds per 64-row tile), so
it suffers most (seen here: the local layer alone at 1024 tokens went from 15 ms to 780 ms at 2
threads under load, 11-13 ms at 1 thread). Rerun on an idle machine, or with `--threads 1`."""


def model_config(seq: int, shape: dict | None = None) -> BertConfig:
    """Our ModernBERT-shaped config at `seq` tokens (`shape`: sizes over SHAPE, for tests)."""
    return BertConfig(**{**PRESET, **SHAPE, **(shape or {}), "seq_length": seq,
                         "max_position_embeddings": max(seq, PRESET["max_position_embeddings"])})


class HuggingFace:
    def __init__(self, config: BertConfig, state: dict, sparse_prediction: bool = False):
        import transformers

        if config.padded_vocab_size != config.vocab_size:  # HF's decoder has exactly vocab_size rows
            raise ValueError(f"vocab_size {config.vocab_size} is not a multiple of "
                             f"{config.make_vocab_size_divisible_by}")
        hf_config = transformers.ModernBertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_attention_heads, intermediate_size=config.ffn_hidden_size,
            max_position_embeddings=config.max_position_embeddings, local_attention=config.local_attention_window,
            global_attn_every_n_layers=config.global_attention_every, global_rope_theta=config.rotary_base,
            local_rope_theta=config.local_rotary_base, norm_eps=config.layernorm_epsilon, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, sparse_prediction=sparse_prediction,
            attn_implementation="sdpa")
        self.model = transformers.ModernBertForMaskedLM(hf_config)
        # the converter's map (megatron/hf_modernbert.py); decoder.weight is tied to the token embeddings
        missing, unexpected = self.model.load_state_dict(hf_modernbert.hf_state_from_bert(state, config), strict=False)
        assert missing == ["decoder.weight"] and not unexpected, (missing, unexpected)
        self.model.train()
        self.model.to(DEVICE)
        self.optimizer = adamw(self.model.parameters())

    def __call__(self, batch: BertBatch) -> torch.Tensor:
        with autocast():
            loss = self.model(input_ids=batch.tokens, attention_mask=torch.ones_like(batch.tokens),
                              labels=batch.labels.masked_fill(~batch.loss_mask, -100)).loss
        return optimizer_step(loss, self.optimizer)


def build_contestants(names, seq: int, shape: dict | None = None) -> dict:
    """{name: step} with the same starting weights; the models hold no length (rope has no table),
    so one set serves every length up to `seq`."""
    config = model_config(seq, shape)
    torch.manual_seed(0)
    state = BertModel(config).state_dict()
    builders = {"ours": lambda: Ours(config, state), "hf": lambda: HuggingFace(config, state),
                "hf-sparse": lambda: HuggingFace(config, state, sparse_prediction=True)}
    return {name: builders[name]() for name in names}


def estimate_seconds(history: dict, seq: int) -> float | None:
    """A step's seconds (or peak MiB) at `seq` from {seq: value} at shorter lengths: a s + c s^2
    through the two longest (c s^2 alone when that gives a < 0 or only one is known); None
    without history."""
    if not history:
        return None
    points = sorted(history.items())[-2:]
    if len(points) == 2:
        (s1, t1), (s2, t2) = points
        c = (t2 / s2 - t1 / s1) / (s2 - s1)
        a = t1 / s1 - c * s1
        if a >= 0 and c >= 0:
            return a * seq + c * seq * seq
    s_last, t_last = points[-1]
    return t_last * (seq / s_last) ** 2


def available_mib() -> float:
    """Free GPU memory on a GPU, else MemAvailable of /proc/meminfo, in MiB (inf where there is none)."""
    if ON_GPU:
        return torch.cuda.mem_get_info()[0] / 2**20
    try:
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:")) / 1024
    except (OSError, StopIteration):
        return math.inf


def plan_runs(names, history: dict, seq: int, max_step_s: float, memory: dict | None = None) -> tuple:
    """(names to run at `seq`, {name: (estimated seconds, estimated peak MiB or None)} of those left
    out: a step estimated over `max_step_s`, or over 80% of the memory available now; ours always runs)."""
    memory = memory or {name: {} for name in names}
    budget = 0.8 * available_mib()
    estimates = {name: (estimate_seconds(history[name], seq), estimate_seconds(memory[name], seq)) for name in names}

    def fits(name):
        seconds, mib = estimates[name]
        return (seconds is None or seconds <= max_step_s) and (mib is None or mib <= budget)
    run = [n for n in names if n == "ours" or fits(n)]
    return run, {n: estimates[n] for n in names if n not in run}


def bench_steps(contestants: dict, seq_lengths, repeats: int, long_repeats: int, warmup: int, max_step_s: float,
                shape: dict | None = None, log=print) -> dict:
    """{seq: {name: summary or {"estimated_s": seconds}}}, contestants alternated at each length."""
    history = {name: {} for name in contestants}
    memory = {name: {} for name in contestants}
    results = {}
    vocab = model_config(seq_lengths[0], shape).vocab_size
    for index, seq in enumerate(seq_lengths):
        config = model_config(seq, shape)
        run, skipped = plan_runs(list(contestants), history, seq, max_step_s, memory)
        longest = max((estimate_seconds(history[n], seq) or 0.0) for n in run)
        steps_warmup = warmup if index == 0 or longest <= NO_WARMUP_ABOVE_S else 0
        steps_repeats = repeats if longest <= FEWER_REPEATS_ABOVE_S else min(repeats, long_repeats)
        batch = make_batch(1, seq, vocab, token_types=False)
        runs = alternate({name: contestants[name] for name in run}, batch, steps_repeats, steps_warmup)
        flops = training_flops_per_sample(config, MASK_PROB)
        row = {}
        for name, rows in runs.items():
            row[name] = summary(rows, seq, flops)  # model FLOPs: the head at the masked positions for all
            row[name].update(repeats=steps_repeats, warmup=steps_warmup)
            history[name][seq] = row[name]["seconds"]
            memory[name][seq] = max(row[name]["peak_mib"], 1.0)
            log(f"s={seq} {name}: {row[name]['tokens_per_s']:.0f} tokens/s, {row[name]['seconds']:.2f} s/step, "
                f"peak {row[name]['peak_mib']:.0f} MiB")
        for name, (seconds, mib) in skipped.items():
            row[name] = {"estimated_s": seconds, "estimated_mib": mib}
            log(f"s={seq} {name}: not run, {seconds:.0f} s per step and {mib or 0:.0f} MiB peak estimated")
        results[seq] = row
    return results


def where_the_time_goes(contestants: dict, steps: dict, seq: int, shape: dict | None = None) -> str:
    """The section's paragraph on a GPU: one profiled step of each contestant at `seq` (launches.py)."""
    ran = [name for name in contestants if "seconds" in steps[seq].get(name, {})]
    batch = make_batch(1, seq, model_config(seq, shape).vocab_size, token_types=False)
    profiles = {name: profile_step(contestants[name], batch) for name in ran}
    step_ms = {name: 1000 * steps[seq][name]["seconds"] for name in ran}
    return f"""
**Where a step's time goes at {seq} tokens** (benchmarks/launches.py: one torch.profiler step after a
warm-up; GPU busy: the device time of its kernels, copies and fills; busy share: that over the timed
step; host waits: synchronize calls and blocking copies). A busy share well under 100% is a step
bound by launches and host work, not by the GPU's rate.

{launches_table(profiles, step_ms)}
"""


# ---------------------------------------------------------------- (b) one local layer alone

def window_mask(seq: int, half: int) -> torch.Tensor:
    positions = torch.arange(seq)
    return (positions[:, None] - positions[None, :]).abs() <= half  # [s, s] bool: HF's sliding mask


def local_layer_steps(seq: int, window: int, heads: int, head_dim: int) -> dict:
    """{"ours": core fwd+bwd, "masked s x s": SDPA under an s x s window mask}, on the same q, k, v."""
    core = local.LocalAttention(SimpleNamespace(local_attention_window=window, head_dim=head_dim))
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, seq, heads, head_dim, generator=g).to(DEVICE, DTYPE) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    segment_ids = torch.ones(1, seq, dtype=torch.long, device=DEVICE)
    core.plan(segment_ids)  # once per micro-batch in the model, shared by every local layer

    def ours(_):
        core(q, k, v, segment_ids).backward(grad)
        q.grad = k.grad = v.grad = None

    mask = window_mask(seq, window // 2).to(DEVICE)

    def masked(_):
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask)
        out.backward(grad.transpose(1, 2))
        q.grad = k.grad = v.grad = None
    return {"ours": ours, "masked s x s": masked}


def plan_seconds(seq: int, window: int, repeats: int) -> float:
    """Median seconds of the local plan of one micro-batch (once per micro-batch, for every local layer):
    on CPU with its tiles (made on first use: the CPU's kernels take them), on a GPU its varlen offsets
    (bf16 never makes the tiles), until they are on the device."""
    comm = simulate.SimulatedComm(simulate.VirtualGroup(1), 0)
    times = []
    for _ in range(repeats):
        segment_ids = torch.ones(1, seq, dtype=torch.long, device=DEVICE)
        start = time.perf_counter()
        plan = local.local_plan(segment_ids, comm, window // 2)
        if ON_GPU:
            torch.cuda.synchronize()
        else:
            plan.tiles
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_local_layer(seq_lengths, window: int, heads: int, head_dim: int, repeats: int, max_step_s: float,
                      log=print) -> dict:
    """{seq: {"ours": s, "masked s x s": s or {"estimated_s": s}, "plan": s}} (median seconds)."""
    history = {"ours": {}, "masked s x s": {}}
    results = {}
    for seq in seq_lengths:
        steps = local_layer_steps(seq, window, heads, head_dim)
        run, skipped = plan_runs(list(steps), history, seq, max_step_s)
        runs = alternate({name: steps[name] for name in run}, None, repeats, warmup=1)
        plans.clear()
        row = {name: statistics.median(r[0] for r in rows) for name, rows in runs.items()}
        row.update({name: {"estimated_s": seconds} for name, (seconds, _) in skipped.items()})
        row["plan"] = plan_seconds(seq, window, repeats)
        for name in run:
            history[name][seq] = row[name]
        log(f"local layer s={seq}: " + ", ".join(f"{name} {_seconds(value)}" for name, value in row.items()))
        results[seq] = row
    return results


def _seconds(value) -> str:
    return f"not run ({value['estimated_s']:.0f} s estimated)" if isinstance(value, dict) else f"{1e3 * value:.1f} ms"


# ---------------------------------------------------------------- (c) halo bytes per local layer

def halo_model_bytes(rank: int, size: int, window: int, batch: int, hidden: int, element_bytes: int) -> tuple:
    """(forward, backward) bytes rank `rank` of `size` sends per local layer when its chunk holds
    at least window / 2 tokens: to each neighbour (one for the first and last rank, two between)
    the window / 2 tokens' K and V nearest to it, [b, W/2, h] each; backward sends the same
    counts home as dK, dV, accumulated in fp32 (4 bytes) whatever the activations' dtype."""
    neighbours = (rank > 0) + (rank < size - 1)
    values = neighbours * 2 * (window // 2) * batch * hidden
    return values * element_bytes, values * 4


def halo_bytes(size: int, seq: int, window: int, heads: int, head_dim: int, dtype=torch.float32) -> list:
    """Per rank [(forward bytes, backward bytes)] that the local core's exchanges send at SP = `size`
    (one sample of one segment), read from the simulated comms' logs of point-to-point batches:
    the forward's halo exchange is the first batch, the backward's dK, dV home the second."""
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(1, seq, heads, head_dim, generator=g).to(dtype) for _ in range(4))
    segment_ids = torch.ones(1, seq, dtype=torch.long)
    _, comms = simulate.local_attention(q, k, v, segment_ids, grad_out, size, window)
    simulate.check_pairing([comm.log for comm in comms])
    sent = []
    for comm in comms:
        assert len(comm.log) == 2, f"rank {comm.rank}: {len(comm.log)} point-to-point batches, expected 2"
        sent.append(tuple(sum(numel * dtype.itemsize for _, direction, numel, dtype in batch if direction == "send")
                          for batch in comm.log))
    return sent


def bench_halo(sizes, seq: int, window: int, heads: int, head_dim: int, dtypes) -> list:
    """Rows (P, dtype, rank, measured forward, model forward, measured backward, model backward)."""
    rows = []
    for dtype in dtypes:
        for size in sizes:
            for rank, (forward, backward) in enumerate(halo_bytes(size, seq, window, heads, head_dim, dtype)):
                model = halo_model_bytes(rank, size, window, 1, heads * head_dim, dtype.itemsize)
                rows.append((size, dtype, rank, forward, model[0], backward, model[1]))
    return rows


# ---------------------------------------------------------------- report

def _cell(row: dict, name: str) -> str:
    result = row.get(name)
    if result is None:
        return "-"
    if "estimated_s" in result:
        mib = result.get("estimated_mib")
        memory = f", {mib / 1024:.1f} GiB peak estimated ({available_mib() / 1024:.1f} GiB available)" if mib else ""
        return f"not run: {result['estimated_s']:.0f} s per step{memory or ' estimated'}"
    return f"{result['tokens_per_s']:.0f} ({result['min']:.0f}-{result['max']:.0f})"


def _ratio(row: dict, name: str) -> str:
    if name not in row or "estimated_s" in row[name]:
        return "-"
    return f"**{row['ours']['tokens_per_s'] / row[name]['tokens_per_s']:.2f}x**"


def step_table(results: dict, names) -> str:
    others = [n for n in names if n != "ours"]
    lines = ["| seq | " + " | ".join(f"{n} tokens/s (min-max)" for n in names) + " | "
             + " | ".join(f"ours / {n}" for n in others) + " | " + " | ".join(f"{n} peak MiB" for n in names)
             + " | repeats (warm-up) |", "|" + "---|" * (2 + 2 * len(names) + len(others))]
    for seq, row in results.items():
        memory = [f"{row[n]['peak_mib']:.0f}" if n in row and "peak_mib" in row[n] else "-" for n in names]
        lines.append(f"| {seq} | " + " | ".join(_cell(row, n) for n in names) + " | "
                     + " | ".join(_ratio(row, n) for n in others) + " | " + " | ".join(memory)
                     + f" | {row['ours']['repeats']} ({row['ours']['warmup']}) |")
    return "\n".join(lines)


def quadratic_table(steps: dict, layer: dict) -> str:
    first_seq = min(steps)
    base_rate = steps[first_seq]["ours"]["tflops"]
    base_layer = layer[min(layer)]["ours"] / min(layer)
    masked_base = layer[min(layer)]["masked s x s"]
    lines = [f"| seq | ours model GFLOP/s | rate / rate at {first_seq} | local layer fwd+bwd ms | per token / at "
             f"{min(layer)} | masked s x s ms | its per token / at {min(layer)} | local plan ms (per micro-batch) |",
             "|---|---|---|---|---|---|---|---|"]
    for seq in sorted(set(steps) | set(layer)):
        rate = steps.get(seq, {}).get("ours")
        row = layer.get(seq)
        masked = row and row["masked s x s"]
        masked_cells = ("-", "-") if not masked else (
            (f"not run: {masked['estimated_s']:.0f} s estimated", "-") if isinstance(masked, dict) else
            (f"{1e3 * masked:.1f}", f"{masked / seq / (masked_base / min(layer)):.2f}x"
             if not isinstance(masked_base, dict) else "-"))
        lines.append(f"| {seq} | " + (f"{1e3 * rate['tflops']:.1f} | **{rate['tflops'] / base_rate:.2f}**" if rate
                                      else "- | -") + " | "
                     + (f"{1e3 * row['ours']:.1f} | **{row['ours'] / seq / base_layer:.2f}x**" if row else "- | -")
                     + f" | {masked_cells[0]} | {masked_cells[1]} | " + (f"{1e3 * row['plan']:.1f}" if row else "-")
                     + " |")
    return "\n".join(lines)


def halo_table(rows: list) -> str:
    lines = ["| P | dtype | rank | forward bytes measured / model | backward bytes measured / model |",
             "|---|---|---|---|---|"]
    for size, dtype, rank, forward, model_forward, backward, model_backward in rows:
        lines.append(f"| {size} | {str(dtype).replace('torch.', '')} | {rank} | {forward} / {model_forward}"
                     f"{'' if forward == model_forward else ' (differs)'} | {backward} / {model_backward}"
                     f"{'' if backward == model_backward else ' (differs)'} |")
    return "\n".join(lines)


def plot(steps: dict, layer: dict, names) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed_ax, mem_ax, layer_ax) = plt.subplots(1, 3, figsize=(15, 4))
    for name in names:
        seqs = [s for s in steps if name in steps[s] and "tokens_per_s" in steps[s][name]]
        speed_ax.plot(seqs, [steps[s][name]["tokens_per_s"] for s in seqs], marker="o", label=name)
        speed_ax.fill_between(seqs, [steps[s][name]["min"] for s in seqs], [steps[s][name]["max"] for s in seqs],
                              alpha=0.2)
        mem_ax.plot(seqs, [steps[s][name]["peak_mib"] for s in seqs], marker="o", label=name)
    first = min(layer)
    for name in ("ours", "masked s x s"):
        seqs = [s for s in layer if not isinstance(layer[s][name], dict)]
        if not isinstance(layer[first][name], dict):
            layer_ax.plot(seqs, [layer[s][name] / s / (layer[first][name] / first) for s in seqs], marker="o",
                          label="local core (halo, banded)" if name == "ours" else "masked s x s SDPA")
    for ax, ylabel in ((speed_ax, "training tokens / s (median, min-max)"), (mem_ax, "step peak memory (MiB)"),
                       (layer_ax, f"local layer time per token / at {first}")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (one sample)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    layer_ax.set_yscale("log", base=2)
    config = model_config(min(steps))
    fig.suptitle(f"ModernBERT-shaped (hidden {config.hidden_size}, {config.num_layers} layers, "
                 f"{config.num_attention_heads} heads, ffn {config.ffn_hidden_size}), full training step "
                 f"(fwd+bwd+AdamW), {precision_words()}", fontsize=10)
    fig.tight_layout()
    save_plot(fig, PLOT)
    plt.close(fig)


def precision_words() -> str:
    return "bf16 autocast, cuda" if ON_GPU else f"fp32, {torch.get_num_threads()} threads, CPU"


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lengths", type=positive(int), nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--contestants", nargs="+", choices=CONTESTANTS, default=list(CONTESTANTS))
    parser.add_argument("--repeats", type=positive(int), default=4,
                        help="timed steps per contestant (order reversed every other)")
    parser.add_argument("--long-repeats", type=positive(int), default=2,
                        help=f"repeats where a step takes over {FEWER_REPEATS_ABOVE_S:.0f} s (estimated)")
    parser.add_argument("--warmup", type=positive(int, zero=True), default=1,
                        help="untimed steps of each contestant before the timed ones (none above a step of "
                        f"{NO_WARMUP_ABOVE_S:.0f} s)")
    parser.add_argument("--max-step-seconds", type=positive(float), default=150.0,
                        help="a contestant whose step is estimated longer is not run at that length")
    parser.add_argument("--halo-sizes", type=positive(int), nargs="+", default=[2, 4])
    parser.add_argument("--threads", type=positive(int), default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    if "ours" not in args.contestants:
        parser.error("--contestants must include ours (the ratios are ours / each other)")
    return args


def main():
    args = parse_args()
    if not ON_GPU and os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        # glibc reads it at start-up: restart so every tensor buffer is mmap-ed (train_step.py's method)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD})
    torch.set_num_threads(args.threads)
    seq_lengths = sorted(args.seq_lengths)
    config = model_config(max(seq_lengths))
    window, heads, head_dim = config.local_attention_window, config.num_attention_heads, config.head_dim
    started, load_before = time.perf_counter(), os.getloadavg()
    contestants = build_contestants(args.contestants, max(seq_lengths))
    steps = bench_steps(contestants, seq_lengths, args.repeats, args.long_repeats, args.warmup, args.max_step_seconds)
    launched = where_the_time_goes(contestants, steps, seq_lengths[0]) if ON_GPU else ""
    del contestants
    layer = bench_local_layer(seq_lengths, window, heads, head_dim, args.repeats, args.max_step_seconds)
    halo_seq = max(args.halo_sizes) * max(window, 256)
    halo = bench_halo(args.halo_sizes, halo_seq, window, heads, head_dim, (torch.float32, torch.bfloat16))
    plot(steps, layer, args.contestants)
    minutes = (time.perf_counter() - started) / 60
    cores = len(os.sched_getaffinity(0))
    # other jobs' load when it started, plus its own threads (its own load is no oversubscription)
    oversubscribed = not ON_GPU and args.threads > 1 and load_before[0] + args.threads > cores + 0.5
    command = "`.venv/bin/python benchmarks/modern.py " + " ".join(sys.argv[1:]) + "`"
    layers = ", ".join("global" if not config.is_local_layer(i) else "local" for i in range(config.num_layers))
    write_section(HEADING, f"""
Machine: {machine()}; {versions()}. Command: {command} ({minutes:.0f} min; `make bench-modern`).
Load average (1, 5, 15 min) before: {", ".join(f"{x:.1f}" for x in load_before)}; after:
{", ".join(f"{x:.1f}" for x in os.getloadavg())} (the machine's {len(os.sched_getaffinity(0))} cores
{"were shared with other jobs: absolute figures are noisy, the alternated ratios less so" if load_before[0] > 1.5
 else "were otherwise idle"}).{OVERSUBSCRIBED if oversubscribed else ""}

**Training step vs `ModernBertForMaskedLM`** (transformers, SDPA). Both models: the modernbert-base
preset's layers{f" shrunk to {SHAPE}" if SHAPE else " at ModernBERT-base's size"} (head dim {head_dim}), vocab {config.vocab_size}, layers {layers}
(window {window}: a query sees {window // 2} keys on each side; rope theta {config.rotary_base:.0f} global /
{config.local_rotary_base:.0f} local), GeGLU, no biases, no dropout; the same starting weights. {precision_words()},
one sample of one segment per step (no padding), 15% MLM positions, torch AdamW (fused).
One step = forward, backward, optimizer step; contestants alternated in one process (order
reversed every other repetition: A B B A), median tokens/s with min-max; a step over
{NO_WARMUP_ABOVE_S:.0f} s (estimated) skips its warm-up (the same models and optimizer states warmed up at the
shorter lengths), one over {FEWER_REPEATS_ABOVE_S:.0f} s runs {args.long_repeats} repetitions; a contestant whose step is estimated
over {args.max_step_seconds:.0f} s, or its peak over 80% of the memory available (each a s + c s^2 through its two
longest measured lengths), is not run at that length.
`ours`: global layers dense at SP = 1, local layers the halo core ({"one windowed varlen flash call"
if ON_GPU else "banded tiles"}, O(s x W)), MLM logits at the masked positions. `hf`: as a user runs it (sparse_prediction off: logits over
the {config.vocab_size}-word vocab at every position), local layers as full s x s attention under an s x s
window mask (SDPA{" with a boolean mask: its memory-efficient kernel" if ON_GPU else "'s CPU flash kernel with a boolean mask"}). `hf-sparse`: sparse_prediction on
(logits at the masked positions, as ours): the layers' difference alone. Peak MiB: the step's
{"CUDA allocator peak" if ON_GPU else "resident-set"} growth (train_step.py's method; weights and optimizer state excluded).

{step_table(steps, args.contestants)}

Targets (issue 22): ours / hf >= 1.3x at 1024 and >= 3x at 8192.
{launched}
**No hidden quadratic work.** Our model FLOP rate: megatron/flops.py's model FLOPs of the step
(local layers counted with min(s, W + 1) keys per query, global layers with s) over its median
time (target at 8192 and 16384: >= 0.85 of the rate at the shortest length). Local layer alone:
attention/local.LocalAttention at SP = 1 (q, k, v [1, s, {heads}, {head_dim}], one segment), forward + backward,
its plan made once beforehand (the model makes it once per micro-batch for every local layer; its
time is the last column), alternated with the same window as one SDPA call under an s x s
boolean mask (HF's way); median of {args.repeats}; target: per-token cost at 16384 within 1.25x of
that at 1024 (a masked s x s layer: 16x).

{quadratic_table(steps, layer)}

**Halo bytes per local layer** at SP = P: what one rank sends, counted from the point-to-point
batches of the local core's forward (halo exchange) and backward (dK, dV home) on P virtual
ranks (attention/simulate.run_virtual_ranks; local._LocalAttention driven directly), s = {halo_seq},
one sample, h = {heads} x {head_dim}, window W = {window}. Model: a rank sends its first W/2 tokens' K
and V to the previous rank and its last W/2 tokens' K and V to the next one (the first and last
rank have one neighbour), [b, W/2, h] per tensor per side: 2 x (W/2) x b x h x e per neighbour,
at most 2 x W x b x h x e per rank, independent of s and P (as long as a chunk holds W/2 tokens;
shorter chunks take their halo from several ranks, the same total); backward sends the same
counts home as dK, dV in fp32 (4 bytes) whatever the activations' dtype e. Plus, once per
micro-batch for all layers, the all-gather of the segment ids (b x s/P int64 from every rank).

{halo_table(halo)}

![modern layers]({PLOT.name})
""")


if __name__ == "__main__":
    run_benchmark(main)
