"""Attention kernels and the P > 1 math on one device: the ring, BigBird and the local sliding-window
core (window LOCAL_WINDOW) at SP = 1, 2, 4 as P virtual ranks in one process
(megatron/model/attention/simulate.py), against a float64 softmax(QK^T + mask)V reference, in fp32
and bf16, for three sample layouts (local layers: varlen flash with a window in bf16, memory-
efficient tiles in fp32):

  unpadded  one segment per sample, no padding: "full" blocks (flash on CUDA in bf16)
  padded    one segment per sample, some padding: varlen flash in bf16, per-tile memory-efficient
            with the tile's bias in fp32
  packed    several segments per sample and padding: "mixed" blocks, the same kernels

On CUDA it also times one unmasked block (forward + backward) with each kernel that can run it
(flash, cuDNN, memory-efficient), the evidence for blocks.UNMASKED_CUDA_KERNEL, and one packed
block with varlen flash against per-tile memory-efficient with a bias. The same checks run on
CPU inside kernels.emulated_cuda() (tests/test_cuda_emulated.py). With --write, writes the
"GPU check: attention kernels" section of RESULTS.md (benchmarks/gpu_check.sh runs it);
exits 1 if an error is above its tolerance. Runs on CPU too (small shapes: tests use it).
"""
import collections
import itertools
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch

    from megatron.errors import ConfigError  # noqa: E402
    from megatron.model.attention import bigbird, blocks, local, masks, rules, simulate  # noqa: E402
    from results import BenchmarkParser, cuda_needed, machine, positive, run_benchmark, write_section  # noqa: E402

TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}  # max |error| / max |reference|
LAYOUTS = ("unpadded", "padded", "packed")
VARIANTS = ("ring", "bigbird", "local")
LOCAL_WINDOW = 32  # 16 keys each side: at SP = 4 a chunk of the tests' 128 tokens reaches into its neighbours
BLOCK = 16  # BigBird's blocks in accuracy (window 3, 2 random)


def segment_ids(layout: str, b: int, s: int) -> torch.Tensor:
    ids = torch.ones(b, s, dtype=torch.long)
    if layout == "padded":
        for i in range(b):
            ids[i, s - (i + 1) * s // (2 * b):] = 0  # sample i: the last (i+1)/2b of it is padding
    elif layout == "packed":
        for i in range(b):
            cuts = sorted({s // 5 + 7 * i, s // 2 + 3 * i, 4 * s // 5})
            for number, cut in enumerate(cuts, start=2):
                ids[i, cut:] = number
            ids[i, s - s // 16 * (i % 2):] = 0
    return ids


def bigbird_allowed(s: int, block: int, window: int, num_random: int, seed: int) -> torch.Tensor:
    """[s, s] token mask of BigBird's block pattern (iteration 0, layer 0)."""
    n = s // block
    slots, valid = bigbird.block_pattern(n, window, num_random, seed, 0, 0)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for row in range(n):
        allowed[row, slots[row][valid[row]]] = True
    allowed[[0, -1], :] = True
    allowed[:, [0, -1]] = True
    return allowed.repeat_interleave(block, 0).repeat_interleave(block, 1)


def reference(q, k, v, grad_out, allowed):
    """float64 softmax attention under allowed [b, s, s] (rows that see nothing give 0) -> out, dq, dk, dv."""
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    empty = ~allowed.any(-1)[:, None, :, None]
    scores = scores.masked_fill(~allowed[:, None], float("-inf")).masked_fill(empty, 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1).masked_fill(empty, 0.0), v)
    out.backward(grad_out.double())
    return out.detach(), q.grad, k.grad, v.grad


def count_kernels(force_masked: str | None = None, force_unmasked: str | None = None):
    """Wraps blocks.kernel to count the kernels chosen (and whether for a masked block) ->
    (Counter, original). `force_masked` / `force_unmasked`: the kernel every masked / unmasked
    block or tile takes instead (a packed block's tiles of one segment each are unmasked)."""
    counts, choose = collections.Counter(), blocks.kernel

    def counted(q, masked, varlen=False):
        forced = force_masked if masked else force_unmasked
        name = forced or choose(q, masked, varlen)
        counts[name + (" masked" if masked else " unmasked")] += 1
        return name
    blocks.kernel = counted
    return counts, choose


UNMASKED_ROUTES = {name: (None, name) for name in ("flash", "cudnn", "efficient")}  # each kernel of a block
# how a packed block is computed: its label -> (kernel of the block, kernel of each tile of one segment)
PACKED_ROUTES = {"varlen_flash": ("varlen_flash", None), "flash tiles": ("efficient", "flash"),
                 "efficient tiles": ("efficient", "efficient")}
LOCAL_ROUTES = {"varlen_flash": ("varlen_flash", None), "efficient": ("efficient", None)}  # tiles with their bias


def accuracy(variant: str, size: int, layout: str, dtype, device, b=2, s=256, heads=4, d=64, block=BLOCK,
             seed=0, force_masked: str | None = None, unmasked: str | None = None) -> dict:
    """Max relative errors of out, dq, dk, dv of the simulated core against float64, and the
    kernels it ran (`force_masked`: count_kernels')."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad_out = (torch.randn(b, s, heads, d, generator=g) for _ in range(4))
    ids = segment_ids(layout, b, s)
    allowed = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] != 0)
    if variant == "bigbird":
        allowed = allowed & bigbird_allowed(s, block, 3, 2, 1234)
    if variant == "local":
        positions = torch.arange(s)
        allowed = allowed & ((positions[:, None] - positions[None, :]).abs() <= LOCAL_WINDOW // 2)
    want = reference(q, k, v, grad_out, allowed)
    inputs = [x.to(device, dtype) for x in (q, k, v)] + [ids.to(device), grad_out.to(device, dtype)]
    counts, choose = count_kernels(force_masked)
    default = blocks.UNMASKED_CUDA_KERNEL
    blocks.UNMASKED_CUDA_KERNEL = unmasked or default
    try:
        if variant == "ring":
            got, _ = simulate.ring_attention(*inputs, size)
        elif variant == "local":
            got, _ = simulate.local_attention(*inputs, size, LOCAL_WINDOW)
        else:
            got, _ = simulate.bigbird_attention(*inputs, size, block, window=3, num_random=2, seed=1234)
    finally:
        blocks.kernel, blocks.UNMASKED_CUDA_KERNEL = choose, default
    errors = {name: ((a.double().cpu() - w).abs().max() / w.abs().max()).item()
              for name, a, w in zip(("out", "dq", "dk", "dv"), got, want)}
    return {"variant": variant, "P": size, "layout": layout, "dtype": str(dtype).replace("torch.", ""),
            "errors": errors, "kernels": dict(counts), "ok": max(errors.values()) <= TOLERANCE[dtype]}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(step, device, repeats: int) -> float:
    """ms per call of step() after two warm-up calls."""
    for _ in range(2):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    _sync(device)
    return (time.perf_counter() - start) / repeats * 1e3


def _not_available(error) -> str:
    return f"not available: {str(error).splitlines()[0][:80]}"


def time_kernels(device, dtype=torch.bfloat16, b=1, heads=16, s=4096, d=64, repeats=10) -> list:
    """(kernel, ms per block forward + backward) for an unmasked [b, heads, s, d] block (UNMASKED_ROUTES)."""
    q, k, v, grad_out = (torch.randn(b, heads, s, d, device=device, dtype=dtype) for _ in range(4))
    unmasked = masks.BlockMask(None, None)

    def step():
        out, lse = blocks.forward(q, k, v, unmasked, d ** -0.5)
        blocks.backward(grad_out, q, k, v, unmasked, out, lse, d ** -0.5)
    return _time_routes(step, device, UNMASKED_ROUTES, repeats)


def _time_routes(step, device, routes: dict, repeats: int) -> list:
    """(route, ms per step) with the kernels forced as each of `routes` says (count_kernels)."""
    rows = []
    for name, forced in routes.items():
        _, choose = count_kernels(*forced)
        try:
            rows.append((name, _time(step, device, repeats)))
        except RuntimeError as error:
            rows.append((name, _not_available(error)))
        finally:
            blocks.kernel = choose
    return rows


def packed_block_step(device, dtype=torch.bfloat16, b=1, heads=16, s=4096, d=64, segment=500):
    """One packed [b, heads, s, d] block's forward + backward (segments of `segment` tokens), its plan made once."""
    ids = (torch.arange(s) // segment + 1).expand(b, s).contiguous()
    host = ids.numpy()
    plan = masks.block_plan(host, host, device, cuda=True)
    ids = ids.to(device)
    q, k, v, grad_out = (torch.randn(b, s, heads, d, device=device, dtype=dtype).transpose(1, 2) for _ in range(4))

    def step():
        out, lse = blocks.attend(q, k, v, ids, ids, plan, d ** -0.5)
        blocks.attend_backward(grad_out, q, k, v, ids, ids, plan, out, lse, d ** -0.5)
    return step


def time_masked_kernels(device, repeats=10, **shape) -> list:
    """(route, ms per block forward + backward) for packed_block_step: one varlen flash call against
    flash and memory-efficient kernels tile by tile (PACKED_ROUTES)."""
    return _time_routes(packed_block_step(device, **shape), device, PACKED_ROUTES, repeats)


def top_kernels(step, device, routes: dict, top: int = 6) -> list:
    """(kernel, route, calls per step, device µs per step) of the `top` kernels by device time in one
    profiled step down each of `routes`: where a block's milliseconds go, beyond its total."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    rows = []
    for name, forced in routes.items():
        _, choose = count_kernels(*forced)
        try:
            step()
            _sync(device)
            with profile(activities=[activity]) as prof:
                step()
                _sync(device)
        except RuntimeError as error:
            rows.append((_not_available(error), name, 0, 0.0))
            continue
        finally:
            blocks.kernel = choose
        spent = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        events = sorted(prof.key_averages(), key=lambda e: getattr(e, spent), reverse=True)
        rows += [(event.key[:70], name, event.count, getattr(event, spent)) for event in events[:top]]
    return rows


def time_local_layer(device, dtype=torch.bfloat16, b=1, heads=16, s=16384, d=64, window=128, segment=500,
                     repeats=10) -> list:
    """(kernel, ms per local layer forward + backward at SP = 1) on packed [b, s, heads, d] (segments
    of `segment` tokens), its plan made once: one windowed varlen flash call against 64-row
    memory-efficient tiles with their bias."""
    core = local.LocalAttention(SimpleNamespace(local_attention_window=window, head_dim=d))
    ids = (torch.arange(s) // segment + 1).expand(b, s).contiguous().to(device)
    plan = core.plan(ids)
    q, k, v, grad_out = (torch.randn(b, s, heads, d, device=device, dtype=dtype) for _ in range(4))
    return _time_routes(lambda: simulate._run_function(local._LocalAttention, (q, k, v), grad_out,
                                                       (plan, core.seq, d ** -0.5)),
                        device, LOCAL_ROUTES, repeats)


def run(device, dtypes, sizes, layouts=LAYOUTS, **shape) -> list:
    """Every core, P and layout per dtype; then, in fp16/bf16, the ring's unmasked blocks on cuDNN
    (faster than flash per block on the H200; the rows that would make it the default). Each row is
    printed as it ends (on CPU the default --seq takes minutes)."""
    cases = [(variant, size, layout, dtype, {}) for dtype in dtypes for variant in VARIANTS for size in sizes
             for layout in layouts]
    cases += [("ring (cudnn)", size, "unpadded", dtype, {"unmasked": "cudnn"})
              for dtype in dtypes if dtype in (torch.float16, torch.bfloat16)
              for size in sizes if "unpadded" in layouts]  # unpadded: every block unmasked
    rows = []
    for number, (variant, size, layout, dtype, options) in enumerate(cases, start=1):
        row = {**accuracy(variant.split()[0], size, layout, dtype, device, **options, **shape), "variant": variant}
        print(f"[{number}/{len(cases)}] {variant} P={size} {layout} {row['dtype']}: largest error "
              f"{max(row['errors'].values()):.1e} ({'ok' if row['ok'] else 'ABOVE the tolerance'})", flush=True)
        rows.append(row)
    return rows



def seq_problem(seq: int, sizes: list) -> str | None:
    """Why --seq cannot be split as the simulated ranks need (P divides it; BigBird's rules at each P), or None."""
    for size in sizes:
        if seq % size:
            return f"--seq {seq} is not a multiple of --sizes {size}: the simulated ranks hold equal chunks"
        bigbird = SimpleNamespace(seq_length=seq, attention_dropout=0.0, bigbird_block_size=BLOCK,
                                  bigbird_num_window_blocks=3, bigbird_num_random_blocks=2)
        try:
            rules.BigBird.check(bigbird, size)
        except ConfigError as error:
            return f"--seq {seq} does not suit BigBird at P={size}: {error.problem}"
    return None


def table(results: list) -> str:
    lines = ["| core | P | layout | dtype | out | dq | dk | dv | kernels | ok |", "|" + "---|" * 10]
    for r in results:
        e = r["errors"]
        kernels = ", ".join(f"{k} x{n}" for k, n in sorted(r["kernels"].items()))
        lines.append(f"| {r['variant']} | {r['P']} | {r['layout']} | {r['dtype']} | {e['out']:.1e} | {e['dq']:.1e} | "
                     f"{e['dk']:.1e} | {e['dv']:.1e} | {kernels} | {'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = BenchmarkParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--sizes", type=positive(int), nargs="+", default=[1, 2, 4])
    parser.add_argument("--seq", type=positive(int), default=1024,
                        help=f"tokens per sample: a multiple of {BLOCK} x each --sizes, at least {7 * BLOCK}")
    args = parser.parse_args(argv)
    if problem := seq_problem(args.seq, args.sizes):
        nearest = next(seq for seq in itertools.count(args.seq) if not seq_problem(seq, args.sizes))
        parser.error(f"{problem}; give a --seq that suits every size (the nearest is {nearest})")
    if args.device == "cuda":
        cuda_needed()
    device = torch.device(args.device)
    results = run(device, [getattr(torch, name) for name in args.dtypes], args.sizes, s=args.seq)
    body = [f"Machine: {machine()}. `python benchmarks/gpu_kernels.py` (b=2, s={args.seq}, 4 heads of 64; BigBird "
            f"blocks of 16, window 3, 2 random; local window {LOCAL_WINDOW}). Errors: max |ours - float64| / max "
            "|float64|; tolerance "
            f"{TOLERANCE[torch.float32]:g} (fp32), {TOLERANCE[torch.bfloat16]:g} (bf16). P > 1 runs as P virtual ranks "
            "in one process (attention/simulate.py).", "", table(results)]
    if device.type == "cuda":
        for title, timings in (
                ("One unmasked block [1, 16, 4096, 64] bf16", time_kernels(device)),
                ("One packed block [1, 16, 4096, 64] bf16 (segments of 500 tokens)", time_masked_kernels(device)),
                ("One local layer [1, 16384, 16, 64] bf16 at SP = 1 (window 128, segments of 500 tokens)",
                 time_local_layer(device))):
            body += ["", f"{title}, forward + backward:", "", "| kernel | ms |", "|---|---|"]
            body += [f"| {name} | {ms if isinstance(ms, str) else f'{ms:.2f}'} |" for name, ms in timings]
        body += ["", "Where the packed block's time goes (torch.profiler, one step, the top kernels by GPU time):", "",
                 "| kernel | route | calls | GPU µs |", "|---|---|---|---|"]
        body += [f"| `{kernel}` | {name} | {calls} | {us:.0f} |"
                 for kernel, name, calls, us in top_kernels(packed_block_step(device), device, PACKED_ROUTES)]
    write_section("GPU check: attention kernels", "\n".join(body))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    run_benchmark(main)
