"""Time spent planning attention per micro-batch: a 12-layer ring BERT step (forward + backward)
at seq 8192 on packed samples, SP = 1, with `ring.schedule` (gather, host copy, tile plan)
timed and counted. Run once per source tree (`--tree`, default this one) in its own process,
so the code of an older commit can be measured beside this one:

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/plan_time.py --tree /tmp/old --tree . --write

Writes the "Attention planning per micro-batch" section of RESULTS.md with --write.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import ConfigError
from results import BenchmarkParser, machine, positive, run_benchmark, write_section

HERE = Path(__file__).resolve().parent
SEGMENT = 1024  # MEASURE's max_segment_length: --seq below it cannot pack its samples

MEASURE = r"""
import json, sys, time, torch
from megatron.model.attention import ring
from megatron.model.bert import BertConfig, BertModel
from megatron.data.batch import BertBatch
from megatron.model.loss import bert_batch_loss

seq, layers, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
config = BertConfig(vocab_size=1000, hidden_size=256, num_attention_heads=4, num_layers=layers, seq_length=seq,
                    max_position_embeddings=1024, max_segment_length=1024, hidden_dropout=0.0,
                    attention_dropout=0.0, attention="ring")
model = BertModel(config)
g = torch.Generator().manual_seed(1)
lengths = torch.randint(200, 1000, (seq // 200,), generator=g).tolist()
segment_ids, position_ids, start = torch.zeros(1, seq, dtype=torch.long), torch.zeros(1, seq, dtype=torch.long), 0
for number, length in enumerate(lengths, start=1):
    length = min(length, seq - 7 - start)
    if length <= 0:
        break
    segment_ids[0, start:start + length] = number
    position_ids[0, start:start + length] = torch.arange(length)
    start += length
tokens = torch.randint(5, 1000, (1, seq), generator=g).masked_fill(segment_ids == 0, 0)
loss_mask = (torch.rand(1, seq, generator=g) < 0.15) & (segment_ids != 0)
batch = BertBatch(tokens=tokens, token_types=torch.zeros_like(tokens), segment_ids=segment_ids,
                  position_ids=position_ids, labels=tokens.clone(), loss_mask=loss_mask,
                  sop_labels=torch.zeros_like(tokens))
calls, spent, original = [0], [0.0], ring.schedule

def timed(*args, **kwargs):
    start = time.perf_counter()
    result = original(*args, **kwargs)
    spent[0] += time.perf_counter() - start
    calls[0] += 1
    return result

ring.schedule = timed
steps = []
for repeat in range(repeats + 1):
    calls[0], spent[0] = 0, 0.0
    batch = batch.mapped(torch.clone)  # a new micro-batch
    start = time.perf_counter()
    bert_batch_loss(*model(*batch.model_inputs()), batch).total.backward()
    if repeat:  # the first is warm-up
        steps.append((time.perf_counter() - start, spent[0], calls[0]))
step = sorted(steps)[len(steps) // 2]
print(json.dumps({"step_s": step[0], "plan_s": step[1], "plan_calls": step[2], "segments": int(segment_ids.max())}))
"""


def measure(tree: Path, seq: int, layers: int, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(seq), str(layers), str(repeats)],
                          env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode:  # the child's own last line (its exception), not the script it was given
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ConfigError(f"measuring {tree} failed: {last}", "fix that tree, or leave it out of --tree")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout
    return {**result, "tree": str(tree), "commit": commit.strip() or f"{tree} (not a git tree)"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=lambda path: Path(path).resolve(),
                        help="a source tree to measure (repeatable; default: this one)")
    parser.add_argument("--seq", type=positive(int), default=8192,
                        help=f"tokens per sample, at least the packed segments' cap {SEGMENT}")
    parser.add_argument("--layers", type=positive(int), default=12)
    parser.add_argument("--repeats", type=positive(int), default=3)
    args = parser.parse_args(argv)
    if args.seq < SEGMENT:
        parser.error(f"--seq {args.seq} is shorter than the packed samples' segment length {SEGMENT}; "
                     f"give --seq {SEGMENT} or more")
    args.tree = args.tree or [HERE.parent]
    for tree in args.tree:
        if not (tree / "megatron").is_dir():
            parser.error(f"--tree {tree} is not a source tree of this project (no megatron/ in it); "
                         "give a checkout, e.g. from `git worktree add`")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = [measure(tree, args.seq, args.layers, args.repeats) for tree in args.tree]
    lines = [f"Machine: {machine()}. `python benchmarks/plan_time.py` ({args.layers} layers, hidden 256, ring at "
             f"SP = 1, seq {args.seq}, {rows[0]['segments']} packed segments, fp32, 1 sample; median of "
             f"{args.repeats} forward + backward steps, each on a new micro-batch).", "",
             "| code | ring.schedule calls per step | planning s per step | step s | planning share |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['commit']} | {row['plan_calls']} | {row['plan_s']:.4f} | {row['step_s']:.2f} | "
                     f"{row['plan_s'] / row['step_s']:.1%} |")
    write_section("Attention planning per micro-batch", "\n".join(lines))
    return 0


if __name__ == "__main__":
    run_benchmark(main)
