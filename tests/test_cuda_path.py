"""The CUDA / NCCL path, checked as far as a CPU allows, and CUDA tests (marked `cuda`, skipped
cleanly without a GPU; benchmarks/gpu_check.sh runs them on one).

CPU: which SDPA kernel each block gets (blocks.kernel), unmasked ("full") blocks running with no
mask at all and still exact, the pipeline's inter-stage tensors holding no bool (NCCL), the
device helpers on CPU, and benchmarks/gpu_check.sh's commands (bash -n, --dry-run).
CUDA: every kernel against float64, the simulated ring and BigBird at P = 1, 2, 4 in fp32 and
bf16, the rank -> device binding, pinned non-blocking batch copies, the CUDA RNG in checkpoints.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bert_fixtures import naive_masked_attention, segment_allowed, small_config, small_model
from megatron.data.batch import BertBatch
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


@pytest.mark.parametrize("is_cuda,dtype,head_dim,masked,expected", [
    (False, torch.float32, 64, False, "cpu_flash"),
    (False, torch.bfloat16, 64, True, "cpu_flash"),
    (True, torch.bfloat16, 64, False, "flash"),
    (True, torch.float16, 128, False, "flash"),
    (True, torch.float32, 64, False, "efficient"),  # flash has no fp32
    (True, torch.bfloat16, 320, False, "efficient"),  # head dim past flash's 256
    (True, torch.bfloat16, 64, True, "efficient"),  # padding / segments: a bias
])
def test_kernel_per_block(is_cuda, dtype, head_dim, masked, expected):
    mask = masks.BlockMask(torch.ones(1, 1, 1, 1, dtype=torch.bool), None) if masked else masks.BlockMask(None, None)
    assert blocks.kernel(fake(is_cuda, dtype, head_dim), mask) == expected


def test_cudnn_is_chosen_for_unmasked_half_blocks_when_asked(monkeypatch):
    monkeypatch.setattr(blocks, "UNMASKED_CUDA_KERNEL", "cudnn")
    assert blocks.kernel(fake(True, torch.bfloat16), masks.BlockMask(None, None)) == "cudnn"
    assert blocks.kernel(fake(True, torch.float32), masks.BlockMask(None, None)) == "efficient"


def test_pair_kinds_full_only_without_padding_and_with_one_segment():
    ones, padded, packed = torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8)
    padded[1, 6:] = 0
    packed = packed.long()
    packed[0, 4:] = 2
    kinds = [masks.kind_of(ones, x) for x in (ones, padded, packed)]
    assert kinds == ["full", "single", "mixed"]
    assert masks.kind_of(ones, 3 * ones) == "skip"  # no shared segment
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


def test_gpu_kernel_check_runs_on_cpu():
    """benchmarks/gpu_kernels.py's checks (what gpu_check.sh runs on the GPU), small, on CPU."""
    results = gpu_kernels.run(torch.device("cpu"), [torch.float32], [2], layouts=("unpadded", "packed"),
                              s=128, heads=2, d=16)
    assert len(results) == 4 and all(r["ok"] for r in results), gpu_kernels.table(results)
    assert "unmasked" in " ".join(k for r in results if r["layout"] == "unpadded" for k in r["kernels"])


def test_pipeline_stages_exchange_no_bool_tensors():
    """What crosses pipeline stages (after the embedding, after each layer) holds no bool tensor:
    DeepSpeed casts only the last one for NCCL. The heads decode the masks back."""
    config = small_config("dense", seq_length=16, hidden_size=16, num_attention_heads=2)
    torch.manual_seed(0)
    embedding, layer, heads = EmbeddingPipe(config), TransformerLayerPipe(config), HeadsPipe(config)
    words = torch.randn(2, 16, 16)
    token_types = torch.zeros(2, 16, dtype=torch.long)
    positions = torch.arange(16).expand(2, 16)
    segment_ids = torch.ones(2, 16, dtype=torch.long)
    mlm_mask = torch.rand(2, 16, generator=torch.Generator().manual_seed(1)) < 0.3
    cls_mask = positions == 0
    stage = embedding((words, token_types, positions, segment_ids, mlm_mask, cls_mask))
    hidden = layer(stage)
    for outputs in (stage, hidden):
        assert [t.dtype for t in outputs] == [torch.float32, torch.int64, torch.int64]
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


# --- benchmarks/gpu_check.sh ------------------------------------------------------------------

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_gpu_check_script_parses_and_its_dry_run_is_well_formed(tmp_path):
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    env = {**os.environ, "GPU_CHECK_WORK": str(tmp_path)}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], check=True, capture_output=True, text=True, env=env,
                          cwd=ROOT)
    commands = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    text = "\n".join(commands)
    for needed in ("pip install", "pytest", "-m cuda", "gpu_kernels.py", "deepspeed --num_gpus 1", "pretrain_bert.py",
                   "train_step.py", "--shape base", "--shape large", "gpu_longest.py", "results.py"):
        assert needed in text, f"gpu_check.sh --dry-run runs no '{needed}'"
    for command in commands:
        words = shlex.split(command)
        scripts = [w for w in words if w.endswith((".py", ".sh")) and not w.startswith("-")]
        for script in scripts:
            assert (ROOT / script).is_file(), f"{script} (in: {command}) does not exist"
        flags = {w.split("=")[0] for w in words if w.startswith("--")}
        py = next((w for w in scripts if w.startswith("benchmarks/") or w == "pretrain_bert.py"), None)
        if py and "pytest" not in command:  # every flag is one the script's parser declares
            source = (ROOT / "megatron" / "arguments.py" if py == "pretrain_bert.py" else ROOT / py).read_text()
            for flag in flags - {"--deepspeed", "--num_gpus", "--master_port", "--deepspeed_config"}:
                declared = f'"{flag}"' in source or f'"--{flag[5:]}"' in source and "BooleanOptionalAction" in source
                assert declared, f"{py} has no flag {flag} (in: {command})"
    config = re.search(r"--deepspeed_config (\S+)", text).group(1)
    assert Path(config).is_file(), "the dry run writes the trainer's DeepSpeed config"


def test_gpu_check_prepare_lists_the_wheels_it_needs():
    done = subprocess.run(["bash", str(SCRIPT), "--prepare", "--dry-run"], check=True, capture_output=True,
                          text=True, cwd=ROOT)
    assert "pip download" in done.stdout and "deepspeed==0.19.8" in done.stdout and "pydantic" in done.stdout


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
    refuses another) and ninja."""
    from deepspeed import git_version_info
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(git_version_info, "installed_ops", {"fused_adam": False})
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert "no CUDA toolkit (nvcc)" in device.fused_adam_problem()
    cases = {"11.8": "is CUDA 11.8, torch's is 13.0", "12.4": "is CUDA 12.4, torch's is 13.0", "13.2": None}
    for release, problem in cases.items():
        home = fake_toolkit(tmp_path / release, release)
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", home)
        monkeypatch.setenv("PATH", f"{home}/bin:/usr/bin:/bin")
        found = device.fused_adam_problem()
        assert (found is None) if problem is None else (problem in found), (release, found)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "ninja" in device.fused_adam_problem()
    monkeypatch.setattr(git_version_info, "installed_ops", {"fused_adam": True})
    assert device.fused_adam_problem() is None


def test_a_cuda_machine_that_cannot_build_fused_adam_trains_with_torch_adam(monkeypatch, capsys):
    """One warning line, torch's Adam chosen; a JSON that names torch_adam is left as it is."""
    from megatron import training
    from megatron.arguments import build_parser

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device, "fused_adam_problem", lambda: "it is not prebuilt and nvcc is CUDA 11.8")
    ds = training.deepspeed_settings(build_parser().parse_args([]))
    assert ds["optimizer"]["params"]["torch_adam"] is True
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["warning: DeepSpeed's FusedAdam cannot be had here: it is not prebuilt and nvcc is CUDA 11.8; "
                     "training with torch's Adam (the same update, unfused). For the fused kernel install the CUDA "
                     "toolkit torch was built with, or prebuild it: DS_BUILD_FUSED_ADAM=1 pip install deepspeed"], lines
    monkeypatch.setattr(device, "fused_adam_problem", lambda: None)
    assert "torch_adam" not in training.deepspeed_settings(build_parser().parse_args([]))["optimizer"]["params"]


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel_name", ["flash", "cudnn", "efficient"])
@pytest.mark.parametrize("masked", [False, True])
def test_cuda_block_kernel_matches_float64(monkeypatch, dtype, kernel_name, masked):
    if masked and kernel_name != "efficient":
        pytest.skip("masked blocks always take the memory-efficient kernel")
    if kernel_name in ("flash", "cudnn") and dtype == torch.float32:
        pytest.skip("flash / cuDNN have no fp32")
    monkeypatch.setattr(blocks, "UNMASKED_CUDA_KERNEL", kernel_name)
    if kernel_name == "efficient" and not masked:
        monkeypatch.setattr(blocks, "kernel", lambda q, mask: "efficient")
    g = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 4, 192, 64, generator=g) for _ in range(4))
    ids = gpu_kernels.segment_ids("packed" if masked else "unpadded", 2, 192)
    mask = masks.segment_mask(ids, ids)
    assert (mask.allowed is None) == (not masked)
    on = [x.cuda().to(dtype) for x in (q, k, v, grad_out)]
    cuda_mask = masks.segment_mask(ids.cuda(), ids.cuda())
    out, lse = blocks.forward(*on[:3], cuda_mask, 64 ** -0.5)
    grads = blocks.backward(on[3], *on[:3], cuda_mask, out, lse, 64 ** -0.5)
    allowed = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] != 0)
    want = gpu_kernels.reference(*(x.transpose(1, 2) for x in (q, k, v, grad_out)), allowed)
    tolerance = gpu_kernels.TOLERANCE[dtype]
    for name, got, expected in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
        got = got.transpose(1, 2).double().cpu()
        error = ((got - expected).abs().max() / expected.abs().max()).item()
        assert error <= tolerance, f"{kernel_name} {dtype} {name}: {error:.1e}"


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_simulated_ring_and_bigbird_match_float64(dtype):
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
    assert all(t.device == chosen for t in vars(moved).values())
    assert torch.equal(moved.tokens.cpu(), batch.tokens[:, 4:])
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))
    with pytest.raises(RuntimeError, match="LOCAL_RANK"):
        device.select_device()
    torch.cuda.set_device(0)


@cuda
@pytest.mark.cuda
def test_cuda_rng_state_is_saved_and_restored():
    from megatron import checkpoint

    states = checkpoint.rng_states()
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
