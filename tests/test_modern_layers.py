"""The modern layer options (issue 22 items 1-2): rotary positions, gated MLPs, bias-free layers,
RMSNorm, ModernBERT's first layer, embeddings and heads, the presets; and classic BERT unchanged:
the default is the classic options with the same parameter names and bitwise the same outputs,
and an old config.json reads as classic (its arithmetic is held to transformers' BertForMaskedLM
within 1e-5 by test_hf_convert; a rewrite that moves outputs by less, such as another GELU
formula, passes both). Single process, CPU kernels (the multi-rank rope and local-layer tests
live with the local core; the CUDA branches in test_cuda_emulated and test_local_attention)."""
import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bert_fixtures import naive_masked_attention, packed_batch, padded_batch, segment_allowed, small_config, small_model
from megatron import hf_modernbert
from megatron.arguments import add_model_and_parallel_args, config_flags
from megatron.checkpoint_compat import check_model_shapes
from megatron.config import read_ds_config, resolve
from megatron.errors import ConfigError
from megatron.model import attention
from megatron.model.args import BertConfig, preset_fields
from megatron.model.bert import MLP, BertModel, apply_rotary, rotary_cos_sin
from megatron.model.pipe import EmbeddingPipe, HeadsPipe, TransformerLayerPipe

ROOT = Path(__file__).resolve().parents[1]
ROPE = dict(position_embedding_type="rope", type_vocab_size=0)
MODERN = dict(ROPE, rotary_base=160000.0, local_rotary_base=10000.0, mlp_type="geglu", add_bias_linear=False,
              embedding_layernorm=True, first_layer_attention_norm=False, add_binary_head=False)


def rope_reference(x, position_ids, base: float):
    """From the definition, in float64: pair (x[i], x[i + d/2]) turns by the angle position * base^(-2i/d)."""
    x, d = x.double(), x.shape[-1]
    angle = position_ids.double()[:, :, None, None] * base ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
    first, second = x[..., :d // 2], x[..., d // 2:]
    return torch.cat((first * angle.cos() - second * angle.sin(), second * angle.cos() + first * angle.sin()), -1)


# ---------------------------------------------------------------- rotary positions

@pytest.mark.parametrize("base", [10000.0, 160000.0])
def test_rope_matches_the_float64_definition(base):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 3, 16, generator=g)
    position_ids = torch.randint(0, 300, (2, 40), generator=g)
    got = apply_rotary(x, *rotary_cos_sin(position_ids, 16, base))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), rope_reference(x, position_ids, base), rtol=0, atol=2e-5)
    # bf16 in, bf16 out: the rotation itself runs in fp32
    low = apply_rotary(x.bfloat16(), *rotary_cos_sin(position_ids, 16, base))
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), rope_reference(x.bfloat16(), position_ids, base).bfloat16().double())


def test_rope_scores_depend_on_relative_positions_only():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 2, 8, generator=g).double(), torch.randn(1, 1, 2, 8, generator=g).double()

    def score(i, j):
        qi = apply_rotary(q, *rotary_cos_sin(torch.tensor([[i]]), 8, 10000.0))
        kj = apply_rotary(k, *rotary_cos_sin(torch.tensor([[j]]), 8, 10000.0))
        return (qi * kj).sum(-1)

    torch.testing.assert_close(score(3, 7), score(103, 107))
    assert not torch.allclose(score(3, 7), score(3, 8))


def attention_reference(layer, x, segment_ids, position_ids, base):
    """SelfAttention in float64 from its weights: q and k rotated, masked softmax, output projection."""
    attn = layer.attention
    b, s, h = x.shape
    heads, d = attn.num_heads, attn.head_dim
    qkv = F.linear(x.double(), attn.query_key_value.weight.double(),
                   None if attn.query_key_value.bias is None else attn.query_key_value.bias.double())
    q, k, v = qkv.view(b, s, 3, heads, d).unbind(2)
    q, k = rope_reference(q, position_ids, base), rope_reference(k, position_ids, base)
    context = naive_masked_attention(q, k, v, segment_allowed(segment_ids))
    return F.linear(context.reshape(b, s, h), attn.dense.weight.double(),
                    None if attn.dense.bias is None else attn.dense.bias.double())


@pytest.fixture
def dense_cores_everywhere(monkeypatch):
    """Local layers built with the dense core (their own core is tested with the local attention):
    here only the rope theta a layer picks matters."""
    build = attention.build
    monkeypatch.setattr(attention, "build", lambda config, layer_index=0: build(
        dataclasses.replace(config, local_attention_window=None), layer_index=layer_index))


def test_each_layer_rotates_q_and_k_with_its_own_theta(dense_cores_everywhere):
    config = small_config("dense", num_layers=4, local_attention_window=8, global_attention_every=3,
                          rotary_base=160000.0, local_rotary_base=500.0, init_method_std=0.3, **ROPE)
    assert [config.is_local_layer(i) for i in range(4)] == [False, True, True, False]
    model = small_model(config)
    batch = packed_batch()[0]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 48, 32, generator=g)
    for index, layer in enumerate(model.layers):
        base = 500.0 if index in (1, 2) else 160000.0
        assert layer.attention.rotary_base == base
        got = layer.attention(x, batch.segment_ids, batch.position_ids)
        want = attention_reference(layer, x, batch.segment_ids, batch.position_ids, base)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)


class RecordingCore(torch.nn.Module):
    """Stands in for the attention core: keeps the q and k it is handed."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, q, k, v, segment_ids):
        self.seen.append((q, k))
        return v


def test_rope_positions_come_from_position_ids_so_sp_chunks_use_their_global_positions():
    """A chunk's rotation is the same function of its position ids as the whole sequence's: the
    q and k a layer hands its core for chunk r are columns r of the whole sequence's."""
    model = small_model(small_config("dense", **ROPE))
    batch = packed_batch()[0]
    attention_layer = model.layers[0].attention
    attention_layer.core = core = RecordingCore()
    x = torch.randn(4, 48, 32, generator=torch.Generator().manual_seed(3))
    attention_layer(x, batch.segment_ids, batch.position_ids)
    full_q, full_k = core.seen.pop()
    for rank in range(4):
        chunk = batch.sequence_chunk(rank, 4)
        columns = slice(12 * rank, 12 * rank + 12)
        attention_layer(x[:, columns], chunk.segment_ids, chunk.position_ids)
        q, k = core.seen.pop()
        torch.testing.assert_close(q, full_q[:, columns], rtol=0, atol=1e-6)
        torch.testing.assert_close(k, full_k[:, columns], rtol=0, atol=1e-6)
    # sample 2 is one segment over the whole sequence: chunk 2 holds its positions 24..35, and
    # positions counted from the chunk's start would rotate q differently
    chunk = batch.sequence_chunk(2, 4)
    assert (chunk.position_ids[2] == torch.arange(24, 36)).all()
    attention_layer(x[:, 24:36], chunk.segment_ids, torch.arange(12).expand(4, 12))
    assert not torch.allclose(core.seen.pop()[0][2], full_q[2, 24:36], atol=1e-3)


def test_packed_rope_gives_each_segment_what_it_gets_alone():
    """Positions restart per segment: a packed sample's hidden states equal each segment's run alone."""
    model = small_model(small_config("dense", init_method_std=0.2, **MODERN))  # peaked attention: positions matter
    packed, alone = packed_batch()
    hidden = model.encode(*packed.model_inputs()[:4]).detach()
    for sample, singles in enumerate(alone):
        start = 0
        for single in singles:
            length = int((single.segment_ids != 0).sum())
            by_itself = model.encode(*single.model_inputs()[:4])[0, :length].detach()
            torch.testing.assert_close(hidden[sample, start:start + length], by_itself, rtol=0, atol=1e-5)
            start += length
    # the positions are read: all zero, the hidden states change; rope sees relative positions only,
    # so counted from the sample's start instead (one shift per segment) they stay, up to rounding
    real = packed.segment_ids != 0
    zeros = model.encode(packed.tokens, packed.token_types, torch.zeros_like(packed.position_ids), packed.segment_ids)
    assert not torch.allclose(zeros.detach()[real], hidden[real], atol=0.1)
    offsets = torch.arange(48).expand(4, 48).masked_fill(~real, 0)
    shifted = model.encode(packed.tokens, packed.token_types, offsets, packed.segment_ids).detach()
    torch.testing.assert_close(shifted[real], hidden[real], rtol=0, atol=1e-4)


def test_rope_model_has_no_position_table_and_passes_seq_beyond_max_positions():
    config = small_config("dense", seq_length=96, max_position_embeddings=16, **ROPE)
    model = small_model(config)
    assert not any("position_embeddings" in name or "token_type" in name for name in model.state_dict())
    batch = padded_batch(seq_length=96, pad_starts=(96, 50, 70, 90))
    mlm_logits, _ = model(*batch.model_inputs())
    assert torch.isfinite(mlm_logits).all()
    with pytest.raises(ConfigError, match="max_position_embeddings"):  # a table still bounds learned positions
        small_config("dense", seq_length=96, max_position_embeddings=16)


# ---------------------------------------------------------------- MLP, norms, biases

@pytest.mark.parametrize("mlp_type,activation", [
    ("geglu", lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))),
    ("swiglu", lambda a: a * torch.sigmoid(a)),
])
@pytest.mark.parametrize("bias", [True, False])
def test_gated_mlp_matches_the_float64_definition(mlp_type, activation, bias):
    config = small_config(mlp_type=mlp_type, ffn_hidden_size=24, add_bias_linear=bias)
    torch.manual_seed(4)
    mlp = MLP(config)
    if bias:  # init zeroes biases: give them values so the reference checks where they go
        torch.nn.init.normal_(mlp.dense_h_to_4h.bias)
        torch.nn.init.normal_(mlp.dense_4h_to_h.bias)
    w1, w2 = mlp.dense_h_to_4h.weight.double(), mlp.dense_4h_to_h.weight.double()
    assert w1.shape == (48, 32) and w2.shape == (32, 24)  # h -> 2 ffn, ffn -> h
    assert (mlp.dense_h_to_4h.bias is not None) == bias and (mlp.dense_4h_to_h.bias is not None) == bias
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(5))
    b1 = mlp.dense_h_to_4h.bias.double() if bias else torch.zeros(48, dtype=torch.float64)
    b2 = mlp.dense_4h_to_h.bias.double() if bias else torch.zeros(32, dtype=torch.float64)
    inner = x.double() @ w1[:24].T + b1[:24]  # the first half goes through the activation
    gate = x.double() @ w1[24:].T + b1[24:]  # and multiplies the second
    want = (activation(inner) * gate) @ w2.T + b2
    torch.testing.assert_close(mlp(x).double(), want, rtol=0, atol=1e-5)


def test_rmsnorm_and_bias_free_norms_match_their_definitions():
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(6)) * 3 + 1
    eps = 1e-5
    rms = small_model(small_config("dense", normalization="RMSNorm", layernorm_epsilon=eps))
    norms = [m for m in rms.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert len(norms) == 2 * 2 + 1 + 1 and not any(isinstance(m, torch.nn.LayerNorm) for m in rms.modules())
    norm = rms.final_layernorm
    torch.nn.init.normal_(norm.weight)
    want = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + eps) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), want, rtol=0, atol=1e-5)

    bias_free = small_model(small_config("dense", add_bias_linear=False, embedding_layernorm=True))
    norm = bias_free.final_layernorm
    assert isinstance(norm, torch.nn.LayerNorm) and norm.bias is None
    torch.nn.init.normal_(norm.weight)
    centred = x.double() - x.double().mean(-1, keepdim=True)
    want = centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), want, rtol=0, atol=1e-5)


def test_bias_free_model_keeps_only_the_decoder_bias():
    classic = small_model(small_config("dense", embedding_layernorm=True)).state_dict()
    bias_free = small_model(small_config("dense", add_bias_linear=False, embedding_layernorm=True)).state_dict()
    assert [name for name in bias_free if name.endswith("bias")] == ["lm_head.bias"]
    assert list(bias_free) == [name for name in classic if not name.endswith(".bias") or name == "lm_head.bias"]
    for name, tensor in bias_free.items():  # the same names draw the same starting values
        assert torch.equal(tensor, classic[name]), name


def test_modernbert_layout_layers_and_heads():
    model = small_model(small_config("dense", num_layers=3, **MODERN))
    assert isinstance(model.layers[0].attention_layernorm, torch.nn.Identity)
    assert all(isinstance(layer.attention_layernorm, torch.nn.LayerNorm) for layer in model.layers[1:])
    assert model.embeddings.position_embeddings is None and model.embeddings.token_type_embeddings is None
    assert isinstance(model.embeddings.layernorm, torch.nn.LayerNorm) and model.binary_head is None
    assert isinstance(model.final_layernorm, torch.nn.LayerNorm)
    head = model.lm_head  # dense (no bias) -> GELU -> norm (no bias) -> tied decoder with a bias
    assert head.dense.bias is None and head.layernorm.bias is None and head.bias.shape == (112,)
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(7))
    torch.nn.init.normal_(head.bias)
    weight = model.embeddings.word_embeddings.weight
    want = F.linear(F.layer_norm(F.gelu(hidden @ head.dense.weight.T), (32,), head.layernorm.weight), weight, head.bias)
    torch.testing.assert_close(head(hidden, weight), want)
    batch = packed_batch()[0]
    mlm_logits, sop_logits = model(*batch.model_inputs())  # token types in the batch are not read
    assert sop_logits is None and mlm_logits.shape == (int(batch.loss_mask.sum()), 112)


@pytest.mark.parametrize("overrides,message", [
    (dict(local_attention_window=7), "local_attention_window = 7"),
    (dict(local_attention_window=0), "local_attention_window = 0"),
    (dict(global_attention_every=0), "global_attention_every = 0"),
    (dict(position_embedding_type="rope", hidden_size=36, num_attention_heads=4), "even head dim"),
    (dict(position_embedding_type="rotary"), "position_embedding_type 'rotary'"),
    (dict(position_embedding_type="rope", rotary_base=0.5), "rotary_base = 0.5"),
    (dict(mlp_type="reglu"), "mlp_type 'reglu'"),
    (dict(normalization="ScaleNorm"), "normalization 'ScaleNorm'"),
    (dict(first_layer_attention_norm=False, layernorm_layout="post"), "first_layer_attention_norm"),
    (dict(type_vocab_size=-1), "type_vocab_size"),
])
def test_bad_layer_options_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        small_config("dense", **overrides)
    assert "\n" not in str(error.value) and "; " in str(error.value)


def test_local_layer_rule():
    assert not any(BertConfig().is_local_layer(i) for i in range(12))
    assert not any(BertConfig(global_attention_every=3).is_local_layer(i) for i in range(12))  # no window
    config = BertConfig(local_attention_window=128, global_attention_every=3)
    assert [i for i in range(9) if not config.is_local_layer(i)] == [0, 3, 6]
    assert [config.layer_rotary_base(i) for i in range(3)] == [10000.0, 10000.0, 10000.0]


# ---------------------------------------------------------------- presets, flags, JSON

def parse(*argv) -> dict:
    return config_flags(add_model_and_parallel_args(argparse.ArgumentParser()).parse_args(list(argv)))


def test_modernbert_presets_match_hugging_face():
    transformers = pytest.importorskip("transformers")
    hf = transformers.ModernBertConfig()
    # the vocab size is the run's (ModernBERT's here), not the preset's: its padding leaves HF's as it is
    base = resolve(parse("--model-preset", "modernbert-base", "--vocab-size", str(hf.vocab_size)), {}, world_size=1,
                   deepspeed_check=False).model
    local = [layer_type == "sliding_attention" for layer_type in hf.layer_types]
    assert [base.is_local_layer(i) for i in range(base.num_layers)] == local
    assert (base.num_layers, base.hidden_size, base.num_attention_heads, base.ffn_hidden_size) == (
        hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.intermediate_size)
    assert (base.rotary_base, base.local_rotary_base) == (hf.rope_parameters["full_attention"]["rope_theta"],
                                                         hf.rope_parameters["sliding_attention"]["rope_theta"])
    assert (base.local_attention_window, base.vocab_size, base.padded_vocab_size, preset_fields("modernbert-base")[
        "max_position_embeddings"], base.layernorm_epsilon) == (hf.local_attention, hf.vocab_size, hf.vocab_size,
                                                                hf.max_position_embeddings, hf.norm_eps)
    # a run from scratch declares the length it trains at (config.rope_positions), not the preset's 8192
    assert base.max_position_embeddings == base.seq_length
    assert base.add_bias_linear is hf.attention_bias is hf.mlp_bias is hf.norm_bias is hf.classifier_bias is False
    assert (base.mlp_type, hf.hidden_activation, hf.classifier_activation) == ("geglu", "gelu", "gelu")
    assert (base.position_embedding_type, base.type_vocab_size, base.add_binary_head) == ("rope", 0, False)
    assert (base.embedding_layernorm, base.first_layer_attention_norm, base.layernorm_layout) == (True, False, "pre")
    assert base.hidden_dropout == hf.embedding_dropout == hf.mlp_dropout == 0.0
    assert base.attention_dropout == hf.attention_dropout == 0.0
    large = resolve(parse("--model-preset", "modernbert-large", "--vocab-size", str(hf.vocab_size)), {}, world_size=1,
                    deepspeed_check=False).model
    assert (large.num_layers, large.hidden_size, large.num_attention_heads, large.ffn_hidden_size) == (
        28, 1024, 16, 2624)
    assert dataclasses.replace(large, num_layers=22, hidden_size=768, num_attention_heads=12,
                               ffn_hidden_size=1152) == base
    # resized by --hidden-size, a preset keeps its FFN ratio (not 1152 beside a hidden size of 64)
    small = [resolve(parse("--model-preset", "modernbert-base", "--hidden-size", "64", "--num-attention-heads", "4",
                           *ffn), {}, world_size=1, deepspeed_check=False).model.ffn_hidden_size
             for ffn in ([], ["--ffn-hidden-size", "80"])]
    assert small == [96, 80]


def test_modernbert_shaped_model_computes_what_hugging_face_modernbert_does():
    """The preset's layer layout with small sizes against ModernBertForMaskedLM (eager attention) with
    the same weights: rope per layer type, local window, GeGLU halves, no biases, norms, head."""
    transformers = pytest.importorskip("transformers")
    layers, window = 3, 8
    config = small_config("dense", num_layers=layers, seq_length=40, local_attention_window=window,
                          global_attention_every=3, init_method_std=0.2, ffn_hidden_size=48, vocab_size=112,
                          layernorm_epsilon=1e-5, **MODERN)
    model = small_model(config).eval()
    hf_config = transformers.ModernBertConfig(
        vocab_size=112, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=64, local_attention=window, global_attn_every_n_layers=3, global_rope_theta=160000.0,
        local_rope_theta=10000.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
        attn_implementation="eager")
    hf = transformers.ModernBertForMaskedLM(hf_config).eval()
    state = hf_modernbert.hf_state_from_bert(model.state_dict(), config)  # the converter's name map
    assert set(state) | {"decoder.weight"} == set(hf.state_dict())  # the decoder is tied, not stored
    hf.load_state_dict(state, strict=False)
    assert hf.decoder.weight is hf.model.embeddings.tok_embeddings.weight
    tokens = torch.randint(5, 112, (2, 40), generator=torch.Generator().manual_seed(8))
    ones = torch.ones_like(tokens)
    with torch.no_grad():
        hidden = model.encode(tokens, 0 * ones, torch.arange(40).expand(2, 40), ones)
        torch.testing.assert_close(hidden, hf.model(input_ids=tokens).last_hidden_state, rtol=0, atol=1e-5)
        logits = model.lm_head(hidden, model.embeddings.word_embeddings.weight)
        torch.testing.assert_close(logits, hf(input_ids=tokens).logits, rtol=0, atol=1e-5)


def test_model_preset_from_the_json_and_explicit_flags_win():
    flags = parse("--model-preset", "modernbert-base", "--num-layers", "4", "--rotary-base", "500000",
                  "--add-bias-linear", "--first-layer-attention-norm",
                  "--swiglu", "--type-vocab-size", "2", "--global-attention-every", "2")
    model = resolve(flags, {}, world_size=1, deepspeed_check=False).model
    assert (model.num_layers, model.rotary_base, model.add_bias_linear, model.position_embedding_type) == (
        4, 500000.0, True, "rope")
    # learned positions over the preset: its rope bases are not given, so not refused as unused
    learned = parse("--model-preset", "modernbert-base", "--position-embedding-type", "learned")
    assert resolve(learned, {}, world_size=1, deepspeed_check=False).model.position_embedding_type == "learned"
    with pytest.raises(ConfigError, match="--rotary-base 500000.0 is set but positions are learned"):
        resolve({**learned, "rotary_base": 500000.0}, {}, world_size=1, deepspeed_check=False)
    assert (model.first_layer_attention_norm, model.mlp_type, model.type_vocab_size) == (True, "swiglu", 2)
    assert (model.global_attention_every, model.hidden_size, model.local_attention_window) == (2, 768, 128)
    assert parse("--mlp-type", "geglu")["mlp_type"] == "geglu" and parse("--normalization", "RMSNorm")[
        "normalization"] == "RMSNorm"
    assert parse("--disable-bias-linear")["add_bias_linear"] is False

    ds = read_ds_config(ROOT / "ds_configs" / "modernbert_ring_sp2.json")
    from_json = resolve(parse("--seq-length", "1024"), ds, world_size=2, deepspeed_check=False)
    assert from_json.model == dataclasses.replace(
        resolve(parse("--model-preset", "modernbert-base", "--seq-length", "1024", "--attention", "ring"), {},
                world_size=2, deepspeed_check=False).model, max_segment_length=1024)
    assert from_json.pack_samples and from_json.model.max_segment_length == 1024  # rope: a segment may fill it
    with pytest.raises(ConfigError, match="--model-preset modernbert-large contradicts sequence_parallel.model_preset "
                                          "modernbert-base of the DeepSpeed JSON"):  # two presets: neither wins silently
        resolve(parse("--model-preset", "modernbert-large"), ds, world_size=2, deepspeed_check=False)
    assert "rope, local window 128 (global every 3), geglu, no biases" in from_json.summary()
    with pytest.raises(ConfigError, match="sequence_parallel.model_preset: model preset 'modernbert-xl'"):
        resolve({}, {"sequence_parallel": {"model_preset": "modernbert-xl"}}, world_size=1, deepspeed_check=False)
    stored = json.loads(json.dumps(from_json.to_dict()))["model"]  # config.json and checkpoints
    assert BertConfig(**stored) == from_json.model


NEW_FLAGS = ("--model-preset", "--position-embedding-type", "--rotary-base", "--local-rotary-base",
             "--local-attention-window", "--global-attention-every", "--mlp-type", "--swiglu", "--disable-bias-linear",
             "--add-bias-linear", "--normalization", "--no-first-layer-attention-norm", "--first-layer-attention-norm",
             "--type-vocab-size")


def test_ds_config_tool_and_help_know_the_new_flags(capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import ds_config
    finally:
        sys.path.remove(str(ROOT / "tools"))
    path = ROOT / "ds_configs" / "modernbert_ring_sp2.json"
    assert ds_config.main(["show", str(path), "--mlp-type", "swiglu", "--normalization", "RMSNorm"]) == 0
    shown = json.loads(capsys.readouterr().out)["model"]
    assert (shown["mlp_type"], shown["normalization"], shown["position_embedding_type"], shown["num_layers"]) == (
        "swiglu", "RMSNorm", "rope", 22)
    assert ds_config.main(["show", str(path), "--local-attention-window", "9"]) == 2
    assert "local_attention_window = 9" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ds_config.main(["show", "--help"])
    tool_help = capsys.readouterr().out
    trainer_help = add_model_and_parallel_args(argparse.ArgumentParser()).format_help()  # pretrain_bert.py's groups
    for flag in NEW_FLAGS:
        assert flag in tool_help and flag in trainer_help, flag


# ---------------------------------------------------------------- classic BERT unchanged

# BertModel(small_config()).state_dict() names, from the code before the layer options (git HEAD 102f5e6)
CLASSIC_KEYS = [
    "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight",
    *[f"layers.{i}.{name}" for i in range(2) for name in (
        "attention_layernorm.weight", "attention_layernorm.bias", "attention.query_key_value.weight",
        "attention.query_key_value.bias", "attention.dense.weight", "attention.dense.bias", "mlp_layernorm.weight",
        "mlp_layernorm.bias", "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight",
        "mlp.dense_4h_to_h.bias")],
    "final_layernorm.weight", "final_layernorm.bias", "lm_head.bias", "lm_head.dense.weight", "lm_head.dense.bias",
    "lm_head.layernorm.weight", "lm_head.layernorm.bias", "binary_head.pooler.weight", "binary_head.pooler.bias",
    "binary_head.classifier.weight", "binary_head.classifier.bias"]
CLASSIC_OPTIONS = dict(position_embedding_type="learned", local_attention_window=None, global_attention_every=1,
                       mlp_type="gelu", add_bias_linear=True, normalization="LayerNorm",
                       first_layer_attention_norm=True, type_vocab_size=2)


def test_classic_bert_is_the_default_with_its_names_and_outputs():
    default = small_model(small_config("dense"))
    assert list(default.state_dict()) == CLASSIC_KEYS
    explicit = small_model(small_config("dense", **CLASSIC_OPTIONS))
    batch = padded_batch()
    for ours, theirs in zip(default(*batch.model_inputs()), explicit(*batch.model_inputs())):
        assert torch.equal(ours, theirs)
    # a checkpoint's config.json written before these fields existed resumes as classic BERT
    old_fields = {name: value for name, value in dataclasses.asdict(small_config("dense")).items()
                  if name not in CLASSIC_OPTIONS or name == "type_vocab_size"}
    check_model_shapes(old_fields, small_config("dense"), "ckpt/iter_0000001")
    with pytest.raises(ConfigError, match="lacks embeddings.layernorm.weight, which this model has"):
        check_model_shapes(old_fields, small_config("dense", **MODERN), "ckpt/iter_0000001")
    with pytest.raises(ConfigError, match="holds layers.0.attention_layernorm.bias, which this model does not have"):
        check_model_shapes(old_fields, small_config("dense", add_bias_linear=False), "ckpt/iter_0000001")


def pipeline_stages_like(model: BertModel):
    """The pipeline's stage modules (pipe.py) holding `model`'s weights."""
    config = model.config
    embedding = EmbeddingPipe(config)
    embedding.load_state_dict({k: v for k, v in model.embeddings.state_dict().items() if "word_embeddings" not in k})
    layers = [TransformerLayerPipe(config, index) for index in range(config.num_layers)]
    for layer, source in zip(layers, model.layers):
        layer.load_state_dict(source.state_dict())
    heads = HeadsPipe(config)
    heads.load_state_dict({k: v for k, v in model.state_dict().items()
                           if k.split(".")[0] in ("final_layernorm", "lm_head", "binary_head")})
    return embedding, layers, heads


@pytest.mark.parametrize("options", [{}, MODERN], ids=["classic", "modern"])
def test_pipeline_stages_carry_position_ids_and_compute_what_the_model_does(options):
    model = small_model(small_config("dense", num_layers=3, **options))
    embedding, layers, heads = pipeline_stages_like(model)
    batch = packed_batch()[0]
    tokens, token_types, position_ids, segment_ids, mlm_mask, cls_mask = batch.model_inputs()
    words = model.embeddings.word_embeddings(tokens)
    stage = embedding((words, token_types, position_ids, segment_ids, mlm_mask, cls_mask))
    assert [t.dtype for t in stage] == [torch.float32, torch.int64, torch.int64, torch.int64]  # no bool crosses
    assert torch.equal(stage[2], position_ids)
    for layer in layers:
        stage = layer(stage)
    outputs = heads((*stage, model.embeddings.word_embeddings.weight))
    expected = model(*batch.model_inputs())
    for got, want in zip(outputs if isinstance(outputs, tuple) else (outputs,), expected):
        assert torch.equal(got, want)
