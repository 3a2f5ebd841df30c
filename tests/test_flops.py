"""megatron/flops.py counts what torch's FLOP counter sees in a real training step."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from megatron.data.batch import BertBatch
from megatron.flops import training_flops_per_sample
from megatron.model.bert import BertConfig, BertModel
from megatron.model.loss import bert_batch_loss


@pytest.mark.parametrize("attention", ["dense", "linformer"])
def test_formula_matches_counted_matmuls(attention):
    config = BertConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_attention_heads=4, seq_length=256,
                        max_position_embeddings=256, attention=attention, attention_dropout=0.0, linformer_k=32,
                        make_vocab_size_divisible_by=8)
    model = BertModel(config)
    batch_size, seq = 2, config.seq_length
    tokens = torch.randint(5, 1000, (batch_size, seq), generator=torch.Generator().manual_seed(0))
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
    expected = batch_size * training_flops_per_sample(config, masked_fraction=1 / 8)
    if attention == "dense":  # its flash backward recomputes q k^T, which model FLOPs leave out
        expected += config.num_layers * 2 * batch_size * seq * seq * config.hidden_size
    # the formula leaves out the pooler and SOP classifier (h^2 + 2h per sample, 6x)
    assert counter.get_total_flops() == pytest.approx(expected, rel=2e-4)
