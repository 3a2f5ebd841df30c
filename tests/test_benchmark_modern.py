"""benchmarks/modern.py's pieces at tiny sizes: both contestants' timed steps run on the same model
(equal first losses), the ratio and the 'not run' estimate reach the table, the local layer alone
is timed against its masked s x s twin, and the halo bytes counted from the local core's
exchanges equal the model at SP = 2 and 4. No wall-clock asserts; CPU only (the GPU rows are
benchmarks/gpu_check.sh's)."""
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import modern  # noqa: E402

pytest.importorskip("transformers")
TINY = dict(num_layers=3, hidden_size=64, num_attention_heads=2, ffn_hidden_size=96, vocab_size=1024,
            local_attention_window=32)


def test_contestants_compute_the_same_model_and_their_ratio_reaches_the_table():
    contestants = modern.build_contestants(modern.CONTESTANTS, 256, TINY)
    assert [modern.model_config(256, TINY).is_local_layer(i) for i in range(3)] == [False, True, True]
    batch = modern.make_batch(1, 256, 1024, seed=3, token_types=False)
    losses = {name: step(batch) for name, step in contestants.items()}  # the same starting weights
    for name in ("hf", "hf-sparse"):
        torch.testing.assert_close(losses[name], losses["ours"], rtol=0, atol=2e-5)
    lines = []
    results = modern.bench_steps(contestants, [128, 256], repeats=2, long_repeats=1, warmup=0,
                                 max_step_s=math.inf, shape=TINY, log=lines.append)
    assert set(results) == {128, 256} and len(lines) == 6
    for row in results.values():
        assert set(row) == set(modern.CONTESTANTS)
        assert all(r["tokens_per_s"] > 0 and r["repeats"] == 2 for r in row.values())
    table = modern.step_table(results, modern.CONTESTANTS)
    ratio = results[256]["ours"]["tokens_per_s"] / results[256]["hf"]["tokens_per_s"]
    assert f"**{ratio:.2f}x**" in table.splitlines()[-1]
    # a contestant whose estimated step exceeds the limit is not run; ours always is
    skipped = modern.bench_steps({n: contestants[n] for n in ("ours", "hf")}, [128, 256], repeats=1,
                                 long_repeats=1, warmup=0, max_step_s=1e-9, shape=TINY, log=lines.append)
    assert "tokens_per_s" in skipped[256]["ours"] and skipped[256]["hf"]["estimated_s"] > 0
    assert "not run: " in modern.step_table(skipped, ("ours", "hf")).splitlines()[-1]
    # the GPU's paragraph: a profiled step of each contestant that ran (no device events on CPU: zeros)
    paragraph = modern.where_the_time_goes(contestants, skipped, 128, TINY)
    assert "at 128 tokens" in paragraph and "| ours | " in paragraph and "| hf | " in paragraph
    assert "| ours | " in modern.where_the_time_goes(contestants, skipped, 256, TINY)
    assert "| hf | " not in modern.where_the_time_goes(contestants, skipped, 256, TINY)  # not run there


def test_step_estimate_fits_linear_plus_quadratic():
    def seconds(s):
        return 1e-3 * s + 1e-7 * s * s

    assert modern.estimate_seconds({}, 4096) is None
    assert modern.estimate_seconds({1024: seconds(1024), 2048: seconds(2048)}, 8192) == pytest.approx(seconds(8192))
    assert modern.estimate_seconds({1024: 2.0}, 2048) == pytest.approx(8.0)  # one point: s^2 (an upper bound)


def test_local_layer_alone_and_its_masked_twin_are_timed():
    layer = modern.bench_local_layer([128, 256], window=32, heads=2, head_dim=8, repeats=1, max_step_s=math.inf,
                                     log=lambda _: None)
    for row in layer.values():
        assert all(row[name] > 0 for name in ("ours", "masked s x s", "plan"))
    steps = {s: {"ours": {"tflops": 1e-3 * s}} for s in (128, 256)}
    table = modern.quadratic_table(steps, layer)
    assert "| 256 | 256.0 | **2.00** |" in table


def test_the_local_cores_masked_twin_is_the_same_attention():
    """The baseline times the same math: SDPA under the s x s window mask equals the local core."""
    from types import SimpleNamespace

    from megatron.model.attention import local
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 200, 2, 8, generator=g) for _ in range(3))
    core = local.LocalAttention(SimpleNamespace(local_attention_window=32, head_dim=8))
    ours = core(q, k, v, torch.ones(1, 200, dtype=torch.long))
    masked = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                                             attn_mask=modern.window_mask(200, 16))
    torch.testing.assert_close(ours, masked.transpose(1, 2), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("size", [2, 4])
def test_halo_bytes_equal_the_model(size, dtype):
    window, heads, head_dim = 32, 2, 8
    sent = modern.halo_bytes(size, 256, window, heads, head_dim, dtype)
    assert sent == [modern.halo_model_bytes(rank, size, window, 1, heads * head_dim, dtype.itemsize)
                    for rank in range(size)]
    # an interior rank sends 2 x W x h values forward (W / 2 tokens' K and V to each side)
    if size == 4:
        assert sent[1][0] == 2 * window * heads * head_dim * dtype.itemsize
    rows = modern.bench_halo([size], 256, window, heads, head_dim, [dtype])
    assert "differs" not in modern.halo_table(rows)


def test_a_steps_launches_are_counted_from_the_profilers_events():
    """launches.summarize on events shaped like torch.profiler's (the GPU's own cannot be made here):
    device kernels counted and timed, device -> host copies and blocking host calls counted apart,
    CPU ops and other copies not counted as kernels."""
    from types import SimpleNamespace

    import launches

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, device, us=0.0, annotation=False):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us),
                               is_user_annotation=annotation)
    events = [event("aten::mm", cpu, 50), event("cudaLaunchKernel", cpu, 5), event("gemm_kernel", cuda, 300),
              event("gemm_kernel", cuda, 100), event("flash_fwd", cuda, 200), event("Memcpy DtoH (Device -> Pageable)",
              cuda, 10), event("Memcpy HtoD (Pinned -> Device)", cuda, 20), event("Memset (Device)", cuda, 1),
              event("cudaStreamSynchronize", cpu, 400), event("cudaMemcpyAsync", cpu, 3),
              event("Optimizer.step#AdamW.step", cuda, 900, annotation=True)]  # a range over other kernels
    launched = launches.summarize(events)
    assert launched.kernels == 3 and launched.to_host == 1 and launched.waits == 1
    assert math.isclose(launched.busy_ms, 0.631)
    assert launched.top == [("gemm_kernel", 2, 0.4), ("flash_fwd", 1, 0.2)]
    table = launches.launches_table({"ours": launched}, {"ours": 1.262})
    assert "| ours | 1.3 | 0.6 | 50% | 3 | 1 | 1 | `gemm_kernel` (2, 0.40); `flash_fwd` (1, 0.20) |" in table
