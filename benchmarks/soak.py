"""Soak: a long SP=2 run of the real trainer, watching every rank's resident set for growth.

Runs pretrain_bert.py through the deepspeed launcher (2 CPU ranks, ring attention, ZeRO-1,
ds_configs/ring_sp2.json) on the default dataset with a tiny model, evaluating and saving a
checkpoint along the way as a real run does. Each time rank 0 logs an iteration, the resident
set (RSS) of both rank processes is read (psutil). After a warm-up, a least-squares line per
rank gives the RSS slope; it counts as growth only when its 95% interval excludes zero AND
the growth it predicts over the run exceeds the noise (2 x the residual standard deviation,
at least 1 MiB); the verdict uses the second half of the run (see main). A benchmark, not a
CI test: it takes minutes.

    .venv/bin/python benchmarks/soak.py [--steps 2000] [--sample-every 20] [--glibc-default]

glibc's malloc moves its mmap threshold up as large buffers are freed, so later buffers land on
the heap, whose top can only shrink when it is free: the resident set then rises in steps with
no leak behind it. The ranks run with fixed thresholds (MALLOC_MMAP_THRESHOLD_, as
attention_memory.py does, and MALLOC_TRIM_THRESHOLD_), so buffers are returned when freed and
a slope means memory held; `--glibc-default` measures with glibc's own heuristics instead.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch

    from launcher_runs import Launches
    from results import BenchmarkParser, machine, positive, run_benchmark, save_plot, save_text, write_section

PLOT = HERE / "soak.png"
LOG = HERE / "soak.log"
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
         "--max-position-embeddings", "128", "--attention-dropout", "0", "--micro-batch-size", "4",
         "--lr", "1e-3", "--lr-warmup-fraction", "0.05"]
ITERATION = re.compile(r"iteration (\d+)/(\d+)")
T95 = 1.96  # normal quantile; there are dozens of samples


def rss_trend(steps: list, rss_mib: list, steps_run: int) -> dict:
    """Least-squares line of RSS (MiB) against step: slope per 1000 steps with its 95% interval,
    the residual std (noise), the growth the slope predicts over `steps_run` steps, and whether
    that is growth beyond the noise (`grows`)."""
    x = torch.tensor(steps, dtype=torch.float64)
    y = torch.tensor(rss_mib, dtype=torch.float64)
    design = torch.stack([x, torch.ones_like(x)], dim=1)
    slope, intercept = torch.linalg.lstsq(design, y[:, None]).solution[:, 0]
    residual = y - (slope * x + intercept)
    noise = residual.std().item()
    stderr = (residual.pow(2).sum() / (len(x) - 2) / (x - x.mean()).pow(2).sum()).sqrt().item()
    growth = slope.item() * steps_run
    low = slope.item() - T95 * stderr
    return {"slope_mib_per_1k": slope.item() * 1000, "ci_mib_per_1k": T95 * stderr * 1000, "noise_mib": noise,
            "growth_mib": growth, "grows": low > 0 and growth > max(2 * noise, 1.0)}


def rank_processes(launcher: int) -> list:
    """The launcher's descendants that are training ranks (the launcher passes --local_rank=N), by rank."""
    import psutil

    ranks = {}
    for child in psutil.Process(launcher).children(recursive=True):
        try:
            local = [arg for arg in child.cmdline() if arg.startswith("--local_rank=")]
        except psutil.NoSuchProcess:
            continue
        if local:
            ranks[int(local[0].split("=")[1])] = child
    return [ranks[rank] for rank in sorted(ranks)]


FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024), "MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}


def soak(steps: int, sample_every: int, workdir: Path, malloc_env: dict) -> tuple:
    """Runs the trainer; -> (samples [(step, [rss MiB per rank])], trainer output lines, seconds)."""
    command = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2", str(ROOT / "pretrain_bert.py"),
               *MODEL, "--deepspeed", "--deepspeed_config", str(ROOT / "ds_configs" / "ring_sp2.json"),
               "--train-iters", str(steps), "--log-interval", str(sample_every),
               "--eval-interval", str(max(steps // 4, 1)), "--eval-iters", "2",
               "--save", str(workdir / "ckpt"), "--save-interval", str(max(steps // 2, 1)),
               "--log-dir", str(workdir / "log")]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"),
           **malloc_env}
    started = time.perf_counter()
    samples, lines, ranks = [], [], []
    with Launches() as launches:  # a stop (SIGTERM, Ctrl-C) stops the launcher and its ranks too
        proc = launches.start(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            lines.append(line.rstrip())
            match = ITERATION.search(line)
            if match:
                ranks = ranks or rank_processes(proc.pid)
                samples.append((int(match.group(1)), [rank.memory_info().rss / 2**20 for rank in ranks]))
        if proc.wait():
            raise SystemExit("soak: the trainer failed:\n" + "\n".join(lines[-40:]))
    return samples, lines, time.perf_counter() - started


def plot(samples: list, fit_start: int, trends: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    steps = [step for step, _ in samples]
    for rank, trend in enumerate(trends):
        ax.plot(steps, [rss[rank] for _, rss in samples], marker=".", label=(
            f"rank {rank}: {trend['slope_mib_per_1k']:+.2f} +- {trend['ci_mib_per_1k']:.2f} MiB / 1000 steps (second half)"))
    ax.axvline(fit_start, color="grey", ls="--", lw=0.8, label="fit window starts")
    ax.set_xlabel("step")
    ax.set_ylabel("resident set (MiB)")
    ax.set_title("Soak: tiny BERT, SP=2 ring, ZeRO-1, 2 CPU ranks (deepspeed launcher)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_plot(fig, PLOT)


def parse_args(argv=None) -> argparse.Namespace:
    """soak.py's own flags, checked here: passed on as the trainer's --train-iters and --log-interval,
    a bad value would otherwise be refused by the trainer in terms of its flags, after start-up."""
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive(int), default=2000)
    parser.add_argument("--sample-every", type=positive(int), default=20,
                        help="steps between RSS samples (the log interval)")
    parser.add_argument("--glibc-default", action="store_true", help="leave glibc's adaptive malloc thresholds on")
    args = parser.parse_args(argv)
    samples = args.steps // args.sample_every - args.steps // 2 // args.sample_every  # logged in the second half
    if samples < 3:
        parser.error(f"--steps {args.steps} with --sample-every {args.sample_every} gives {samples} RSS samples in "
                     "the second half of the run, and the fit needs 3; lower --sample-every or raise --steps")
    return args


def main():
    args = parse_args()
    load_before = os.getloadavg()
    malloc_env = {} if args.glibc_default else FIXED_MALLOC
    with tempfile.TemporaryDirectory() as workdir:
        samples, lines, seconds = soak(args.steps, args.sample_every, Path(workdir), malloc_env)
    # two fit windows: after a 10% warm-up, and the second half (the steady state: glibc's dynamic
    # mmap threshold rises as large buffers are freed and moves them onto the heap, which lifts
    # the resident set in steps early in a run without any leak)
    windows = {f"{args.steps // 10}-{args.steps}": args.steps // 10, f"{args.steps // 2}-{args.steps}": args.steps // 2}
    fits = {}
    for window, start in windows.items():
        kept = [(step, rss) for step, rss in samples if step > start]
        if len(kept) < 3:
            raise SystemExit(f"soak: only {len(kept)} samples in steps {window}; lower --sample-every")
        fits[window] = [(kept[0][1][rank], kept[-1][1][rank],
                         rss_trend([step for step, _ in kept], [rss[rank] for _, rss in kept], args.steps - start))
                        for rank in range(len(kept[0][1]))]
    steady = fits[list(windows)[-1]]
    plot(samples, args.steps // 2, [trend for _, _, trend in steady])
    save_text(LOG, "step " + " ".join(f"rank{rank}_rss_mib" for rank in range(len(steady))) + "\n" + "".join(
        f"{step} " + " ".join(f"{value:.1f}" for value in rss) + "\n" for step, rss in samples)
        + "\n# trainer's last lines\n" + "\n".join(line for line in lines[-6:]) + "\n")
    rows = "\n".join(
        f"| {rank} | {window} | {first:.1f} | {last:.1f} | {trend['slope_mib_per_1k']:+.3f} "
        f"+- {trend['ci_mib_per_1k']:.3f} | {trend['growth_mib']:+.2f} | {trend['noise_mib']:.2f} | "
        f"{'GROWS' if trend['grows'] else 'no'} |"
        for window, ranks in fits.items() for rank, (first, last, trend) in enumerate(ranks))
    verdict = ("RSS grows on some rank beyond the noise in the second half" if any(t["grows"] for _, _, t in steady)
               else "no memory growth on any rank in the second half (slope within noise)")
    malloc = (", ".join(f"{key}={value}" for key, value in malloc_env.items()) if malloc_env
              else "glibc's adaptive malloc thresholds")
    write_section("Soak (SP=2, CPU)", f"""
Machine: {machine()}. Command: `.venv/bin/python benchmarks/soak.py {" ".join(sys.argv[1:])}`
({seconds:.0f} s; load average before: {', '.join(f'{x:.1f}' for x in load_before)}); ranks run with {malloc}.

The real trainer (`deepspeed --num_gpus 2 pretrain_bert.py`, ds_configs/ring_sp2.json: SP=2 ring,
ZeRO-1) on the default dataset: 2 layers, h=64, 4 heads, seq 128, micro-batch 4, {args.steps} steps,
validation every {max(args.steps // 4, 1)} and checkpoints every {max(args.steps // 2, 1)} steps. Each rank's
RSS is read whenever rank 0 logs (every {args.sample_every} steps; samples in `benchmarks/soak.log`);
a line is fitted over steps after a 10% warm-up and over the second half. Growth counts when the
slope's 95% interval excludes 0 and the growth it predicts over the window exceeds
max(2 x residual std, 1 MiB); the verdict is the second half's. With glibc's adaptive thresholds
(`--glibc-default`) the resident set also rises in steps of a few MiB as freed buffers move onto
the heap (module docstring); the fixed thresholds take that out, so what remains is memory held.

| rank | steps fitted | RSS MiB at the start | RSS MiB at the end | slope MiB / 1000 steps (95%) | predicted growth over the window MiB | residual std MiB | growth |
|---|---|---|---|---|---|---|---|
{rows}

Verdict: {verdict}.

![soak](soak.png)
""")
    print(verdict)


if __name__ == "__main__":
    run_benchmark(main)
