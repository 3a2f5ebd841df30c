"""The CUDA / NCCL path, checked as far as a CPU allows, and CUDA tests (marked `cuda`, skipped
cleanly without a GPU; benchmarks/gpu_check.sh runs them on one).

CPU: which SDPA kernel each block gets (blocks.kernel), unmasked ("full") blocks running with no
mask at all and still exact, the pipeline's inter-stage tensors holding no bool (NCCL), the
device helpers on CPU (the CUDA branches themselves, on emulated kernels: test_cuda_emulated.py;
benchmarks/gpu_check.sh: test_gpu_check.py).
CUDA: every kernel against float64, the simulated ring, BigBird and local core at P = 1, 2, 4 in
fp32 and bf16 (local layers on flash's window in bf16: the one check of the window's alignment
that the emulation assumes), the rank -> device binding, pinned non-blocking batch copies, the CUDA RNG in checkpoints.
"""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bert_fixtures import segment_allowed, small_config, small_model
from megatron.data.batch import BertBatch
from megatron.errors import ConfigError
from megatron.model import attention
from megatron.model.attention import blocks, masks
from megatron.model.pipe import EmbeddingPipe, HeadsPipe, TransformerLayerPipe
from megatron.parallel import device

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_kernels  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs it)")


def fake(is_cuda: bool, dtype, head_dim: int = 64):
    return SimpleNamespace(is_cuda=is_cuda, dtype=dtype, shape=(2, 4, 128, head_dim))


@pytest.mark.parametrize("is_cuda,dtype,head_dim,masked,varlen,expected", [
    (False, torch.float32, 64, False, False, "cpu_flash"),
    (False, torch.bfloat16, 64, True, True, "cpu_flash"),
    (True, torch.bfloat16, 64, False, False, "flash"),
    (True, torch.float16, 128, False, False, "flash"),
    (True, torch.float32, 64, False, False, "efficient"),  # flash has no fp32
    (True, torch.bfloat16, 320, False, False, "efficient"),  # head dim past flash's 256
    (True, torch.bfloat16, 64, True, True, "varlen_flash"),  # padding / segments: variable lengths, no bias
    (True, torch.float32, 64, True, True, "efficient"),  # fp32: per tile, the tile's bias
    (True, torch.bfloat16, 64, True, False, "efficient"),  # a layout varlen cannot describe (BigBird's slots)
    (True, torch.bfloat16, 12, False, False, "efficient"),  # not flash's shape (and refused at start-up on CUDA)
])
def test_kernel_per_block(is_cuda, dtype, head_dim, masked, varlen, expected):
    assert blocks.kernel(fake(is_cuda, dtype, head_dim), masked, varlen) == expected


def test_cudnn_is_chosen_for_unmasked_half_blocks_when_asked(monkeypatch):
    monkeypatch.setattr(blocks, "UNMASKED_CUDA_KERNEL", "cudnn")
    assert blocks.kernel(fake(True, torch.bfloat16), masked=False) == "cudnn"
    assert blocks.kernel(fake(True, torch.float32), masked=False) == "efficient"
    assert blocks.kernel(fake(True, torch.bfloat16, head_dim=12), masked=False) == "efficient"  # cuDNN: d % 8 too


def test_head_dims_no_sm80_kernel_takes_are_refused_at_start_up():
    """Checked against torch 2.11's kernel tables (cutlassF.h: sm80+ has aligned builds only)."""
    blocks.check_cuda_head_dim(64, "bf16", (9, 0))
    blocks.check_cuda_head_dim(12, "fp32", (9, 0))
    blocks.check_cuda_head_dim(12, "bf16", (7, 0))  # a V100 has unaligned builds
    with pytest.raises(ConfigError, match=r"head dim 12 .* not a multiple of 8, which the CUDA attention kernels need "
                                          r"in bf16 on this GPU \(sm90\); choose --hidden-size and --num-attention-heads"):
        blocks.check_cuda_head_dim(12, "bf16", (9, 0))
    with pytest.raises(ConfigError, match="head dim 6 .* not a multiple of 4"):
        blocks.check_cuda_head_dim(6, "fp32", (8, 0))


def test_pair_kinds_full_only_without_padding_and_with_one_segment():
    ones, padded, packed = torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8)
    padded[1, 6:] = 0
    packed = packed.long()
    packed[0, 4:] = 2
    kinds = [masks.pair_kind(ones.numpy(), x.numpy()) for x in (ones, padded, packed)]
    assert kinds == ["full", "single", "mixed"]
    assert masks.pair_kind(ones.numpy(), 3 * ones.numpy()) == "skip"  # no shared segment
    assert masks.block_mask(ones, ones, "full") == masks.BlockMask(None, None)
    assert masks.tile_plan(ones.numpy(), ones.numpy())[0].kind == "full"
    assert masks.tile_plan(ones.numpy(), padded.numpy())[0].kind == "single"


@pytest.mark.parametrize("variant", ["dense", "ring", "bigbird"])
def test_unpadded_samples_run_unmasked_and_exact(variant):
    """No padding, one segment: the cores call the kernels with no mask (the flash path on CUDA)
    and still equal float64 attention."""
    options = dict(bigbird_block_size=4) if variant == "bigbird" else {}
    core = attention.build(small_config(variant, seq_length=32, hidden_size=16, num_attention_heads=2, **options))
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 32, 2, 8, generator=g) for _ in range(4))
    segment_ids = torch.ones(2, 32, dtype=torch.long)
    counts, choose = gpu_kernels.count_kernels()
    try:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = core(*leaves, segment_ids)
        out.backward(grad_out)
    finally:
        blocks.kernel = choose
    if variant == "bigbird":
        allowed = gpu_kernels.bigbird_allowed(32, 4, 3, 2, core.seed)[None] & segment_allowed(segment_ids)
        assert counts["cpu_flash unmasked"] > 0, counts  # the global rows; window rows gather invalid slots
    else:
        allowed = segment_allowed(segment_ids)
        if variant == "ring":
            assert set(counts) == {"cpu_flash unmasked"}, counts
    want = gpu_kernels.reference(q, k, v, grad_out, allowed)
    for name, got, expected in zip(("out", "dq", "dk", "dv"), (out, *(t.grad for t in leaves)), want):
        assert ((got.double() - expected).abs().max() / expected.abs().max()).item() <= 1e-5, name


def test_gpu_kernel_check_runs_on_cpu(capsys):
    """benchmarks/gpu_kernels.py's checks (what gpu_check.sh runs on the GPU), small, on CPU, each row said as it
    ends (the default length took minutes on CPU without a line)."""
    results = gpu_kernels.run(torch.device("cpu"), [torch.float32], [2], layouts=("unpadded", "packed"),
                              s=128, heads=2, d=16)
    assert len(results) == 6 and all(r["ok"] for r in results), gpu_kernels.table(results)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[0].startswith("[1/6] ring P=2 unpadded float32: largest error ") and \
        lines[0].endswith(" (ok)"), lines
    assert "unmasked" in " ".join(k for r in results if r["layout"] == "unpadded" for k in r["kernels"])


def test_gpu_kernel_check_adds_the_rings_cudnn_rows_in_bf16():
    """In bf16 the check also runs the ring's unmasked blocks on cuDNN at each P (the rows that would
    make cuDNN the default), here through the emulated kernels: the choice and the math, not cuDNN's
    own rounding, which only the GPU shows."""
    from megatron.model.attention import kernels

    with kernels.emulated_cuda():
        results = gpu_kernels.run(torch.device("cpu"), [torch.bfloat16], [2], layouts=("unpadded", "packed"),
                                  s=128, heads=2, d=16)
    cudnn = [r for r in results if "cudnn unmasked" in r["kernels"]]
    assert [(r["variant"], r["layout"]) for r in cudnn] == [("ring (cudnn)", "unpadded")], gpu_kernels.table(results)
    assert all(r["ok"] for r in results), gpu_kernels.table(results)


def test_pipeline_stages_exchange_no_bool_tensors():
    """What crosses pipeline stages (after the embedding, after each layer) holds no bool tensor:
    DeepSpeed casts only the last one for NCCL. The heads decode the masks back."""
    config = small_config("dense", seq_length=16, hidden_size=16, num_attention_heads=2)
    torch.manual_seed(0)
    embedding, layer, heads = EmbeddingPipe(config), TransformerLayerPipe(config, 0), HeadsPipe(config)
    words = torch.randn(2, 16, 16)
    token_types = torch.zeros(2, 16, dtype=torch.long)
    positions = torch.arange(16).expand(2, 16)
    segment_ids = torch.ones(2, 16, dtype=torch.long)
    mlm_mask = torch.rand(2, 16, generator=torch.Generator().manual_seed(1)) < 0.3
    cls_mask = positions == 0
    stage = embedding((words, token_types, positions, segment_ids, mlm_mask, cls_mask))
    hidden = layer(stage)
    for outputs in (stage, hidden):
        assert [t.dtype for t in outputs] == [torch.float32, torch.int64, torch.int64, torch.int64]
    weight = torch.randn(config.padded_vocab_size, 16)
    mlm_logits, sop_logits = heads((*hidden, weight))
    assert mlm_logits.shape[0] == int(mlm_mask.sum()) and sop_logits.shape[0] == 2
    expected = heads.lm_head(heads.final_layernorm(hidden[0])[mlm_mask], weight)
    assert torch.equal(mlm_logits, expected)


def test_device_helpers_on_cpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    if not torch.cuda.is_available():
        assert device.select_device() == torch.device("cpu") and device.backend() == "gloo"
    assert device.local_rank() == 3
    batch = BertBatch.unpacked(torch.ones(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long),
                               torch.zeros(1, 4, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.long),
                               torch.zeros(1, 4, dtype=torch.bool), torch.zeros(1, dtype=torch.long))
    assert device.to_device(batch, "cpu") is batch


# --- on a GPU ---------------------------------------------------------------------------------

def fake_toolkit(folder: Path, release: str, ninja: bool = True) -> str:
    """A CUDA_HOME whose bin/nvcc reports `release` (and a ninja on PATH when asked)."""
    (folder / "bin").mkdir(parents=True)
    nvcc = folder / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    if ninja:
        (folder / "bin" / "ninja").write_text("#!/bin/sh\necho 1.11.1\n")
        (folder / "bin" / "ninja").chmod(0o755)
    return str(folder)


def test_fused_adam_problem_follows_the_jit_builds_rules(monkeypatch, tmp_path):
    """Prebuilt: fine. Else the JIT build needs an nvcc of torch's CUDA major (torch's cpp_extension
    refuses another), ninja, and an arch list DeepSpeed can read; each problem comes with its fix."""
    from deepspeed import git_version_info
    from torch.utils import cpp_extension

    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)  # the GPU image sets one ("9.0a")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(git_version_info, "installed_ops", {"fused_adam": False})
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert "no CUDA toolkit (nvcc)" in device.fused_adam_problem()[0]
    assert device.fused_adam_problem()[1] == device.TOOLKIT_FIX
    cases = {"11.8": "is CUDA 11.8, torch's is 13.0", "12.4": "is CUDA 12.4, torch's is 13.0", "13.2": None}
    for release, problem in cases.items():
        home = fake_toolkit(tmp_path / release, release)
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", home)
        monkeypatch.setenv("PATH", f"{home}/bin:/usr/bin:/bin")
        found = device.fused_adam_problem()
        assert (found is None) if problem is None else (problem in found[0]), (release, found)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")  # the last requirement, after nvcc and ninja
    assert device.fused_adam_problem() == device.arch_list_problem() != None
    monkeypatch.setenv("PATH", "/nonexistent")
    assert device.fused_adam_problem()[1] == "pip install ninja"
    monkeypatch.setattr(git_version_info, "installed_ops", {"fused_adam": True})
    assert device.fused_adam_problem() is None


@pytest.mark.parametrize("arch_list, readable", [("9.0", None), ("8.0;8.6+PTX", None), ("8.6 9.0+PTX", None),
                                                  ("8.6+ptx", None), ("9.0a", "9.0"), ("8.0 9.0 9.0a", "8.0;9.0"),
                                                  ("9.0a;10.0a+PTX", "9.0;10.0+PTX"), ("9", "numbers"),
                                                  ("sm_90", "numbers")])
def test_fused_adam_problem_names_an_arch_list_deepspeed_cannot_read(monkeypatch, arch_list, readable):
    """The GPU image's TORCH_CUDA_ARCH_LIST held a Hopper-specific "...a" entry, and DeepSpeed's JIT
    build of FusedAdam stopped every rank with a ValueError (H200, gpu_check). Held here to the pinned
    DeepSpeed's own reading of the list (its compute_capability_args, which needs no GPU once the list
    is set): what it cannot read is named with a list it can ("numbers": none to offer, the form is
    named), and what it can read passes. What the nvcc build then does with the list, only the GPU
    check sees."""
    from deepspeed import git_version_info
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder  # the CUDA builder, also on CPU

    monkeypatch.setattr(git_version_info, "installed_ops", {"fused_adam": False})
    builder = FusedAdamBuilder()
    builder.jit_mode = True

    def deepspeed_reads(value):
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", value)
        try:
            builder.compute_capability_args()
        except ValueError:
            return False
        return True

    assert deepspeed_reads(arch_list) == (readable is None)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    problem = device.arch_list_problem()
    if readable is None:
        assert problem is None
    elif readable == "numbers":
        assert problem[1].startswith("set TORCH_CUDA_ARCH_LIST to the GPUs' capabilities as numbers"), problem
    else:
        assert problem[1] == f'set TORCH_CUDA_ARCH_LIST="{readable}"', problem
        assert deepspeed_reads(readable)


def test_a_cuda_machine_that_cannot_build_fused_adam_trains_with_torch_adam(monkeypatch, capsys):
    """One warning line, torch's Adam chosen; a JSON that names torch_adam is left as it is."""
    from megatron import training
    from megatron.arguments import build_parser

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device, "fused_adam_problem", lambda: ("it is not prebuilt and nvcc is CUDA 11.8", "install it"))
    ds = training.deepspeed_settings(build_parser().parse_args([]))
    assert ds["optimizer"]["params"]["torch_adam"] is True
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["warning: DeepSpeed's FusedAdam cannot be had here: it is not prebuilt and nvcc is CUDA 11.8; "
                     "training with torch's Adam (the same update, unfused). For the fused kernel: install it"], lines
    monkeypatch.setattr(device, "fused_adam_problem", lambda: None)
    assert "torch_adam" not in training.deepspeed_settings(build_parser().parse_args([]))["optimizer"]["params"]


@pytest.mark.parametrize("mpi_rank,printed", [("0", 1), ("1", 0)])
def test_the_torch_adam_warning_is_printed_once_under_an_mpi_launcher(monkeypatch, capsys, mpi_rank, printed):
    """An MPI launcher sets OMPI_COMM_WORLD_RANK, not RANK (before DeepSpeed's discovery): the check
    read RANK alone, so every rank printed the warning. Now launch_env.launcher_rank: rank 0 only."""
    from megatron import training
    from megatron.arguments import build_parser

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", mpi_rank)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device, "fused_adam_problem", lambda: ("it is not prebuilt", "install it"))
    assert training.deepspeed_settings(build_parser().parse_args([]))["optimizer"]["params"]["torch_adam"] is True
    assert len(capsys.readouterr().err.splitlines()) == printed


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel_name", ["flash", "cudnn", "efficient", "varlen_flash"])
@pytest.mark.parametrize("layout", ["unpadded", "padded", "packed"])
def test_cuda_block_kernel_matches_float64(monkeypatch, dtype, kernel_name, layout):
    """A whole block (its BlockPlan as the ring makes it) on each real CUDA kernel that can take it."""
    masked = layout != "unpadded"
    if kernel_name in ("flash", "cudnn", "varlen_flash") and dtype == torch.float32:
        pytest.skip("flash / cuDNN have no fp32")
    if masked != (kernel_name in ("varlen_flash", "efficient")):
        pytest.skip("masked blocks take varlen flash or memory-efficient, unmasked ones flash, cuDNN or memory-efficient")
    monkeypatch.setattr(blocks, "UNMASKED_CUDA_KERNEL", kernel_name)
    monkeypatch.setattr(blocks, "kernel", blocks.kernel)  # restored after the test
    if masked:
        gpu_kernels.count_kernels(kernel_name)  # every masked block on this kernel
    elif kernel_name == "efficient":
        blocks.kernel = lambda q, masked, varlen=False: "efficient"
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 192, 4, 64, generator=g) for _ in range(4))
    ids = gpu_kernels.segment_ids(layout, 2, 192)
    plan = masks.block_plan(ids.numpy(), ids.numpy(), "cuda", cuda=True)
    on = [x.cuda().to(dtype).transpose(1, 2) for x in (q, k, v, grad_out)]
    cuda_ids = ids.cuda()
    out, lse = blocks.attend(*on[:3], cuda_ids, cuda_ids, plan, 64 ** -0.5)
    grads = blocks.attend_backward(on[3], *on[:3], cuda_ids, cuda_ids, plan, out, lse, 64 ** -0.5)
    want = gpu_kernels.reference(q, k, v, grad_out, segment_allowed(ids))
    tolerance = gpu_kernels.TOLERANCE[dtype]
    for name, got, expected in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
        got = got.transpose(1, 2).double().cpu()
        error = ((got - expected).abs().max() / expected.abs().max()).item()
        assert error <= tolerance, f"{kernel_name} {layout} {dtype} {name}: {error:.1e}"


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_simulated_ring_bigbird_and_local_match_float64(dtype):
    results = gpu_kernels.run(torch.device("cuda"), [dtype], [1, 2, 4], s=256, heads=4, d=64)
    assert all(r["ok"] for r in results), gpu_kernels.table(results)
    if dtype == torch.bfloat16:
        assert any("flash unmasked" in k or "cudnn unmasked" in k for r in results for k in r["kernels"])


@cuda
@pytest.mark.cuda
def test_cuda_rank_binds_to_its_local_gpu_and_batches_copy_pinned(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count() - 1))
    chosen = device.select_device()
    assert chosen == torch.device("cuda", torch.cuda.device_count() - 1) == torch.device("cuda", torch.cuda.current_device())
    assert device.backend() == "nccl"
    batch = BertBatch.unpacked(torch.ones(2, 8, dtype=torch.long), torch.zeros(2, 8, dtype=torch.long),
                               torch.zeros(2, 8, dtype=torch.bool), torch.zeros(2, 8, dtype=torch.long),
                               torch.zeros(2, 8, dtype=torch.bool), torch.zeros(2, dtype=torch.long))
    moved = device.to_device(batch.sequence_chunk(1, 2), chosen)
    torch.cuda.synchronize()
    assert all(t.device == chosen for t in moved.tensors().values()) and moved.chunk_of == 2
    assert torch.equal(moved.tokens.cpu(), batch.tokens[:, 4:])
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))
    with pytest.raises(RuntimeError, match="LOCAL_RANK"):
        device.select_device()
    torch.cuda.set_device(0)


@cuda
@pytest.mark.cuda
def test_cuda_rng_state_is_saved_and_restored():
    from megatron import checkpoint_save

    states = checkpoint_save.rng_states()
    first = torch.rand(4, device="cuda")
    torch.cuda.set_rng_state(states["cuda"])
    assert torch.equal(torch.rand(4, device="cuda"), first)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["ring", "dense"])
def test_cuda_bert_step_in_bf16_tracks_fp32_on_cpu(variant):
    """A small BERT forward + backward on the GPU under bf16 autocast: loss within bf16 rounding
    of the CPU fp32 loss (same weights, same batch), gradients finite."""
    from bert_fixtures import padded_batch
    from megatron.model.loss import bert_batch_loss

    config = small_config(variant, seq_length=48)
    batch = padded_batch(seq_length=48)
    losses = []
    for dev in ("cpu", "cuda"):
        model = small_model(config).to(dev)
        on = device.to_device(batch, dev) if dev == "cuda" else batch
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev == "cuda"):
            loss = bert_batch_loss(*model(*on.model_inputs()), on).total
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        losses.append(loss.item())
    assert abs(losses[1] - losses[0]) <= 2e-2 * abs(losses[0]), losses


def test_gpu_kernel_timings_run_on_the_emulated_kernels():
    """gpu_kernels.py's timing rows (what gpu_check.sh times on the GPU) at tiny sizes on CPU
    through the emulated kernels: each row is a time, none "not available"; a crash there would
    cost a GPU session its kernel table. The times themselves mean nothing here."""
    from megatron.model.attention import kernels

    shape = dict(device=torch.device("cpu"), s=192, heads=2, d=16, repeats=1)
    with kernels.emulated_cuda():
        rows = (gpu_kernels.time_kernels(**shape) + gpu_kernels.time_masked_kernels(segment=50, **shape)
                + gpu_kernels.time_local_layer(window=16, segment=50, **shape))
    assert [name for name, _ in rows] == (["flash", "cudnn", "efficient"] + list(gpu_kernels.PACKED_ROUTES)
                                          + list(gpu_kernels.LOCAL_ROUTES))
    assert all(isinstance(ms, float) for _, ms in rows), rows


@pytest.mark.parametrize("batch", [1, 2])
def test_a_packed_block_of_whole_segments_runs_one_varlen_flash_call(batch):
    """A packed block whose every sample holds the same whole segments (one sample of a long packed
    sequence, the common case at 32K+) is cut into one tile per segment, each "full" on its own; the
    plan called the block "full" too, so on the GPU it ran flash tile by tile (9 calls each way here).
    Now it is one varlen flash call each way; and each of gpu_kernels' routes for the packed block
    runs the kernels its label names. Through the emulated kernels: the choice, not the speed."""
    from megatron.model.attention import blocks, kernels

    with kernels.emulated_cuda():
        step = gpu_kernels.packed_block_step(torch.device("cpu"), b=batch, s=4096, heads=2, d=16, segment=500)
        ran = {}
        for route, forced in {"default": (None, None), **gpu_kernels.PACKED_ROUTES}.items():
            counts, choose = gpu_kernels.count_kernels(*forced)
            try:
                step()
            finally:
                blocks.kernel = choose
            ran[route] = dict(counts)
        profiled = gpu_kernels.top_kernels(step, torch.device("cpu"), {"efficient tiles": ("efficient", "efficient")},
                                           top=3)
    tiles = 2 * 9  # forward and backward, a tile per segment
    assert ran == {"default": {"varlen_flash masked": 2}, "varlen_flash": {"varlen_flash masked": 2},
                   "flash tiles": {"efficient masked": 2, "flash unmasked": tiles},
                   "efficient tiles": {"efficient masked": 2, "efficient unmasked": tiles}}, ran
    assert len(profiled) == 3 and {route for _, route, _, _ in profiled} == {"efficient tiles"}, profiled
