"""Kernel launches per layer of the ModernBERT preset on the CUDA branch, counted on CPU.

At short sequences a GPU step is bound by kernel launches and the host work behind them, not by
FLOPs: every op a layer adds runs once per layer per step. What these tests count: the aten ops
that reach the dispatcher in one forward and backward under bf16 autocast with the cores on their
CUDA branches (kernels.emulated_cuda()), leaving out the ops that launch nothing (views, empty
allocations) and counting each emulated attention kernel as one launch (the ops inside the
emulation are not the GPU's). What they cannot see: fused or extra launches inside torch's own
CUDA ops, and time (benchmarks/modern.py and gpu_check.sh measure the step on a GPU).
"""
import collections
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.data.batch import BertBatch
from megatron.model.args import MODEL_PRESETS, BertConfig
from megatron.model.attention import kernels, plans
from megatron.model.bert import BertModel
from megatron.model.loss import bert_batch_loss
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks

# memory or metadata only (_unsafe_view: matmul's reshapes, a view the schema does not mark as one)
NOT_LAUNCHING = {"empty", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view", "lift_fresh",
                 "is_same_size", "_has_compatible_shallow_copy_type", "promote_types"}

# What one pre-LN ModernBERT layer (no biases, GeGLU, rope) must launch per forward and backward in
# bf16 autocast, with every parameter's .grad None (no accumulation):
#   forward  (23): 2 LayerNorms; 4 matmuls, each with its weight cast to bf16, and the two whose
#                  input is a LayerNorm's fp32 output with that cast too (10); rope on q and k at
#                  once, in fp32: widen, x * cos, rotate half, * sin, add, back to bf16 (6); one
#                  attention kernel (local: windowed varlen flash; global: flash); GELU and the
#                  gate's product (2); 2 residual adds
#   backward (33): 2 matmuls per linear (8) and the casts of their 6 casts' gradients back (6); 2
#                  LayerNorm backwards and their adds into the residual gradient (4); the bf16
#                  branches' gradients cast at the 2 residual adds (2); rope's backward (6: 2 casts,
#                  2 products, the rotation back, their sum); q, k, v's gradients joined into
#                  qkv's (2 cats); one attention backward kernel; GELU's backward, the gate's 2
#                  products and the cat of the two halves (4)
# A local and a global layer launch the same: 56 each. Anything more per layer (a per-layer cos/sin
# of rope, copies or casts around the attention kernels) is launched at every layer of every step.
LAYER_LAUNCHES = 23 + 33
ROPE_THETAS = 2  # the preset's global and local rope theta: each cos/sin made once per micro-batch


def modern_config(num_layers: int) -> BertConfig:
    return BertConfig(**{**MODEL_PRESETS["modernbert-base"], "vocab_size": 97, "num_layers": num_layers,
                         "hidden_size": 64, "num_attention_heads": 2, "ffn_hidden_size": 96, "seq_length": 64,
                         "max_position_embeddings": 64, "local_attention_window": 16})


def one_sample_each(b: int = 2, s: int = 64, seed: int = 0) -> BertBatch:
    """Unpadded samples of one segment each (benchmarks/modern.py's batches)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, 97, (b, s), generator=g)
    loss_mask = torch.rand(b, s, generator=g) < 0.3
    return BertBatch.unpacked(tokens, torch.zeros_like(tokens), torch.zeros_like(loss_mask), tokens.clone(), loss_mask,
                              torch.zeros(b, dtype=torch.long))


class CountedLaunches(TorchDispatchMode):
    """Counts launching aten ops by name; an emulated attention kernel counts as one ("kernel <name>")."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.inside_kernel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.inside_kernel and not func.is_view and name not in NOT_LAUNCHING:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    def kernel(self, name: str, method):
        def call(*args, **kwargs):
            self.counts[f"kernel {name}"] += 1
            self.inside_kernel += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.inside_kernel -= 1
        return call


class _CountedKernels:
    """kernels._EMULATED with each kernel call counted by `mode`."""

    def __init__(self, emulated, mode: CountedLaunches):
        self.emulated, self.mode = emulated, mode

    def __getattr__(self, name):
        return self.mode.kernel(name, getattr(self.emulated, name))


@contextlib.contextmanager
def counted_launches():
    mode = CountedLaunches()
    emulated = kernels._EMULATED
    kernels._EMULATED = _CountedKernels(emulated, mode)
    try:
        with kernels.emulated_cuda(), mode:
            yield mode.counts
    finally:
        kernels._EMULATED = emulated


def launches(num_layers: int, checkpointed: bool = False) -> collections.Counter:
    """Launching ops of one forward and backward of a fresh micro-batch (its plans and rope tables
    made inside, as every step's are)."""
    torch.manual_seed(0)
    model = BertModel(modern_config(num_layers))
    if checkpointed:
        from megatron.engine import checkpoint_layers

        checkpoint_layers(model, 1)
    batch = one_sample_each()
    plans.clear()
    with counted_launches() as counts:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = bert_batch_loss(*model(*batch.model_inputs()), batch).total
        loss.backward()
    assert counts["kernel _flash_attention_forward"] > 0, "the local layers run windowed varlen flash"
    return counts


def test_each_layer_launches_no_more_than_it_must():
    """Two layers more (one local, one global) add at most 2 x LAYER_LAUNCHES launches."""
    shallow, deep = launches(2), launches(4)
    added = sum(deep.values()) - sum(shallow.values())
    assert added <= 2 * LAYER_LAUNCHES, (added, sorted((deep - shallow).items()))


def rope_tables_made() -> list:
    """(depth, checkpointed, times cos was computed, times sin was)."""
    import deepspeed

    state.initialize()
    deepspeed.checkpointing.configure(None, partition_activations=False)
    return [(depth, checkpointed, counts["cos"], counts["sin"])
            for depth, checkpointed in ((2, False), (4, False), (4, True))
            for counts in [launches(depth, checkpointed)]]


def test_rope_tables_are_made_once_per_micro_batch():
    """cos and sin once per theta at any depth, and not again in the recompute of activation
    checkpointing (one rank, as DeepSpeed's checkpointing wants its process group)."""
    made, = run_on_ranks(rope_tables_made, 1, timeout=120)
    assert all(cos == sin == ROPE_THETAS for _, _, cos, sin in made), made
