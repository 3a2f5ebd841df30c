"""The longest BERT-base training step one GPU holds: SP = 1, ring core, activation checkpointing.

One step = forward, backward, AdamW (torch, fused) of BERT-base (12 layers, h = 768, 12 heads,
vocab 30522, learned positions as long as the sequence), batch 1, no padding (so the ring's
blocks are unmasked: the flash kernel), bf16 autocast with fp32 weights and Adam state, every
layer checkpointed (engine.checkpoint_layers, DeepSpeed's checkpoint), 15% MLM positions.
Sequence lengths double from --start until a step runs out of GPU memory, then halve the gap
down to --step, within --budget-s: a length is not started when the time the lengths before it
predict for it (their growth with s, at most s^2) would overrun what is left of the budget, since
one step at 512K tokens can take minutes. With --write, writes the "GPU check: longest BERT-base step" section
of RESULTS.md after every length, so a search cut short leaves what it measured, and prints it once at the end
(benchmarks/gpu_check.sh runs it, under its share of the check's budget). The CPU counterpart, under a memory
cap and for every variant and SP, is benchmarks/longest_sequence.py.
"""
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch

    from attention_memory import random_chunk  # noqa: E402
    from results import (BenchmarkParser, cuda_needed, machine, positive, replace_section, run_benchmark,  # noqa: E402
                         write_section)

    from megatron.engine import checkpoint_layers  # noqa: E402
    from megatron.model.bert import BertConfig, BertModel  # noqa: E402
    from megatron.model.loss import bert_batch_loss  # noqa: E402
    from megatron.parallel.device import to_device  # noqa: E402

BASE = dict(num_layers=12, hidden_size=768, num_attention_heads=12, vocab_size=30522)


def step_at(seq: int, device, attention: str = "ring") -> dict:
    """Builds the model and runs two steps (the second timed) -> {seconds, peak GiB} or {oom}."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        config = BertConfig(seq_length=seq, max_position_embeddings=seq, attention=attention, hidden_dropout=0.0,
                            attention_dropout=0.0, **BASE)
        model = BertModel(config).to(device)
        checkpoint_layers(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        chunk = to_device(random_chunk(config, 1), device)
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = bert_batch_loss(*model(*chunk.model_inputs()), chunk).total
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        return {"seconds": seconds, "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "loss": loss.item()}
    except torch.cuda.OutOfMemoryError:
        return {"oom": True}
    finally:
        model = optimizer = chunk = loss = None  # noqa: F841 - free before the next length
        torch.cuda.empty_cache()


def predicted_seconds(seq: int, tried: dict):
    """Wall seconds a length should take (model build, two steps), from the lengths that fitted:
    the longest one's time scaled by (seq / its seq) ** growth, the growth measured between the two
    longest (clamped to [1, 2]: linear layers to attention's s^2), 2 after a single length.
    None before any length fitted."""
    fitted = sorted((s, result["wall_s"]) for s, result in tried.items() if not result.get("oom"))
    if not fitted:
        return None
    seq_ref, wall_ref = fitted[-1]
    growth = 2.0
    if len(fitted) > 1:
        seq_prev, wall_prev = fitted[-2]
        measured = math.log(max(wall_ref, 1e-9) / max(wall_prev, 1e-9)) / math.log(seq_ref / seq_prev)
        growth = min(2.0, max(1.0, measured))
    return wall_ref * (seq / seq_ref) ** growth


def search(start: int, step: int, budget_s: float, run, clock=time.perf_counter, report=None,
           safety: float = 1.2) -> tuple:
    """(longest fitting length, {seq: result}, refused) by doubling then bisection in multiples of
    `step`; run(seq) -> step_at's result. A length whose predicted time (x safety) exceeds what is
    left of budget_s is not started: refused = {seq, predicted_s, left_s}, else None.
    report(tried) is called after every length (the partial results)."""
    began, tried, refused = clock(), {}, None
    low, high, seq = None, None, start
    while True:
        left = budget_s - (clock() - began)
        predicted = predicted_seconds(seq, tried)
        if left <= 0 or (predicted is not None and predicted * safety > left):
            refused = {"seq": seq, "predicted_s": predicted, "left_s": max(left, 0.0)}
            print(f"not starting s = {seq}: predicted {predicted or 0:.0f} s, {max(left, 0):.0f} s of the budget left",
                  flush=True)
            break
        started = clock()
        tried[seq] = dict(run(seq), wall_s=clock() - started)
        print(seq, tried[seq], flush=True)
        if report:
            report(tried)
        if tried[seq].get("oom"):
            high = seq
        else:
            low = seq
        if high is None:
            seq *= 2
        elif low is None:
            seq = max(step, high // 2 // step * step)
            if seq in tried:
                break
        elif high - low <= step:
            break
        else:
            seq = (low + high) // 2 // step * step
    return low, tried, refused


def section(args, longest, tried: dict, refused, partial: bool = False) -> str:
    """The RESULTS.md section: the search's settings, the longest length that fitted, every length tried."""
    rows = ["| s | result | step s | tokens/s | peak GiB | wall s |", "|---|---|---|---|---|---|"]
    for seq, result in sorted(tried.items()):
        if result.get("oom"):
            rows.append(f"| {seq} | out of memory | | | | {result['wall_s']:.0f} |")
        else:
            rows.append(f"| {seq} | fits | {result['seconds']:.2f} | {seq / result['seconds']:.0f} | "
                        f"{result['peak_gib']:.1f} | {result['wall_s']:.0f} |")
    if refused:
        why = (f"predicted {refused['predicted_s']:.0f} s, {refused['left_s']:.0f} s of the budget left"
               if refused["predicted_s"] is not None else "the budget was spent")
        rows.append(f"| {refused['seq']} | not started: {why} | | | | |")
    if partial:
        verdict = "**Search in progress** (partial results: the lengths measured so far)."
    elif longest:
        verdict = f"**Longest step that fits: s = {longest}** (target >= 65536)."
    else:
        verdict = "**No length fitted.**"
    return "\n".join([
        f"Machine: {machine()}. `python benchmarks/gpu_longest.py --start {args.start} --step {args.step} "
        f"--budget-s {args.budget_s:.0f}` (a length is started only when the growth measured so far "
        f"predicts it ends within the budget).",
        "",
        "BERT-base (12 layers, h=768, 12 heads, vocab 30522), SP=1, ring core (unmasked blocks: flash), every "
        "layer checkpointed, bf16 autocast, fp32 weights and torch fused AdamW, batch 1, 15% MLM positions. "
        "wall s: the model's build and both steps.",
        "",
        verdict,
        "",
        *rows])


def main(argv=None) -> int:
    parser = BenchmarkParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=positive(int), default=16384)
    parser.add_argument("--step", type=positive(int), default=8192)
    parser.add_argument("--budget-s", type=positive(float), default=150.0,
                        help="start no length predicted to end later")
    args = parser.parse_args(argv)
    cuda_needed()
    device = torch.device("cuda", torch.cuda.current_device())
    heading = "GPU check: longest BERT-base step"

    def report(tried):
        """The partial section after every length: a search cut short keeps it. Into RESULTS.md only: search
        prints each length as it ends, and the section is printed once, complete, at the end."""
        replace_section(heading, section(args, None, tried, None, partial=True))

    longest, tried, refused = search(args.start, args.step, args.budget_s, lambda seq: step_at(seq, device),
                                     report=report if args.write else None)
    write_section(heading, section(args, longest, tried, refused))
    return 0 if longest else 1


if __name__ == "__main__":
    run_benchmark(main)
