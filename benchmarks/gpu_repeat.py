"""Bit for bit on the GPU: a `--deterministic` run repeats itself, and a resume continues it.

Three runs of pretrain_bert.py through the deepspeed launcher (one rank, the JSON given: bf16,
ZeRO 1 in gpu_check.sh; 4 layers, hidden 256, s = 512, the default data set, constant learning
rate so that no schedule depends on where a run stops), every one with `--deterministic`:
  first     trains --iters steps, saving at half of them and at the end;
  repeat    the same command from scratch, without saving;
  resumed   from `first`'s halfway checkpoint (a copy of its folder whose `latest` names it) to the end.
Every loss `repeat` logs equals `first`'s, and every one `resumed` logs equals `first`'s at the same
step: compared as the float64 numbers of metrics.jsonl, not within a tolerance. On CPU this holds
without `--deterministic` (docs/resuming.md); on CUDA only its settings make it hold (megatron/
determinism.py), and only a GPU shows whether they do. With --write, writes the "GPU check: repeat and resume"
section of RESULTS.md; exits 1 when a loss differs.

    python benchmarks/gpu_repeat.py --deepspeed-config ds.json --data .cache/default_data --work .cache/gpu_check
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from launcher_runs import Launches  # noqa: E402
from results import BenchmarkParser, cuda_needed, machine, positive, run_benchmark, write_section  # noqa: E402
import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError  # noqa: E402
from megatron.paths import folder_problem  # noqa: E402

MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "512",
         "--max-position-embeddings", "512", "--lr", "5e-4", "--lr-decay-style", "constant",
         "--lr-warmup-fraction", "0", "--eval-interval", "1000000", "--eval-iters", "1"]
HEADING = "GPU check: repeat and resume"
DEEPSPEED_LOG = re.compile(r"\[\d{4}-\d\d-\d\d ")  # the launcher's own lines: not what stopped a run


class RunFailed(Exception):
    """A launcher run that exited non-zero (a --deterministic op without a deterministic kernel, say)."""


def train(name: str, args, extra: list, port: int) -> dict:
    """One launcher run -> {iteration: logged loss}; its output in <work>/<name>.log. RunFailed
    names the run, its exit code and its last line."""
    log_dir = args.work / name
    shutil.rmtree(log_dir, ignore_errors=True)
    command = ["deepspeed", "--num_gpus", "1", "--master_port", str(port), str(HERE.parent / "pretrain_bert.py"),
               "--deepspeed", "--deepspeed_config", str(args.deepspeed_config), *MODEL, "--deterministic",
               "--train-iters", str(args.iters), "--log-interval", str(args.log_interval),
               "--default-data-dir", str(args.data), "--log-dir", str(log_dir), *extra]
    log = args.work / f"{name}.log"
    with open(log, "w") as output, Launches() as launches:  # a stop here stops the launcher and its rank too
        code = launches.start(command, stdout=output, stderr=subprocess.STDOUT, cwd=HERE.parent).wait()
    if code:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = next((line for line in reversed(lines) if not DEEPSPEED_LOG.match(line)), lines[-1] if lines else "")
        raise RunFailed(f"the {name} run exited {code} ({log.name}: {last.strip()[:200]})")
    return logged_losses(log_dir / "metrics.jsonl")


def logged_losses(metrics: Path) -> dict:
    """{iteration: loss} of a run's training records."""
    records = (json.loads(line) for line in metrics.read_text().splitlines() if line.strip())
    return {record["iteration"]: record["loss"] for record in records if record.get("kind") == "train"}


def halfway_copy(save: Path, copy: Path, iteration: int) -> Path:
    """A copy of a --save folder whose `latest` names its checkpoint at `iteration`, the later ones left out."""
    tag = f"iter_{iteration:07d}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(save, copy, ignore=lambda folder, names: [n for n in names if n.startswith("iter_") and n != tag]
                    if Path(folder) == save else [])
    (copy / "latest").write_text(tag)
    return copy


def differences(want: dict, got: dict) -> list:
    """'iteration N: want vs got' for each iteration `got` logged whose loss is not exactly `want`'s."""
    return [f"iteration {it}: {want.get(it)!r} vs {loss!r}" for it, loss in sorted(got.items()) if want.get(it) != loss]


def main(argv=None) -> int:
    parser = BenchmarkParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepspeed-config", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="the trainer's --default-data-dir")
    parser.add_argument("--work", type=Path, required=True, help="run folders, logs and checkpoints go here")
    parser.add_argument("--iters", type=positive(int), default=20)
    parser.add_argument("--log-interval", type=positive(int), default=5)
    parser.add_argument("--master-port", type=int, default=29541)
    args = parser.parse_args(argv)
    if args.iters % 2 or (args.iters // 2) % args.log_interval:
        parser.error("--iters must be even and its half a multiple of --log-interval (the resumed run logs "
                     "the same windows)")
    cuda_needed()
    if problem := folder_problem("--work", str(args.work)):
        raise ConfigError(*problem)
    args.work.mkdir(parents=True, exist_ok=True)
    save, half = args.work / "repeat_save", args.iters // 2
    shutil.rmtree(save, ignore_errors=True)
    header = (f"Machine: {machine()}. `python benchmarks/gpu_repeat.py` ({args.iters} steps, resumed at {half}; "
              f"JSON {args.deepspeed_config.name}: {json.dumps(json.loads(args.deepspeed_config.read_text()))}). "
              "Three launcher runs with `--deterministic` (module docstring); '=' is the first run's loss exactly.")
    try:
        first = train("repeat_first", args, ["--save", str(save), "--save-interval", str(half)], args.master_port)
        repeat = train("repeat_again", args, [], args.master_port + 1)
        resumed = train("repeat_resumed", args, ["--load", str(halfway_copy(save, args.work / "repeat_half", half))],
                        args.master_port + 2)
    except RunFailed as failure:
        return report(f"{header}\n\n**Not run to the end**: {failure}.", 1)
    problems = {"repeat": differences(first, repeat), "resumed": differences(first, resumed)}
    if set(repeat) != set(first) or set(resumed) != {it for it in first if it > half}:
        problems["logged"] = [f"iterations first {sorted(first)}, repeat {sorted(repeat)}, resumed {sorted(resumed)}"]
    rows = [f"| {it} | {loss!r} | {'=' if repeat.get(it) == loss else repr(repeat.get(it))} | "
            f"{'-' if it not in resumed else '=' if resumed[it] == loss else repr(resumed[it])} |"
            for it, loss in sorted(first.items())]
    verdict = ("**Bit for bit**: the repeat and the resume logged exactly the first run's losses."
               if not any(problems.values()) else
               "**Not bit for bit**: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in problems.items() if v))
    text = "\n".join([header, "", verdict, "", "| iteration | first | repeat | resumed |", "|---|---|---|---|", *rows])
    return report(text, 1 if any(problems.values()) else 0)


def report(text: str, code: int) -> int:
    """Prints the section, writes it into RESULTS.md (with --write) -> the exit code."""
    write_section(HEADING, text)
    return code


if __name__ == "__main__":
    run_benchmark(main)
