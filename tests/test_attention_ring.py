"""Ring (and Ulysses) attention cores against a naive softmax(QK^T + mask)V, and the ring's
memory guarantee: nothing it saves for backward grows like s * s/P."""
import pytest
import torch

from bert_fixtures import naive_masked_attention, padded_batch, segment_allowed, small_config, small_model
from megatron.model import attention
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks

B, S, HEADS, D = 4, 24, 2, 8
# sample 0 unpadded, 1 ~60% padding, 2 the whole second half padding, 3 entirely padding
PAD_STARTS = (S, 10, S // 2, 0)


def naive_attention(q, k, v, key_padding_mask):
    """[b, s, heads, d] in float64: real queries see the real keys, padding sees nothing (zeros)."""
    return naive_masked_attention(q, k, v, segment_allowed((~key_padding_mask).long()))


def inputs():
    g = torch.Generator().manual_seed(3)
    q, k, v, grad_out = (torch.randn(B, S, HEADS, D, generator=g, dtype=torch.float64) for _ in range(4))
    key_padding_mask = torch.arange(S)[None] >= torch.tensor(PAD_STARTS)[:, None]
    return q, k, v, grad_out, key_padding_mask


def reference():
    q, k, v, grad_out, key_padding_mask = inputs()
    for t in (q, k, v):
        t.requires_grad_(True)
    out = naive_attention(q, k, v, key_padding_mask)
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def core_chunk(variant: str, size: int):
    """This rank's output and q/k/v gradients for its chunk, computed in float32."""
    if size > 1:
        state.initialize(sequence=size)
    core = attention.build(small_config(variant, seq_length=S, hidden_size=HEADS * D, num_attention_heads=HEADS))
    rank, step = state.get_sequence_parallel_rank(), S // size
    q, k, v, grad_out, key_padding_mask = (t[:, rank * step:(rank + 1) * step] for t in inputs())
    q, k, v = (t.float().requires_grad_(True) for t in (q, k, v))
    out = core(q, k, v, (~key_padding_mask).long())  # one segment per sample
    out.backward(grad_out.float())
    return out.detach(), q.grad, k.grad, v.grad


def assert_matches_reference(chunks):
    expected = reference()
    for name, got, want in zip(("out", "dq", "dk", "dv"), (torch.cat(c, dim=1) for c in zip(*chunks)), expected):
        assert torch.isfinite(got).all(), f"{name} has NaN/inf"
        diff = (got.double() - want).abs().max() / want.abs().max()
        assert diff <= 1e-5, f"{name}: max relative diff {diff:.2e}"
    out = torch.cat([c[0] for c in chunks], dim=1)
    assert (out[3] == 0).all(), "a sample whose every key is padding must give zeros"


def test_ring_single_rank_equals_naive_reference():
    assert_matches_reference([core_chunk("ring", 1)])


@pytest.mark.parametrize("variant,size", [("ring", 2), ("ring", 3), ("ring", 4), ("ulysses", 2)])
def test_distributed_core_equals_naive_reference(variant, size):
    assert_matches_reference(run_on_ranks(core_chunk, size, variant, size))


def saved_tensor_sizes(size: int, s: int, variant: str = "ring", **overrides) -> dict:
    """numel of every tensor saved for backward by (a) the attention core, (b) a whole BERT forward,
    (c) the naive per-chunk attention a ring without recompute would keep (the detector check)."""
    if size > 1:
        state.initialize(sequence=size)
    config = small_config(variant, seq_length=s, max_position_embeddings=s, hidden_size=16, num_attention_heads=2,
                          **overrides)
    rank, step = state.get_sequence_parallel_rank(), s // size
    sizes = {}

    def record(key, fn):
        numels = []

        def pack(tensor):
            numels.append(tensor.numel())
            return tensor
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        sizes[key] = numels

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, s, 2, 8, generator=g) for _ in range(3))
    segment_ids = torch.ones(2, s, dtype=torch.long)
    chunk = slice(rank * step, (rank + 1) * step)
    local_q, local_k, local_v = (t[:, chunk].requires_grad_(True) for t in (q, k, v))
    record("core", lambda: attention.build(config)(local_q, local_k, local_v, segment_ids[:, chunk]))
    batch = padded_batch(seq_length=s, pad_starts=(s, s // 3)).sequence_chunk(rank, size)
    record("model", lambda: small_model(config)(*batch.model_inputs()))
    everything = torch.ones(2, step, s, dtype=torch.bool)
    record("naive", lambda: naive_masked_attention(local_q, k.requires_grad_(True), v, everything))
    return sizes


@pytest.mark.parametrize("size", [1, 2])
def test_ring_saves_no_score_sized_tensor(size):
    s, b, heads = 256, 2, 2
    results = run_on_ranks(saved_tensor_sizes, size, size, s) if size > 1 else [saved_tensor_sizes(1, s)]
    score_chunk = b * heads * (s // size) * s  # one rank's [b, heads, s/P, s] score matrix
    for sizes in results:
        assert max(sizes["naive"]) >= score_chunk, "detector must see the naive score matrix"
        assert max(sizes["core"]) <= b * (s // size) * 2 * 8, f"ring core saved {max(sizes['core'])} elements"
        assert max(sizes["model"]) < score_chunk // 2, f"BERT forward saved {max(sizes['model'])} elements"


@pytest.mark.parametrize("size", [1, 2])
def test_bigbird_saves_key_blocks_per_row_not_scores(size):
    """BigBird's per-rank memory is O(s/P x B x blocks per row): no saved tensor is larger than
    the scores of this rank's queries against their window, global and random key blocks."""
    s, b, heads, block = 512, 2, 2, 16
    args = (s, "bigbird")
    options = dict(bigbird_block_size=block)
    results = (run_on_ranks(saved_tensor_sizes, size, size, *args, **options) if size > 1
               else [saved_tensor_sizes(1, *args, **options)])
    score_chunk = b * heads * (s // size) * s
    keys_per_row = (3 + 2 + 2) * block  # window, first and last (global), random blocks
    for sizes in results:
        assert max(sizes["naive"]) >= score_chunk, "detector must see the naive score matrix"
        assert max(sizes["core"]) <= b * heads * (s // size) * keys_per_row, f"bigbird core saved {max(sizes['core'])}"
        assert max(sizes["model"]) < score_chunk // 2, f"BERT forward saved {max(sizes['model'])} elements"


def test_a_ring_takes_its_group_and_ranks_as_one_pair():
    """RingAttention(config, group) without its ranks ran on the seq group, the group given ignored; the
    ring is now one (group, ranks) pair (hybrid's ring group) or none (the seq group)."""
    from megatron.model.attention.ring import RingAttention

    ring = RingAttention(small_config(), ("the ring's group", [0]))
    assert (ring.group, ring.comm.ranks) == ("the ring's group", [0])
    with pytest.raises(TypeError):
        RingAttention(small_config(), object())  # a process group is no (group, ranks) pair
