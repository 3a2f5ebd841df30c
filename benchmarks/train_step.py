"""Full training steps (forward, backward, AdamW) of our BERT against Hugging Face's
BertForPreTraining of the same shape, in one process, alternating, on CPU (or one GPU).

Contestants per sequence length, built from one BertConfig with the same weights:
* `hf`: transformers.BertForPreTraining, attn_implementation="sdpa", MLM logits at EVERY
  position ([b, s, vocab]) then a loss over the masked ones;
* `ours`: BertModel (dense attention, HF's post-LN layout) + bert_batch_loss, MLM logits at
  the masked positions only;
* `ring`, `linformer`, `bigbird`: the same model with that attention core at SP=1 (attention
  settings of benchmarks/attention_memory.py).
All use torch AdamW with the same settings (`fused=True` where torch has it, else its default),
the same batch (random tokens, 15% MLM positions with labels there and -100 elsewhere, SOP
labels, no padding), fp32 on CPU (bf16 autocast on a GPU), the same thread count. Each
repetition runs every contestant once, the order reversed on odd repetitions; warm-up steps
(which also allocate AdamW's state) come first. Reported: median tokens/s and min-max over
repetitions, the step's peak memory (resident-set growth, attention_memory.py's method: glibc's
mmap threshold fixed so freed tensors leave the resident set; on CUDA max_memory_allocated),
and model FLOP/s (megatron/flops.py) over this machine's matmul rate measured in the same run
(MFU; on a GPU the device's dense bf16 peak from --peak-tflops).

Also, with smaller repeat counts: our step through the DeepSpeed engine (`train_step`, one
rank) against the plain step, AdamW's CPU implementations (for-loop / foreach / fused), and the
share of a real trainer iteration spent outside `train_step` (data loading, logging).
`--profile` writes torch.profiler tables (sorted by self CPU time) to benchmarks/profiles/.

    .venv/bin/python benchmarks/train_step.py                 # the CPU set (make bench)
    .venv/bin/python benchmarks/train_step.py --shape base --seq-lengths 512 4096 --peak-tflops 989
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch
    import torch.nn.functional as F

    from attention_memory import LENGTHS_HELP, VARIANT_OPTIONS, _status_kib, check_lengths  # noqa: E402
    import results  # noqa: E402
    from results import (BenchmarkParser, fraction, machine, positive, run_benchmark, save_plot,  # noqa: E402
                         write_section)

    from megatron.data.batch import BertBatch  # noqa: E402
    from megatron.flops import training_flops_per_sample  # noqa: E402
    from megatron.hf_convert import hf_config_from_bert, hf_state_from_bert  # noqa: E402
    from megatron.model.attention import plans  # noqa: E402
    from megatron.model.bert import BertConfig, BertModel  # noqa: E402
    from megatron.model.loss import bert_batch_loss  # noqa: E402
    from megatron.parallel.device import to_device  # noqa: E402

SHAPES = {
    "small": dict(num_layers=4, hidden_size=256, num_attention_heads=4),
    "base": dict(num_layers=12, hidden_size=768, num_attention_heads=12),
    "large": dict(num_layers=24, hidden_size=1024, num_attention_heads=16),
}
CONTESTANTS = ("ours", "hf", "ring", "linformer", "bigbird")
VOCAB = 30522  # BERT's WordPiece vocab
MASK_PROB = 0.15
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
MMAP_THRESHOLD = str(64 * 1024)
PROFILES = HERE / "profiles"
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_config(shape: str, seq: int, attention: str = "dense", attention_dropout: float = 0.0) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, seq_length=seq, max_position_embeddings=seq, layernorm_layout="post",
                      embedding_layernorm=True, hidden_dropout=0.1, attention_dropout=attention_dropout,
                      attention=attention, **VARIANT_OPTIONS.get(attention, {}), **SHAPES[shape])


def adamw(parameters, implementation: str = "fused"):
    """torch AdamW; `fused` where torch has a fused kernel for the device (CPU and CUDA in 2.13)."""
    return torch.optim.AdamW(parameters, **ADAMW, **{implementation: True} if implementation != "for-loop" else
                             {"foreach": False})


def make_batch(batch_size: int, seq: int, vocab: int = VOCAB, seed: int = 0, token_types: bool = True) -> BertBatch:
    """Random tokens, 15% MLM positions, no padding; `token_types`: two segments per sample and random
    SOP labels, else one segment (types and SOP labels 0: modern.py's ModernBERT, which has neither)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, vocab, (batch_size, seq), generator=g)
    loss_mask = torch.rand(batch_size, seq, generator=g) < MASK_PROB
    labels = torch.randint(5, vocab, (batch_size, seq), generator=g)
    if token_types:
        types = (torch.arange(seq) >= seq // 2).long().expand(batch_size, seq).contiguous()
        sop_labels = torch.randint(0, 2, (batch_size,), generator=g)
    else:
        types, sop_labels = torch.zeros_like(tokens), torch.zeros(batch_size, dtype=torch.long)
    return to_device(BertBatch.unpacked(tokens, types, torch.zeros_like(loss_mask), labels, loss_mask, sop_labels),
                     DEVICE)


class Ours:
    def __init__(self, config: BertConfig, state: dict, optimizer: str = "fused"):
        self.model = BertModel(config).to(DEVICE)
        # the same weights as every contestant; linformer's E, F stay freshly initialised
        self.model.load_state_dict(state, strict=config.attention != "linformer")
        self.optimizer = adamw(self.model.parameters(), optimizer)

    def __call__(self, batch: BertBatch) -> torch.Tensor:
        plans.clear()  # a new micro-batch each step, as in training: its attention plans and rope tables made again
        with autocast():
            loss = bert_batch_loss(*self.model(*batch.model_inputs()), batch).total
        return optimizer_step(loss, self.optimizer)


class HuggingFace:
    def __init__(self, config: BertConfig, state: dict):
        import transformers

        values = {k: v for k, v in hf_config_from_bert(config, pad_token_id=0).items() if k != "architectures"}
        values["layer_norm_eps"] = config.layernorm_epsilon
        self.model = transformers.BertForPreTraining(transformers.BertConfig(**values, attn_implementation="sdpa"))
        self.model.load_state_dict(hf_state_from_bert(state, config), strict=False)  # the decoder is tied
        self.model.to(DEVICE)
        self.optimizer = adamw(self.model.parameters())

    def __call__(self, batch: BertBatch) -> torch.Tensor:
        with autocast():
            loss = self.model(input_ids=batch.tokens, token_type_ids=batch.token_types,
                              attention_mask=(~batch.key_padding_mask).long(),
                              labels=batch.labels.masked_fill(~batch.loss_mask, -100),
                              next_sentence_label=batch.sop_labels[:, 0]).loss
        return optimizer_step(loss, self.optimizer)


def optimizer_step(loss, optimizer) -> torch.Tensor:
    """Backward, optimizer step, gradients cleared -> the detached loss (the end of every contestant's step)."""
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEVICE.type == "cuda")


def timed(step, *args) -> tuple:
    """(seconds, peak MiB) of one call."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        open("/proc/self/clear_refs", "w").write("5")
        before = _status_kib("VmRSS") * 1024
    start = time.perf_counter()
    step(*args)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _status_kib("VmHWM") * 1024 - before
    return time.perf_counter() - start, peak / 2**20


def alternate(steps: dict, batch, repeats: int, warmup: int) -> dict:
    """{name: [(seconds, peak MiB)] per repetition}, every step once per repetition."""
    for _ in range(warmup):
        for step in steps.values():
            step(batch)
    runs = {name: [] for name in steps}
    for rep in range(repeats):
        for name in (list(steps) if rep % 2 == 0 else list(steps)[::-1]):
            runs[name].append(timed(steps[name], batch))
    return runs


def matmul_peak_gflops(n: int | None = None, tries: int = 5) -> float:
    """This machine's GEMM rate, best of `tries` square mm: fp32 at the current thread count on
    CPU, bf16 (8192^3) on a GPU, the precision the steps run in there."""
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
    n = n or (8192 if DEVICE.type == "cuda" else 2048)
    a, b = torch.randn(n, n, device=DEVICE, dtype=dtype), torch.randn(n, n, device=DEVICE, dtype=dtype)
    best = float("inf")
    for _ in range(tries + 1):  # the first call warms up
        best = min(best, timed(torch.mm, a, b)[0])
    return 2 * n ** 3 / best / 1e9


def summary(runs: list, tokens: int, flops: float) -> dict:
    seconds = [r[0] for r in runs]
    median = statistics.median(seconds)
    return {"tokens_per_s": tokens / median, "min": tokens / max(seconds), "max": tokens / min(seconds),
            "seconds": median, "peak_mib": statistics.median(r[1] for r in runs), "tflops": flops / median / 1e12}


def bench_seq(shape: str, seq: int, tokens_per_step: int, contestants: list, repeats: int, warmup: int,
              attention_dropout: float) -> dict:
    """{contestant: summary} at one sequence length."""
    batch_size = max(1, tokens_per_step // seq)
    base = model_config(shape, seq, attention_dropout=attention_dropout)
    torch.manual_seed(0)
    state = BertModel(base).state_dict()
    steps = {}
    for name in contestants:
        if name == "hf":
            steps[name] = HuggingFace(base, state)
        else:
            torch.manual_seed(0)
            steps[name] = Ours(model_config(shape, seq, "dense" if name == "ours" else name, attention_dropout), state)
    batch = make_batch(batch_size, seq)
    runs = alternate(steps, batch, repeats, warmup)
    result = {}
    for name, rows in runs.items():
        config = model_config(shape, seq, "dense" if name in ("ours", "hf") else name)
        # model FLOPs: the MLM head at the masked positions for every contestant (the work the
        # loss needs); HF's head over all positions is counted in hw_tflops only
        useful = training_flops_per_sample(config, MASK_PROB) * batch_size
        result[name] = summary(rows, batch_size * seq, useful)
        if name == "hf":
            executed = training_flops_per_sample(config, 1.0) * batch_size
            result[name]["hw_tflops"] = executed / result[name]["seconds"] / 1e12
        print(f"{shape} s={seq} b={batch_size} {name}: {result[name]}", flush=True)
    return {"batch": batch_size, **result}


def profile(shape: str, seq: int, tokens_per_step: int, attention_dropout: float) -> list:
    """torch.profiler tables of one step of ours and of HF -> files under the committed benchmarks/profiles/ with
    --write only, else in a temporary folder (as sp_scaling.profile_ring)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    batch_size = max(1, tokens_per_step // seq)
    config = model_config(shape, seq, attention_dropout=attention_dropout)
    torch.manual_seed(0)
    state = BertModel(config).state_dict()
    batch = make_batch(batch_size, seq)
    directory = PROFILES if results.WRITE else Path(tempfile.mkdtemp(prefix="train_step_profiles_"))
    directory.mkdir(exist_ok=True)
    written = []
    for name, step in (("ours", Ours(config, state)), ("hf", HuggingFace(config, state))):
        step(batch)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.type == "cuda" else [])
        with torch_profile(activities=activities, record_shapes=False) as prof:
            step(batch)
        path = directory / f"{name}_{shape}_s{seq}_b{batch_size}_{DEVICE.type}.txt"
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60)
        path.write_text(f"{name}: {shape}, seq {seq}, batch {batch_size}, attention dropout {attention_dropout}, "
                        f"{torch.get_num_threads()} threads, {machine()}\n\n{table}\n")
        written.append(path)
    return written


# ---------------------------------------------------------------- engine, optimizer, data time

def engine_vs_plain(shape: str, seq: int, batch_size: int, repeats: int, optimizer_params: dict) -> dict:
    """On one rank (run_on_ranks): our plain step and the same step through the DeepSpeed engine."""
    from megatron.config import resolve
    from megatron.engine import build_engine, train_step

    config = model_config(shape, seq)
    torch.manual_seed(0)
    state = BertModel(config).state_dict()
    flags = {name: getattr(config, name) for name in (
        "vocab_size", "hidden_size", "num_layers", "num_attention_heads", "seq_length", "max_position_embeddings",
        "hidden_dropout", "attention_dropout", "layernorm_layout", "embedding_layernorm")}
    ds = {"train_micro_batch_size_per_gpu": batch_size, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 9,
          "optimizer": {"type": "AdamW", "params": {**ADAMW, "betas": list(ADAMW["betas"]), **optimizer_params}},
          "zero_optimization": {"stage": 0}, "sequence_parallel": {"size": 1, "attention": "dense"}}
    engine = build_engine(resolve({**flags, "attention": "dense"}, ds, 1), bert_state=state)
    batch = make_batch(batch_size, seq)
    steps = {"ours (plain step)": Ours(config, state), "ours through DeepSpeed train_step": lambda b: train_step(engine, [b])}
    return alternate(steps, batch, repeats, warmup=1)


def optimizer_step_times(shape: str, seq: int, repeats: int) -> dict:
    """{implementation: median seconds of AdamW.step} on our model's parameters and gradients."""
    model = BertModel(model_config(shape, seq)).to(DEVICE)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    result = {}
    for implementation in ("for-loop", "foreach", "fused"):
        optimizer = adamw(model.parameters(), implementation)
        optimizer.step()
        result[implementation] = statistics.median(timed(optimizer.step)[0] for _ in range(repeats))
    return result


def cross_entropy_times(shape: str, tokens: int, repeats: int) -> dict:
    """{implementation: median seconds} of the MLM loss forward + backward on the logits of a step
    with `tokens` tokens (15% of them masked): torch's cross-entropy vs SummedCrossEntropy."""
    from megatron.model.loss import SummedCrossEntropy

    config = model_config(shape, 512)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(round(MASK_PROB * tokens), config.padded_vocab_size, generator=g).to(DEVICE).requires_grad_()
    labels = torch.randint(0, VOCAB, (logits.shape[0],), generator=g).to(DEVICE)
    losses = {"torch F.cross_entropy": lambda: F.cross_entropy(logits.float(), labels, reduction="sum"),
              "SummedCrossEntropy": lambda: SummedCrossEntropy.apply(logits, labels)}
    steps = {name: (lambda loss: lambda _: loss().backward())(loss) for name, loss in losses.items()}
    runs = alternate(steps, None, repeats, warmup=1)
    return {name: statistics.median(r[0] for r in rows) for name, rows in runs.items()}


def compiled_step_times(shape: str, seq: int, batch_size: int, repeats: int) -> dict:
    """{eager|--compile-mlp: median seconds} of our whole plain step, and the first compiled
    step's seconds (inductor compiling the MLP sublayers, forward and backward)."""
    from megatron.engine import compile_mlp_sublayers

    config = model_config(shape, seq)
    torch.manual_seed(0)
    state = BertModel(config).state_dict()
    eager, compiled = Ours(config, state), Ours(config, state)
    compile_mlp_sublayers(compiled.model)
    batch = make_batch(batch_size, seq)
    first = timed(compiled, batch)[0]
    runs = alternate({"eager": eager, "--compile-mlp": compiled}, batch, repeats, warmup=1)
    return {"first": first, **{name: statistics.median(r[0] for r in rows) for name, rows in runs.items()}}


def trainer_data_share(data_dir: str, log_dir: str, iterations: int) -> dict:
    """The README's default job (2 ranks, SP=2 ring, seq 512) for `iterations` steps, in process:
    the iteration time the trainer logs (data included) against the time inside train_step."""
    import megatron.run_log
    import megatron.training

    inside, whole = [], []
    real_step, real_log = megatron.training.train_step, megatron.run_log.RunLog.step

    def step(*args, **kwargs):
        start = time.perf_counter()
        result = real_step(*args, **kwargs)
        inside.append(time.perf_counter() - start)
        return result

    def log(self, iteration, consumed, result, engine, seconds, lr):
        whole.append(seconds)
        return real_log(self, iteration, consumed, result, engine, seconds, lr)

    megatron.training.train_step, megatron.run_log.RunLog.step = step, log
    argv = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "512",
            "--max-position-embeddings", "512", "--deepspeed", "--deepspeed_config", str(HERE.parent / "ds_configs" / "ring_sp2.json"),
            "--lr", "1e-4", "--train-iters", str(iterations), "--log-interval", str(iterations), "--eval-interval", str(10 ** 6),
            "--eval-iters", "1", "--default-data-dir", data_dir, "--log-dir", log_dir]
    if megatron.training.main(argv) != 0:
        raise RuntimeError(f"pretrain_bert.py {' '.join(argv)} failed (its error is printed above)")
    skip = 2  # the first steps build DeepSpeed's buffers
    return {"iteration_s": statistics.median(whole[skip:]), "train_step_s": statistics.median(inside[skip:]),
            "outside_share": 1 - sum(inside[skip:]) / sum(whole[skip:])}


# ---------------------------------------------------------------- report

def spread(row: dict) -> str:
    return f"{row['tokens_per_s']:.0f} ({row['min']:.0f}-{row['max']:.0f})"


def table(shape: str, results: dict, peak_tflops: float, contestants: list) -> str:
    lines = ["| seq | batch | " + " | ".join(f"{c} tokens/s (min-max)" for c in contestants)
             + " | ours / hf | " + " | ".join(f"{c} peak MiB" for c in contestants)
             + " | " + " | ".join(f"{c} MFU" for c in contestants) + " |",
             "|" + "---|" * (3 + 3 * len(contestants))]
    for seq, row in results.items():
        ratio = row["ours"]["tokens_per_s"] / row["hf"]["tokens_per_s"] if "hf" in row and "ours" in row else None
        lines.append(f"| {seq} | {row['batch']} | " + " | ".join(spread(row[c]) for c in contestants)
                     + f" | {'-' if ratio is None else f'**{ratio:.2f}x**'} | "
                     + " | ".join(f"{row[c]['peak_mib']:.0f}" for c in contestants) + " | "
                     + " | ".join(f"{100 * row[c]['tflops'] / peak_tflops:.1f}%" for c in contestants) + " |")
    return "\n".join(lines)


def plot(shape: str, results: dict, contestants: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4))
    seqs = list(results)
    for name in contestants:
        speed_ax.plot(seqs, [results[s][name]["tokens_per_s"] for s in seqs], marker="o", label=name)
        speed_ax.fill_between(seqs, [results[s][name]["min"] for s in seqs], [results[s][name]["max"] for s in seqs],
                              alpha=0.2)
        mem_ax.plot(seqs, [results[s][name]["peak_mib"] for s in seqs], marker="o", label=name)
    for ax, ylabel in ((speed_ax, "training tokens / s (median, min-max band)"), (mem_ax, "step peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (tokens per step fixed)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    where = f"fp32, {torch.get_num_threads()} threads" if DEVICE.type == "cpu" else "bf16 autocast"
    fig.suptitle(f"BERT {shape} full training step (fwd+bwd+AdamW), {where}, {DEVICE.type}", fontsize=10)
    fig.tight_layout()
    save_plot(fig, HERE / plot_name(shape))
    plt.close(fig)


def plot_name(shape: str) -> str:
    """The CPU set's plot, or one per shape on a GPU (gpu_check.sh copies those under $OUT)."""
    return "train_step.png" if DEVICE.type == "cpu" else f"train_step_{shape}_cuda.png"


def versions() -> str:
    import deepspeed
    import transformers

    return f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, " \
           f"deepspeed {deepspeed.__version__}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, default="small")
    parser.add_argument("--seq-lengths", type=positive(int), nargs="+", default=[512, 1024, 2048, 4096],
                        help=LENGTHS_HELP)
    parser.add_argument("--tokens-per-step", type=positive(int), default=4096,
                        help="batch = tokens-per-step / seq (>= 1)")
    parser.add_argument("--contestants", nargs="+", choices=CONTESTANTS, default=list(CONTESTANTS))
    parser.add_argument("--repeats", type=positive(int), default=5)
    parser.add_argument("--warmup", type=positive(int, zero=True), default=1,
                        help="untimed steps of each contestant before the timed ones")
    parser.add_argument("--threads", type=positive(int), default=len(os.sched_getaffinity(0)))
    parser.add_argument("--attention-dropout", type=fraction, default=0.0,
                        help="0 keeps SDPA on its flash kernel; > 0 (BERT's 0.1) sends both models to the math kernel")
    parser.add_argument("--peak-tflops", type=positive(float),
                        help="the device's dense peak (GPU); default: measured matmul rate")
    parser.add_argument("--extras", action=argparse.BooleanOptionalAction, default=True,
                        help="also the engine, optimizer and trainer data-time lines")
    parser.add_argument("--profile", action="store_true", help="write torch.profiler tables instead of benchmarking "
                        "(into benchmarks/profiles/ with --write, else into a temporary folder)")
    args = parser.parse_args(argv)
    if args.tokens_per_step < max(args.seq_lengths):  # ran a step of one sample, recorded as the tokens given
        parser.error(f"--tokens-per-step {args.tokens_per_step} is below --seq-lengths {max(args.seq_lengths)}: a "
                     "step holds at least one sample (batch = tokens-per-step / seq); give --tokens-per-step "
                     f"{max(args.seq_lengths)} or more")
    check_lengths(parser, "--seq-lengths", args.seq_lengths,
                  [] if args.profile else [(name, 1) for name in args.contestants if name not in ("ours", "hf")],
                  fix=" or leave out that contestant")
    return args


def main():
    args = parse_args()
    if DEVICE.type == "cpu" and os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        # glibc reads it at start-up: restart so every tensor buffer is mmap-ed (see docstring)
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD})
    torch.set_num_threads(args.threads)
    if args.profile:
        for seq in args.seq_lengths:
            print("\n".join(map(str, profile(args.shape, seq, args.tokens_per_step, args.attention_dropout))))
        return
    load_before = os.getloadavg()
    peak_gflops = args.peak_tflops * 1e3 if args.peak_tflops else matmul_peak_gflops()
    results = {seq: bench_seq(args.shape, seq, args.tokens_per_step, args.contestants, args.repeats, args.warmup,
                              args.attention_dropout) for seq in args.seq_lengths}
    peak_after = matmul_peak_gflops() if not args.peak_tflops else peak_gflops
    peak_gflops = max(peak_gflops, peak_after)
    plot(args.shape, results, args.contestants)
    extras = run_extras(args) if args.extras and DEVICE.type == "cpu" else ""
    command = "`.venv/bin/python benchmarks/train_step.py " + " ".join(sys.argv[1:]) + "`"
    peak_source = (f"the device's dense peak given as --peak-tflops {args.peak_tflops}" if args.peak_tflops else
                   (f"this machine's fp32 matmul rate, best 2048^3 torch.mm at {args.threads} threads, measured "
                    if DEVICE.type == "cpu" else "this GPU's bf16 matmul rate, best 8192^3 torch.mm, measured ")
                   + f"before and after the table: {peak_gflops:.0f} GFLOP/s")
    write_section(f"Training step vs Hugging Face ({args.shape}, {DEVICE.type})", f"""
Machine: {machine()}; {versions()}. Command: {command} (`make bench` runs the CPU set).
Load average (1, 5, 15 min) before: {", ".join(f"{x:.1f}" for x in load_before)}; after:
{", ".join(f"{x:.1f}" for x in os.getloadavg())} (the machine's {len(os.sched_getaffinity(0))} cores
{"were shared with other jobs: absolute figures are noisy, the alternated ratio less so" if load_before[0] > 1.5 else "were otherwise idle"}).

BERT {args.shape} ({SHAPES[args.shape]}, vocab {VOCAB}, ffn 4h, post-LN as HF), hidden dropout
0.1, attention dropout {args.attention_dropout}, {'fp32' if DEVICE.type == 'cpu' else 'bf16 autocast'}, {args.threads}
threads, {args.tokens_per_step} tokens per step (batch = that / seq), torch AdamW (fused) for every
contestant. One step = forward, backward, optimizer step. {args.repeats} repetitions after
{args.warmup} warm-up, contestants alternated (order reversed every other repetition); median
tokens/s with min-max over repetitions. Peak MiB: the step's peak memory growth ({'resident set on CPU' if
DEVICE.type == 'cpu' else 'CUDA allocator peak'}, model and optimizer state excluded). MFU: model FLOPs of the step (megatron/flops.py:
6 x dense parameters x tokens + attention terms, MLM head at the 15% masked positions) per
second over {peak_source}. HF computes its MLM head at every position: counting those FLOPs
too, HF's hardware FLOP rate is {", ".join(f"s={s}: {100 * r['hf']['hw_tflops'] / (peak_gflops / 1e3):.1f}%"
                                           for s, r in results.items() if "hf" in r)} of the peak.

{table(args.shape, results, peak_gflops / 1e3, args.contestants)}

`ours / hf` is the like-for-like ratio (target >= 1.2x on CPU): dense attention through SDPA on
both sides; `ring`, `linformer`, `bigbird` are our other attention cores at SP=1.
{extras}
![train step]({plot_name(args.shape)})
""")


def run_extras(args) -> str:
    """The engine, optimizer and trainer-data lines (CPU)."""
    from megatron.data.default_dataset import prepare_default_dataset
    from megatron.parallel.spawn import run_on_ranks

    seq, batch_size = 512, max(1, args.tokens_per_step // 512)
    lines = []
    for label, params in (("torch AdamW for-loop (DeepSpeed's torch_adam default on CPU)", {"torch_adam": True}),
                          ("torch AdamW fused (params {torch_adam: true, fused: true})",
                           {"torch_adam": True, "fused": True})):
        runs = run_on_ranks(engine_vs_plain, 1, args.shape, seq, batch_size, args.repeats, params,
                            timeout=1800, threads_per_rank=args.threads)[0]
        plain, engine = (statistics.median(r[0] for r in rows) for rows in runs.values())
        lines.append(f"| {label} | {batch_size * seq / plain:.0f} | {batch_size * seq / engine:.0f} | "
                     f"{engine / plain:.2f} |")
    optimizer = optimizer_step_times(args.shape, seq, args.repeats)
    loss = cross_entropy_times(args.shape, args.tokens_per_step, args.repeats)
    compiled = compiled_step_times(args.shape, seq, batch_size, args.repeats)
    plain_step = statistics.median(r[0] for r in runs["ours (plain step)"])
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = HERE.parent / ".cache" / "default_data"
        prepare_default_dataset(data_dir)
        share = max(run_on_ranks(trainer_data_share, 2, str(data_dir), tmp, 12, timeout=1800),
                    key=lambda rank: rank["outside_share"])
    return f"""
**Our step through the DeepSpeed engine** (`megatron.engine.train_step`, one rank, ZeRO 0, seq {seq},
batch {batch_size}; alternated with the plain step above, median of {args.repeats}):

| engine optimizer | plain tokens/s | engine tokens/s | engine / plain time |
|---|---|---|---|
{chr(10).join(lines)}

**AdamW step alone** on the {args.shape} model's {sum(p.numel() for p in BertModel(model_config(args.shape, seq)).parameters()) / 1e6:.1f} M parameters (median of {args.repeats}):
{", ".join(f"{name} {1e3 * seconds:.1f} ms" for name, seconds in optimizer.items())}. On CPU the
for-loop AdamW that DeepSpeed builds from `torch_adam: true` is a large share of a step (the
engine table); `fused: true` in the JSON's optimizer params removes it. On CUDA the engine uses
DeepSpeed's FusedAdam (unmeasured here).

**Fused MLM cross-entropy** (`megatron.model.loss.SummedCrossEntropy`; forward + backward on the
[{round(MASK_PROB * args.tokens_per_step)}, padded vocab] logits of one step, alternated, median of {args.repeats}):
{", ".join(f"{name} {1e3 * seconds:.0f} ms" for name, seconds in loss.items())}: saves
{1e3 * (loss["torch F.cross_entropy"] - loss["SummedCrossEntropy"]):.0f} ms, {100 * (loss["torch F.cross_entropy"] - loss["SummedCrossEntropy"]) / plain_step:.1f}% of our plain step at seq {seq}.

**`--compile-mlp`** (torch.compile of every layer's MLP sublayer, x + dropout(MLP(LayerNorm(x))):
inductor fuses bias-GELU, bias-dropout-add and the LayerNorm around the two GEMMs; whole plain step,
seq {seq}, batch {batch_size}, alternated, median of {args.repeats}): eager {1e3 * compiled["eager"]:.0f} ms,
compiled {1e3 * compiled["--compile-mlp"]:.0f} ms, **{compiled["eager"] / compiled["--compile-mlp"]:.2f}x**; the first
compiled step takes {compiled["first"]:.1f} s (compilation). Off by default: a CPU step is bound by its GEMMs
and attention, so fusing the elementwise passes buys little here; on a GPU, where those passes are
memory-bound, it is the option to measure (`train_step.py` on a GPU; none was lent for these runs).

**Data loading in the real trainer** (the README's default job: 2 ranks, SP=2 ring, seq 512,
micro-batch 4, embedded default dataset; 12 iterations, the first 2 dropped; the rank with the
larger share): median iteration
{1e3 * share['iteration_s']:.0f} ms, of which `train_step` {1e3 * share['train_step_s']:.0f} ms; time outside
`train_step` (sample building, collation, logging): **{100 * share['outside_share']:.1f}%** of the iteration
(target < 2%).
"""


if __name__ == "__main__":
    run_benchmark(main)
