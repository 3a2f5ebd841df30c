"""Which layer the README's main job trains: the classic BERT layer or the modern one (rotary
positions, a local 128-token window in two layers of three, GeGLU, no biases, no dropout, no
sentence-order head: ModernBERT's layout with the corpus' own vocab),
at the main job's settings (packed samples of 1024 tokens, ring attention at sequence-parallel
size 2, 2 CPU ranks over gloo, the embedded default corpus and vocab).

Both candidates run at once through the real `deepspeed` launcher, each with the main job's flags
and its own model flags, for the same wall time: side by side they share the machine (and
whatever else loads it) alike, so the MLM loss each has reached at a given time compares what
each learns in equal time. Each logs every --log-interval steps (the mean MLM loss and accuracy of
those steps); the table reads both curves at evenly spaced times, next to the corpus' unigram
cross-entropy (what a model that ignores context reaches). Sizes: the classic model is the main
job's before this comparison (2 layers, 128 wide, FFN 512); the modern one has 3 layers (global,
local, local) of the same width with a GeGLU FFN of 192, about the same parameters and FLOPs per
token.

    .venv/bin/python benchmarks/main_job.py [--seconds 600] [--log-interval 25]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import numpy as np

    from launcher_runs import Launches  # noqa: E402
    from packing import LoadSampler  # noqa: E402
    from results import BenchmarkParser, machine, positive, run_benchmark, write_section  # noqa: E402

    from megatron.data.default_dataset import prepare_default_dataset  # noqa: E402
    from megatron.data.indexed_dataset import make_dataset  # noqa: E402
    from megatron.errors import ConfigError  # noqa: E402
    from megatron.parallel.spawn import free_port  # noqa: E402
    from megatron.paths import folder_problem  # noqa: E402

DEFAULT_OUT = str(REPO / ".cache" / "bench_main_job")
MAIN_JOB = ["--deepspeed", "--deepspeed_config", "ds_configs/ring_sp2.json", "--pack-samples", "--seq-length", "1024",
            "--micro-batch-size", "2", "--lr", "1e-3", "--lr-warmup-fraction", "0.02", "--eval-interval", "100000"]
CANDIDATES = {
    "classic": ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
                "--max-position-embeddings", "1024"],
    "modern": ["--num-layers", "3", "--hidden-size", "128", "--num-attention-heads", "4", "--ffn-hidden-size", "192",
               "--position-embedding-type", "rope", "--rotary-base", "10000", "--local-attention-window", "128",
               "--global-attention-every", "3", "--mlp-type", "geglu", "--disable-bias-linear",
               "--layernorm-epsilon", "1e-5", "--embedding-layernorm", "--no-first-layer-attention-norm",
               "--type-vocab-size", "0", "--bert-no-binary-head", "--hidden-dropout", "0", "--attention-dropout", "0"],
}


def launch(launches: Launches, name: str, out: Path, data_dir: str, train_iters: int,
           log_interval: int) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TORCH_EXTENSIONS_DIR": str(REPO / ".cache" / "torch_extensions")}
    command = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
               str(REPO / "pretrain_bert.py"), *MAIN_JOB, *CANDIDATES[name], "--train-iters", str(train_iters),
               "--log-interval", str(log_interval), "--default-data-dir", data_dir, "--log-dir", str(out / name)]
    with open(out / f"{name}.log", "w") as log:
        return launches.start(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def curve(metrics: Path) -> list:
    """[(seconds since the run's start record, mlm loss, mlm accuracy, iteration)]: the same start-up
    (data, model) for both, so the times compare."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    start = next(r["time"] for r in records if r.get("kind") == "start")
    return [(r["time"] - start, r["mlm_loss"], r["mlm_accuracy"], r["iteration"])
            for r in records if r.get("kind") == "train"]


def started(metrics: Path) -> bool:
    return metrics.is_file() and '"kind": "train"' in metrics.read_text()


def train_side_by_side(runs: dict, out: Path, seconds: float) -> float:
    """Waits until every candidate trains (start-up is not training), then `seconds` more, or less when all
    have finished -> when the last one began. A run that fails, or ends before it trained, stops the comparison
    (a run that finished its --train-iters while the other still started is done, not failed)."""
    while not all(started(out / name / "metrics.jsonl") for name in runs):
        check_runs(runs, out)
        time.sleep(2)
    began = time.time()
    while time.time() < began + seconds and any(run.poll() is None for run in runs.values()):
        check_runs(runs, out)
        time.sleep(min(2.0, max(0.0, began + seconds - time.time())))
    check_runs(runs, out)
    return began


def check_runs(runs: dict, out: Path) -> None:
    for name, run in runs.items():
        code = run.poll()
        if code is not None and (code != 0 or not started(out / name / "metrics.jsonl")):
            sys.exit(f"main_job.py: error: the {name} run ended with exit code {code} "
                     f"{'before it trained' if code == 0 else 'early'}; see {out / name}.log")


MARK = ".main_job"  # in --out: the runs there are this tool's, which its next run replaces


def check_out(out: Path) -> None:
    """--out as this tool uses it: a folder (made if missing) whose run folders and logs are its own earlier
    runs (MARK, or the default folder), replaced here, or not there (the trainer appends to a metrics.jsonl, so
    they were removed, whoever wrote them)."""
    if problem := folder_problem("--out", str(out)):
        raise ConfigError(*problem)
    ours = (out / MARK).is_file() or out.resolve() == Path(DEFAULT_OUT).resolve()
    theirs = [name for name in (*CANDIDATES, *(f"{name}.log" for name in CANDIDATES)) if (out / name).exists()]
    if theirs and not ours:
        raise ConfigError(f"--out {out} holds {', '.join(theirs)}, which main_job.py did not write there (its runs "
                          f"are replaced by its next run)", "pass --out a new folder, or one of its earlier runs")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).write_text("benchmarks/main_job.py's runs: its next run into this folder replaces them\n")
    for name in CANDIDATES:  # metrics.jsonl appends: an earlier run's records must not count
        shutil.rmtree(out / name, ignore_errors=True)


def at(points: list, seconds: float):
    """The last logged point at or before `seconds` (None before the first)."""
    before = [point for point in points if point[0] <= seconds]
    return before[-1] if before else None


def unigram_entropy(prefix: str) -> float:
    """Cross-entropy (nats) of the corpus' tokens under their own frequencies."""
    dataset = make_dataset(prefix, "mmap")
    counts = np.bincount(np.concatenate([dataset[i] for i in range(len(dataset))]).astype(np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def table(curves: dict, seconds: float, rows: int, unigram: float) -> str:
    lines = ["| time (s) | " + " | ".join(f"{name}: step, MLM loss, accuracy" for name in curves) + " |",
             "|---|" + "---|" * len(curves)]
    for k in range(1, rows + 1):
        t = seconds * k / rows
        cells = []
        for points in curves.values():
            point = at(points, t)
            cells.append("-" if point is None else f"{point[3]}, {point[1]:.3f}, {100 * point[2]:.1f}%")
        lines.append(f"| {t:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nUnigram cross-entropy of the corpus: {unigram:.2f} nats."


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=positive(float), default=600, help="wall time both run side by side")
    parser.add_argument("--log-interval", type=positive(int), default=25)
    parser.add_argument("--train-iters", type=positive(int), default=3000,
                        help="the schedule both follow (warm-up 2%%, linear decay to this step); the runs stop at "
                        "--seconds")
    parser.add_argument("--rows", type=positive(int), default=6)
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="the folder of both runs (their logs, run folders and metrics); a run of this tool "
                        "replaces its earlier ones there, and refuses a folder holding other runs")
    return parser.parse_args(argv)


def main():
    args = parse_args()
    out = Path(args.out)
    check_out(out)
    data = prepare_default_dataset(REPO / ".cache" / "default_data")
    load = LoadSampler()
    try:
        with Launches() as launches:  # stopped at the end, or on an error, Ctrl-C or SIGTERM here
            runs = {name: launch(launches, name, out, str(REPO / ".cache" / "default_data"), args.train_iters,
                                 args.log_interval) for name in CANDIDATES}
            began = train_side_by_side(runs, out, args.seconds)
    finally:
        load.stop()
    curves = {name: curve(out / name / "metrics.jsonl") for name in CANDIDATES}
    seconds = min(points[-1][0] for points in curves.values())
    body = (f"Machine: {machine()}; {load.describe()}. Started {time.strftime('%Y-%m-%d %H:%M', time.gmtime(began))} "
            f"UTC.\n\nCommand: `.venv/bin/python benchmarks/main_job.py --seconds {args.seconds:g} --log-interval "
            f"{args.log_interval} --train-iters {args.train_iters}` (both candidates side by side, {seconds:.0f} s of training each).\n\n"
            f"Main job flags: `{' '.join(MAIN_JOB)}`; classic: `{' '.join(CANDIDATES['classic'])}`; modern: "
            f"`{' '.join(CANDIDATES['modern'])}`.\n\n"
            + table(curves, seconds, args.rows, unigram_entropy(str(data.data_prefix))))
    write_section("Main job: classic or modern layers", body)


if __name__ == "__main__":
    run_benchmark(main)
