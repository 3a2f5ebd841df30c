"""One attention plan per micro-batch, and no s x s mask anywhere.

What these tests see: the calls in the project's own code that wait for the device (tensor ->
host copies, .item/.tolist/.numpy, nonzero, bool() of a tensor, boolean-mask indexing), counted
by wrapping those torch methods, on the CUDA branches (emulated kernels, kernels.py) and the CPU
ones; and every mask or bias handed to an SDPA kernel. What they cannot see: synchronisations
inside torch's own C++ code (a kernel that reads a size from the device), or the time a copy
takes; benchmarks/gpu_check.sh measures the real step.
"""
import collections
import contextlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bert_fixtures import small_config, small_model
from megatron.data.batch import BertBatch
from megatron.model.attention import kernels, masks, plans
from megatron.model.loss import bert_batch_loss
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks

ROOT = Path(__file__).resolve().parents[1]
OURS = str(ROOT / "megatron")
SYNCING = ("cpu", "item", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__", "masked_select")
# BigBird's block pattern is drawn on the host from the seed (CPU tensors, no device data): exempt
HOST_ONLY = {("bigbird.py", "block_pattern"), ("bigbird.py", "_plan")}


@contextlib.contextmanager
def counted_host_waits():
    """Counts, per calling file, the calls of SYNCING methods (and boolean-mask indexing) made
    from megatron/ outside the emulated kernels and HOST_ONLY."""
    counts = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in SYNCING + ("__getitem__",)}

    def wrap(name, method):
        def wrapper(self, *args, **kwargs):
            code = sys._getframe(1).f_code
            caller = code.co_filename
            if (caller.startswith(OURS) and not caller.endswith("kernels.py")
                    and (Path(caller).name, code.co_name) not in HOST_ONLY):
                if name != "__getitem__" or any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                                                for a in (args[0] if isinstance(args[0], tuple) else args[:1])):
                    counts[f"{Path(caller).name}:{name}"] += 1
            return method(self, *args, **kwargs)
        return wrapper

    for name, method in originals.items():
        setattr(torch.Tensor, name, wrap(name, method))
    try:
        yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def packed(seq_length: int, segment: int, b: int = 2, seed: int = 0) -> BertBatch:
    """Samples of segments of `segment` tokens (the last one shorter), then 7 tokens of padding."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.arange(seq_length)
    segment_ids = (positions // segment + 1).expand(b, seq_length).clone()
    segment_ids[:, -7:] = 0
    starts = torch.cat([torch.ones(1, dtype=torch.bool), segment_ids[0, 1:] != segment_ids[0, :-1]])
    position_ids = (positions - positions[starts][torch.cumsum(starts.long(), 0) - 1]).expand(b, -1).clone()
    tokens = torch.randint(5, 97, (b, seq_length), generator=g).masked_fill(segment_ids == 0, 0)
    loss_mask = (torch.rand(b, seq_length, generator=g) < 0.3) & (segment_ids != 0)
    sop = torch.randint(0, 2, (b, seq_length), generator=g)
    return BertBatch(tokens=tokens, token_types=torch.zeros_like(tokens), segment_ids=segment_ids,
                     position_ids=position_ids, labels=tokens.clone(), loss_mask=loss_mask, sop_labels=sop)


def host_waits(variant: str, layers: int, checkpointed: bool = False, emulated: bool = True) -> collections.Counter:
    options = dict(bigbird_block_size=8) if variant == "bigbird" else {}
    config = small_config(variant, seq_length=64, num_layers=layers, max_position_embeddings=64, **options)
    model = small_model(config)
    if checkpointed:
        from megatron.engine import checkpoint_layers

        checkpoint_layers(model, 1)
    batch = packed(64, 20)
    plans.clear()
    with counted_host_waits() as counts, kernels.emulated_cuda() if emulated else contextlib.nullcontext():
        bert_batch_loss(*model(*batch.model_inputs()), batch).total.backward()
    return counts


@pytest.mark.parametrize("variant", ["ring", "ulysses", "dense", "bigbird"])
def test_host_waits_do_not_grow_with_depth(variant):
    """One forward and backward of a packed micro-batch, on the CUDA branch: the same host waits
    at 2 and 8 layers (the plan is made once; each layer used to gather and plan again)."""
    shallow, deep = host_waits(variant, 2), host_waits(variant, 8)
    assert shallow == deep, (shallow, deep)
    assert sum(1 for key in shallow if key.startswith(("plans.py", "bigbird.py", "ring.py", "dense.py"))) >= 1, shallow


def checkpointed_and_plain_waits() -> tuple:
    import deepspeed

    state.initialize()
    deepspeed.checkpointing.configure(None, partition_activations=False)
    return host_waits("ring", 4, checkpointed=True), host_waits("ring", 4)


def test_recompute_reuses_the_plan():
    """DeepSpeed activation checkpointing recomputes every layer in backward: no new host wait
    (one rank, as DeepSpeed's checkpointing wants its process group)."""
    (checkpointed, plain), = run_on_ranks(checkpointed_and_plain_waits, 1, timeout=120)
    assert checkpointed == plain, (checkpointed, plain)


def test_the_cache_hits_only_the_same_ids():
    ids = torch.ones(1, 8, dtype=torch.long)
    made = []
    first = plans.cached(("test",), ids, lambda: made.append(1) or object())
    assert plans.cached(("test",), ids.detach(), lambda: made.append(2)) is first  # a recompute's detached view
    assert plans.cached(("other",), ids, lambda: made.append(3) or object()) is not first
    ids.add_(1)  # changed in place: a new version
    plans.cached(("test",), ids, lambda: made.append(4) or object())
    plans.cached(("test",), torch.ones(1, 8, dtype=torch.long), lambda: made.append(5) or object())
    assert made == [1, 3, 4, 5]


def test_per_micro_batch_tables_live_as_long_as_their_tensor():
    """plans.while_alive (rope's cos/sin): one make per tensor and version, a recompute's detached view
    hits, and the entries go with the tensor (no table of a finished micro-batch held)."""
    plans.clear()
    position_ids = torch.arange(8)[None]
    made = []
    first = plans.while_alive(("test",), position_ids, lambda: made.append(1) or object())
    assert plans.while_alive(("test",), position_ids.detach(), lambda: made.append(2)) is first
    position_ids.add_(1)  # changed in place: a new version
    plans.while_alive(("test",), position_ids, lambda: made.append(3) or object())
    assert made == [1, 3] and len(plans._alive) == 2
    del position_ids
    assert not plans._alive


def test_a_plan_made_again_after_its_eviction_warns_once(monkeypatch):
    """Past _ENTRIES plans the oldest goes: silently while nobody asks for it again (finished micro-batches
    a step still holds: gradient accumulation x core kinds above the bound), with one warning per process
    when a layer asks for it again (a micro-batch in flight, whose plan is made a second time)."""
    monkeypatch.setattr(plans, "_ENTRIES", 2)
    monkeypatch.setattr(plans, "_warned_remade", False)
    plans.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        held = [torch.ones(1, 8, dtype=torch.long) for _ in range(4)]  # a step's micro-batches, all held
        for ids in held:  # finished micro-batches of a model with two core kinds
            _plan_for_two_cores(ids)
    made = []
    in_flight = [torch.ones(1, 8, dtype=torch.long) for _ in range(3)]
    with pytest.warns(UserWarning, match="made again after more than 2 others") as record:
        for ids in in_flight + in_flight:  # the second pass asks for the evicted plans of the first
            plans.cached(("test",), ids, lambda: made.append(1) or object())
    assert len(record) == 1 and len(made) == 6, [str(warning.message) for warning in record]
    plans.clear()


def _plan_for_two_cores(segment_ids) -> None:
    for key in (("ring",), ("local",)):
        plans.cached(key, segment_ids, object)


@contextlib.contextmanager
def recorded_masks():
    """The (rows, keys) of every mask or bias handed to an SDPA kernel."""
    shapes = []

    class Recording:
        def __getattr__(self, name):
            op = getattr(torch.ops.aten, name)

            def call(*args, **kwargs):
                mask = kwargs.get("attn_mask", args[3] if len(args) > 3 and isinstance(args[3], torch.Tensor) else None)
                if mask is not None:
                    shapes.append(tuple(mask.shape[-2:]))
                return op(*args, **kwargs)
            return call

    sdpa = F.scaled_dot_product_attention

    def public(*args, attn_mask=None, **kwargs):
        if attn_mask is not None:
            shapes.append(tuple(attn_mask.shape[-2:]))
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    kernels.ATEN, F.scaled_dot_product_attention = Recording(), public
    try:
        yield shapes
    finally:
        kernels.ATEN, F.scaled_dot_product_attention = torch.ops.aten, sdpa


@pytest.mark.parametrize("variant,dropout", [("dense", 0.0), ("dense", 0.1), ("ulysses", 0.0)])
def test_no_mask_larger_than_a_tile_at_8192_packed(variant, dropout):
    """Dense and Ulysses on packed samples at s = 8192 (segments of 1000 and of 700 tokens, so
    that tiles hold several segments): every mask the kernels get is one tile's, at most
    ROWS_PER_TILE rows by the keys of the segments it holds (s x s: 67 M)."""
    from megatron.model import attention

    s, segment, heads, d = 8192, 1000, 2, 8
    core = attention.build(small_config(variant, seq_length=s, max_position_embeddings=s, hidden_size=heads * d,
                                        num_attention_heads=heads, attention_dropout=dropout))
    q, k, v = (torch.randn(2, s, heads, d, requires_grad=True) for _ in range(3))
    segment_ids = torch.stack([torch.arange(s) // segment + 1, torch.arange(s) // 700 + 1])
    segment_ids[:, -7:] = 0
    with recorded_masks() as shapes:
        core(q, k, v, segment_ids).sum().backward()
    assert shapes, "packed samples run masked tiles"
    rows, keys = max(r for r, _ in shapes), max(c for _, c in shapes)
    assert rows <= masks.ROWS_PER_TILE and keys <= 2 * segment, (rows, keys)
    assert max(r * c for r, c in shapes) <= masks.ROWS_PER_TILE * 2 * segment < s * s // 50


def test_local_masks_are_tiles_of_the_window_at_8192_packed():
    """The local core at s = 8192, window 128: every mask is one tile's, _TILE_ROWS rows by the keys
    their windows reach (64 x 192, where s x s is 67 M)."""
    from types import SimpleNamespace

    from megatron.model.attention import local

    s, heads, d, window = 8192, 2, 8, 128
    core = local.LocalAttention(SimpleNamespace(local_attention_window=window, head_dim=d))
    q, k, v = (torch.randn(2, s, heads, d, requires_grad=True) for _ in range(3))
    segment_ids = torch.stack([torch.arange(s) // 1000 + 1, torch.arange(s) // 700 + 1])
    segment_ids[:, -7:] = 0
    with recorded_masks() as shapes:
        core(q, k, v, segment_ids).sum().backward()
    assert len(shapes) >= 2 * s // local._TILE_ROWS, len(shapes)  # forward and backward, tile by tile
    assert max(r for r, _ in shapes) <= local._TILE_ROWS and max(c for _, c in shapes) <= local._TILE_ROWS + window


def test_block_plan_kinds_and_varlen_only_for_cuda():
    ids = np.repeat(np.arange(1, 5), 16)[None]
    assert masks.block_plan(ids, ids, "cpu", cuda=False).varlen is None
    plan = masks.block_plan(ids, ids, "cpu", cuda=True)
    assert plan.kind == "mixed" and plan.varlen.cu_q.tolist() == [0, 16, 32, 48, 64]
    assert masks.block_plan(ids, ids + 10, "cpu", cuda=True) is None  # no shared segment: skipped
    ones = np.ones((2, 32), dtype=np.int64)
    assert masks.block_plan(ones, ones, "cpu", cuda=True) == masks.BlockPlan("full", masks.tile_plan(ones, ones), None)
