"""The longest BERT-base training step one GPU holds: SP = 1, ring core, activation checkpointing.

One step = forward, backward, AdamW (torch, fused) of BERT-base (12 layers, h = 768, 12 heads,
vocab 30522, learned positions as long as the sequence), batch 1, no padding (so the ring's
blocks are unmasked: the flash kernel), bf16 autocast with fp32 weights and Adam state, every
layer checkpointed (engine.checkpoint_layers, DeepSpeed's checkpoint), 15% MLM positions.
Sequence lengths double from --start until a step runs out of GPU memory (or the time budget
is spent), then halve the gap down to --step. Writes the "GPU check: longest BERT-base step"
section of RESULTS.md (benchmarks/gpu_check.sh runs it). The CPU counterpart, under a memory
cap and for every variant and SP, is benchmarks/longest_sequence.py.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from attention_memory import random_chunk  # noqa: E402
from results import machine, write_section  # noqa: E402

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


def search(start: int, step: int, budget_s: float, device) -> tuple:
    """(longest fitting length, {seq: result}) by doubling then bisection in multiples of `step`."""
    began, tried = time.perf_counter(), {}
    low, high, seq = None, None, start
    while time.perf_counter() - began < budget_s:
        tried[seq] = step_at(seq, device)
        print(seq, tried[seq], flush=True)
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
    return low, tried


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", type=int, default=16384)
    parser.add_argument("--step", type=int, default=8192)
    parser.add_argument("--budget-s", type=float, default=150.0, help="stop searching after this long")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_longest.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    longest, tried = search(args.start, args.step, args.budget_s, device)
    rows = ["| s | result | step s | tokens/s | peak GiB |", "|---|---|---|---|---|"]
    for seq, result in sorted(tried.items()):
        if result.get("oom"):
            rows.append(f"| {seq} | out of memory | | | |")
        else:
            rows.append(f"| {seq} | fits | {result['seconds']:.2f} | {seq / result['seconds']:.0f} | "
                        f"{result['peak_gib']:.1f} |")
    text = "\n".join([
        f"Machine: {machine()}. `python benchmarks/gpu_longest.py --start {args.start} --step {args.step}` "
        f"(search budget {args.budget_s:.0f} s).",
        "",
        "BERT-base (12 layers, h=768, 12 heads, vocab 30522), SP=1, ring core (unmasked blocks: flash), every "
        "layer checkpointed, bf16 autocast, fp32 weights and torch fused AdamW, batch 1, 15% MLM positions.",
        "",
        f"**Longest step that fits: s = {longest}** (target >= 65536)." if longest else "**No length fitted.**",
        "",
        *rows])
    print(text)
    if not args.no_write:
        write_section("GPU check: longest BERT-base step", text)
    return 0 if longest else 1


if __name__ == "__main__":
    sys.exit(main())
