"""megatron/flops.py counts what torch's FLOP counter sees in a real training step (on CPU: the
counter sees the model's matmuls and SDPA calls, not what a GPU kernel does inside them)."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from megatron.data.batch import BertBatch
from megatron.flops import real_training_flops, training_flops_per_sample
from megatron.model.attention import local
from megatron.model.bert import BertConfig, BertModel
from megatron.model.loss import bert_batch_loss

MODERN = dict(position_embedding_type="rope", type_vocab_size=0, mlp_type="geglu", add_bias_linear=False,
              embedding_layernorm=True, first_layer_attention_norm=False)


def counted_step_flops(config: BertConfig, batch_size: int) -> float:
    """FLOPs torch's counter sees in one forward + backward on random tokens (every 8th one an MLM
    position, one segment per sample, no padding)."""
    model = BertModel(config)
    seq = config.seq_length
    tokens = torch.randint(5, config.vocab_size, (batch_size, seq), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.zeros(batch_size, seq, dtype=torch.bool)
    loss_mask[:, ::8] = True
    batch = BertBatch.unpacked(tokens, torch.zeros_like(tokens), torch.zeros_like(loss_mask), tokens, loss_mask,
                               torch.zeros(batch_size, dtype=torch.long))
    # the math SDPA backend runs attention as bmm, which the counter sees; the cores' direct calls of
    # the CPU flash kernel are counted with the formula torch registers for the CUDA flash kernel
    aten = torch.ops.aten
    cpu_flash = {aten._scaled_dot_product_flash_attention_for_cpu:
                 lambda q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(q, k, v),
                 aten._scaled_dot_product_flash_attention_for_cpu_backward:
                 lambda grad, q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_backward_flop_count(
                     grad, q, k, v)}
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False, custom_mapping=cpu_flash) as counter:
        bert_batch_loss(*model(*batch.model_inputs()), batch).total.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("attention", ["dense", "linformer"])
def test_formula_matches_counted_matmuls(attention):
    config = BertConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_attention_heads=4, seq_length=256,
                        max_position_embeddings=256, attention=attention, attention_dropout=0.0, linformer_k=32,
                        make_vocab_size_divisible_by=8)
    batch_size, seq = 2, config.seq_length
    expected = batch_size * training_flops_per_sample(config, masked_fraction=1 / 8)
    if attention == "dense":  # its flash backward recomputes q k^T, which model FLOPs leave out
        expected += config.num_layers * 2 * batch_size * seq * seq * config.hidden_size
    # the formula leaves out the pooler and SOP classifier (h^2 + 2h per sample, 6x)
    assert counted_step_flops(config, batch_size) == pytest.approx(expected, rel=2e-4)


def test_local_layers_count_a_window_of_keys_not_the_sequence():
    """Layers 1, 2, 4, 5 of 6 local (window 32: 33 keys per query), 0 and 3 global (256 keys), a
    GeGLU MLP (3hf) and the rest of the modern layout. The counter sees the local core's tiles:
    T = 64 query rows against the T + 2 x 16 keys their windows reach (T + 16 at the two ends),
    forward 2 matmuls, backward 5 (q k^T recomputed), where model FLOPs count 6 over 33 keys."""
    window, tile, seq, batch_size = 32, local._TILE_ROWS, 256, 2
    config = BertConfig(vocab_size=1000, hidden_size=64, num_layers=6, num_attention_heads=4, ffn_hidden_size=96,
                        seq_length=seq, max_position_embeddings=seq, attention_dropout=0.0,
                        make_vocab_size_divisible_by=8, local_attention_window=window, global_attention_every=3,
                        add_binary_head=False, **MODERN)
    h, half = config.hidden_size, window // 2
    local_layers, global_layers = 4, 2
    assert [config.is_local_layer(i) for i in range(6)] == [False, True, True, False, True, True]

    # the formula, written out: a gated MLP's 3hf, the head at the masked eighth, keys per layer kind
    per_token = 6 * 6 * (4 * h * h + 3 * h * 96) + 6 * (h * h + h * config.padded_vocab_size) / 8
    attention = 6 * 2 * h * (global_layers * seq + local_layers * (window + 1))
    assert training_flops_per_sample(config, 1 / 8) == pytest.approx(seq * (per_token + attention), rel=1e-12)

    # what the kernels run: the model FLOPs, less the local layers' 6 x 2 x (W + 1) x h per query,
    # plus their tiles' 7 matmuls of 2 x rows x keys x h, plus the global layers' recompute
    tile_keys = seq * (tile + 2 * half) - 2 * tile * half  # sum over tiles of rows x keys
    expected = batch_size * training_flops_per_sample(config, masked_fraction=1 / 8)
    expected += local_layers * batch_size * 2 * h * (7 * tile_keys - 6 * seq * (window + 1))
    expected += global_layers * 2 * batch_size * seq * seq * h
    assert counted_step_flops(config, batch_size) == pytest.approx(expected, rel=2e-4)


def test_local_layers_cost_the_same_per_token_at_any_length():
    """Layer 0 global, layers 1 and 2 local: beyond the global layer's 6 x 2 x s x h per token, a
    token costs the same at 1024 and 16384 tokens (a local layer counted over s keys would not)."""
    def per_token_without_global_attention(seq):
        config = BertConfig(num_layers=3, seq_length=seq, max_position_embeddings=seq, attention_dropout=0.0,
                            local_attention_window=128, global_attention_every=4)
        return training_flops_per_sample(config) / seq - 6 * 2 * seq * config.hidden_size

    assert per_token_without_global_attention(16384) == pytest.approx(per_token_without_global_attention(1024),
                                                                       rel=1e-12)


def test_the_real_flops_of_a_padded_packed_batch_are_those_of_its_documents_run_alone():
    """The log's TFLOP/s counts s keys per query, padding and other documents included (Megatron's model FLOPs),
    which grew 10-30x with --seq-length at the same work. Its `real` figure counts the batch as it is: here a
    sample packing documents of 100 and 60 tokens with 96 tokens of padding, and one of 200 tokens padded to
    256, against the counter's FLOPs of each document run alone at its own length, unpadded."""
    def config_at(seq):
        return BertConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_attention_heads=4, seq_length=seq,
                          max_position_embeddings=256, attention_dropout=0.0, make_vocab_size_divisible_by=8)

    segment_ids = torch.zeros(2, 256, dtype=torch.long)
    segment_ids[0, :100], segment_ids[0, 100:160], segment_ids[1, :200] = 1, 2, 1
    batch = BertBatch(*(torch.zeros(2, 256, dtype=torch.long),) * 2, segment_ids, torch.zeros(2, 256, dtype=torch.long),
                      torch.zeros(2, 256, dtype=torch.long), torch.zeros(2, 256, dtype=torch.bool),
                      torch.zeros(2, 256, dtype=torch.long))
    assert sorted(batch.segment_lengths().tolist()) == [60, 100, 200]
    masked = sum(-(-length // 8) for length in (100, 60, 200))  # the counter's every 8th position
    alone = 0
    for length in (100, 60, 200):
        config = config_at(length)
        # less what model FLOPs leave out: the flash backward's recomputed q k^T, the pooler and SOP classifier
        alone += (counted_step_flops(config, 1) - config.num_layers * 2 * length * length * config.hidden_size
                  - 6 * (config.hidden_size ** 2 + 2 * config.hidden_size))
    real = real_training_flops(config_at(256), batch.segment_lengths(), masked, 512)
    assert real == pytest.approx(alone, rel=1e-3)
    assert 2 * training_flops_per_sample(config_at(256), masked / 512) > 1.5 * real  # the model count, padding in


def test_the_real_flops_of_linformer_count_its_attention_over_every_slot():
    """Linformer's core runs every query slot, padding included, against its k projected keys (and projects
    every slot's keys and values): only its layers' real tokens count less than the model count."""
    config = BertConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_attention_heads=4, seq_length=256,
                        max_position_embeddings=256, attention="linformer", linformer_k=32, attention_dropout=0.0,
                        make_vocab_size_divisible_by=8)
    full = real_training_flops(config, torch.tensor([256]), 32, 256)
    assert full == pytest.approx(training_flops_per_sample(config, 32 / 256), rel=1e-12)
    half = real_training_flops(config, torch.tensor([128]), 32, 256)
    layers = 6 * 2 * (4 * 64 * 64 + 2 * 64 * config.ffn_hidden_size) * 128  # the padding's share of the layers
    assert full - half == pytest.approx(layers, rel=1e-12)
