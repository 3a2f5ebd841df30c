"""Single-process properties of the Megatron BERT model."""
import math

import pytest
import torch

from bert_fixtures import padded_batch, small_config, small_model
from megatron.errors import ConfigError
from megatron.model.bert import BertConfig
from megatron.model.loss import bert_batch_loss, bert_loss, whole
from megatron.model.pipe import PipelineLoss


def test_vocab_is_padded_and_decoder_is_tied():
    config = small_config(vocab_size=97, make_vocab_size_divisible_by=16)
    assert config.padded_vocab_size == 112
    model = small_model(config)
    batch = padded_batch()
    mlm_logits, sop_logits = model(*batch.model_inputs())
    assert mlm_logits.shape == (int(batch.loss_mask.sum()), 112)
    assert sop_logits.shape == (4, 2)
    mlm_logits.sum().backward()
    # the decoder has no weight of its own: its gradient lands in the word embeddings
    assert not any("lm_head" in name and name.endswith("weight") and p.shape[0] == 112
                   for name, p in model.named_parameters())
    assert model.embeddings.word_embeddings.weight.grad[batch.tokens.unique()].abs().sum() > 0


def test_init_std_and_scaled_output_projections():
    config = small_config(hidden_size=256, num_attention_heads=4, num_layers=8)
    model = small_model(config)
    layer = model.layers[0]
    assert layer.attention.query_key_value.weight.std().item() == pytest.approx(0.02, rel=0.05)
    scaled = 0.02 / math.sqrt(2 * 8)
    assert layer.attention.dense.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert layer.mlp.dense_4h_to_h.weight.std().item() == pytest.approx(scaled, rel=0.05)
    assert (layer.attention.query_key_value.bias == 0).all()


def test_binary_head_switches_off():
    model = small_model(small_config(add_binary_head=False))
    _, sop_logits = model(*padded_batch().model_inputs())
    assert sop_logits is None and model.binary_head is None


def test_post_layernorm_layout_differs_and_has_no_final_layernorm():
    batch = padded_batch()
    pre, post = small_model(small_config(layernorm_layout="pre")), small_model(small_config(layernorm_layout="post"))
    assert isinstance(post.final_layernorm, torch.nn.Identity)
    assert not torch.allclose(pre(*batch.model_inputs())[0], post(*batch.model_inputs())[0])


def test_chunk_positions_come_with_the_chunk():
    """Positions are data: a chunk's embeddings equal the same columns of the whole sequence's."""
    model = small_model(small_config())
    batch = padded_batch()
    full = model.embeddings(batch.tokens, batch.token_types, batch.position_ids)
    chunk = batch.sequence_chunk(rank=2, size=4)
    assert (chunk.position_ids[0] == torch.arange(24, 36)).all()
    assert torch.equal(model.embeddings(chunk.tokens, chunk.token_types, chunk.position_ids), full[:, 24:36])


def test_sop_loss_only_where_cls_lives():
    """Every chunk computes SOP logits (same backward graph on all ranks), but only the chunk
    holding [CLS] puts the SOP loss into its share; the others give the head zero gradients."""
    model = small_model(small_config())
    batch = padded_batch()
    first, second = (bert_batch_loss(*model(*chunk.model_inputs()), chunk, whole)  # each over its own counts
                     for chunk in (batch.sequence_chunk(0, 2), batch.sequence_chunk(1, 2)))
    assert first.sop > 0 and second.sop == 0
    second.total.backward()
    assert (model.binary_head.pooler.weight.grad == 0).all()
    first.total.backward()
    assert model.binary_head.pooler.weight.grad.abs().sum() > 0


def test_a_sequence_chunks_loss_without_sum_counts_is_refused():
    """Leaving out sum_counts divided each chunk by its own counts: at SP > 1 a wrong loss and wrong
    gradients, with no error. A chunk says it is one (through slicing and padding too), and its loss
    refuses to go on without the sum; whole samples need none. The pipeline's loss takes it always:
    its stages cannot tell a chunk's labels from whole samples."""
    model = small_model(small_config())
    batch = padded_batch()
    chunk = batch.sequence_chunk(1, 2)
    assert (batch.chunk_of, chunk.chunk_of, chunk.samples(0, 2).chunk_of, chunk.padded_to(30).chunk_of) == (1, 2, 2, 2)
    with pytest.raises(ValueError, match=r"^a sequence chunk \(one of 2\) needs sum_counts"):
        bert_batch_loss(*model(*chunk.model_inputs()), chunk)
    whole_batch = bert_batch_loss(*model(*batch.model_inputs()), batch)
    assert whole_batch.total == bert_batch_loss(*model(*batch.model_inputs()), batch, whole).total
    with pytest.raises(TypeError, match="sum_counts"):
        PipelineLoss()


@pytest.mark.parametrize("overrides,message", [
    (dict(hidden_size=30, num_attention_heads=4), "hidden_size 30 is not divisible by num_attention_heads 4"),
    (dict(seq_length=128, max_position_embeddings=64), "seq_length 128 exceeds max_position_embeddings 64"),
    (dict(layernorm_layout="sandwich"), "layernorm_layout 'sandwich' is unknown"),
    (dict(hidden_dropout=1.5), "hidden_dropout = 1.5 is outside [0, 1)"),
    (dict(num_layers=0), "num_layers = 0 must be positive"),
])
def test_bad_model_settings(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        BertConfig(**overrides)


def test_layernorm_uses_apex_only_on_cuda_when_installed(monkeypatch):
    import sys
    import types

    from megatron.model.layernorm import layer_norm

    assert type(layer_norm(8, 1e-5)) is torch.nn.LayerNorm  # CPU: torch's
    fake = types.ModuleType("apex.normalization")
    fake.FusedLayerNorm = type("FusedLayerNorm", (torch.nn.LayerNorm,), {})
    monkeypatch.setitem(sys.modules, "apex", types.ModuleType("apex"))
    monkeypatch.setitem(sys.modules, "apex.normalization", fake)
    assert type(layer_norm(8, 1e-5)) is torch.nn.LayerNorm  # installed, but no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert type(layer_norm(8, 1e-5)) is fake.FusedLayerNorm
    monkeypatch.setitem(sys.modules, "apex.normalization", None)  # PyPI's unrelated `apex`
    assert type(layer_norm(8, 1e-5)) is torch.nn.LayerNorm


def test_mlm_accuracy_is_the_share_of_masked_tokens_predicted():
    """Shares of the accuracy, like those of the loss, sum over chunks to the whole-sequence value."""
    logits = torch.randn(10, 16, generator=torch.Generator().manual_seed(0))
    labels = (logits.argmax(-1) + torch.tensor([0, 0, 0] + [1] * 7)) % 16  # the first 3 predicted right
    assert bert_loss(logits, labels, sum_counts=whole).mlm_accuracy.item() == pytest.approx(0.3)


@pytest.mark.parametrize("variant", ["dense", "ulysses"])
def test_eval_mode_turns_attention_dropout_off(variant):
    """In eval (validation, fill-mask, conversion checks) attention dropout 0.5 gives the loss of dropout 0."""
    batch = padded_batch()

    def loss(model):
        return bert_batch_loss(*model(*batch.model_inputs()), batch).total.detach()
    want = loss(small_model(small_config(variant)).eval())
    model = small_model(small_config(variant, attention_dropout=0.5))
    assert not torch.equal(loss(model), want), "the control: in training the dropout changes the loss"
    model.eval()
    assert torch.equal(loss(model), want) and torch.equal(loss(model), want)


def checkpointed_and_plain_under_autocast() -> tuple:
    """(dtypes of every layer GEMM's output, forward and recompute; whether the losses are equal; the
    parameters whose gradients differ) of one model, batch and bf16 autocast, with and without
    checkpointing (one rank: DeepSpeed's checkpointing wants its process group)."""
    import deepspeed

    from megatron.engine import checkpoint_layers
    from megatron.parallel import state

    state.initialize()
    deepspeed.checkpointing.configure(None, partition_activations=False)
    batch = padded_batch()
    runs, dtypes = [], set()
    for checkpointed in (False, True):
        model = small_model(small_config(num_layers=2, hidden_dropout=0.0, attention_dropout=0.0))
        if checkpointed:
            checkpoint_layers(model, 1)
        for module in model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = bert_batch_loss(*model(*batch.model_inputs()), batch).total
        loss.backward()
        runs.append((loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    (plain_loss, plain), (loss, checkpointed) = runs
    return dtypes, torch.equal(plain_loss, loss), [name for name in plain if not torch.equal(plain[name], checkpointed[name])]


def test_activation_checkpointing_recomputes_under_the_forwards_autocast():
    """Under bf16 autocast, a checkpointed layer's recompute runs in bf16 as its forward did:
    DeepSpeed 0.19.8's checkpoint recomputed outside autocast, in fp32 (on a GPU: fp32 GEMMs and
    fp32 attention kernels; gpu_longest's checkpointed steps ran several times slower than their
    kernels), and its gradients were those of other activations. Same model, batch and autocast
    with and without checkpointing: the same loss and gradients, every layer GEMM in bf16."""
    from megatron.parallel.spawn import run_on_ranks

    (dtypes, same_loss, differing), = run_on_ranks(checkpointed_and_plain_under_autocast, 1, timeout=120)
    assert dtypes == {torch.bfloat16}, dtypes
    assert same_loss and not differing, differing


def test_model_code_outside_attention_meets_no_process_group():
    """design.md: attention/ is the only model code that communicates. The loss's count sum and the
    pipeline's seq-group gradient sum are applied from megatron/parallel (reduce.py, pipeline.py);
    a module of megatron/model/ that imports torch.distributed or megatron.parallel, or reads
    torch.distributed, brings one back."""
    import ast
    from pathlib import Path

    import megatron.model

    def names(node) -> list:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom):
            return [f"{node.module}.{alias.name}" for alias in node.names]
        return [ast.unparse(node)] if isinstance(node, ast.Attribute) else []

    communicating = {}
    for path in sorted(Path(megatron.model.__file__).parent.glob("*.py")):
        found = {name for node in ast.walk(ast.parse(path.read_text())) for name in names(node)
                 if name.startswith(("torch.distributed", "megatron.parallel"))}
        if found:
            communicating[path.name] = sorted(found)
    assert communicating == {}
