"""Hugging Face ModernBERT <-> BertModel (megatron/hf_modernbert.py): the same hidden states and MLM
logits as transformers' ModernBertForMaskedLM / ModernBertModel (fp32, within 1e-5) on random configs
of several shapes at lengths below, at and well above the local window, also split over two ranks
(ring and hybrid, real ranks over gloo; within 1e-5 of the largest value); both config schemas; exact
round trips both ways; the export loads in transformers; the layouts a converter gets wrong (qkv
order, GeGLU halves, the window) would fail these tests; missing tensors and configs we cannot
reproduce are one line; a checkpoint of a pipeline x sequence-parallel run exports through the tool.
HF models are built from small configs with random weights, offline."""
import dataclasses
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from megatron import hf_convert, hf_io, hf_modernbert
from megatron.errors import ConfigError, DataError
from megatron.hf_forms import export_problem
from megatron.model.bert import BertConfig, BertModel
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from test_hf_convert import max_diff, write_vocab_file

ATOL = 1e-5
# (HF ModernBertConfig sizes and options, our attention core for the global layers)
SHAPES = {
    # ModernBERT's layout shrunk: GeGLU, no biases, a global layer every 3rd, a vocab padded to 128 here
    "geglu-every3": dict(vocab_size=100, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=48, local_attention=8, global_attn_every_n_layers=3,
                         global_rope_theta=1000.0, local_rope_theta=100.0),
    # SwiGLU, biases everywhere, every 2nd layer global, head dim 16, a vocab already a multiple of 64
    "swiglu-bias-every2": dict(vocab_size=128, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                               intermediate_size=40, local_attention=16, global_attn_every_n_layers=2,
                               global_rope_theta=160000.0, local_rope_theta=10000.0, hidden_activation="silu",
                               attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True),
    # two heads of 32, five layers, global 0 and 4, the smallest window (one key each side)
    "window2-every4": dict(vocab_size=64, hidden_size=64, num_hidden_layers=5, num_attention_heads=2,
                           intermediate_size=96, local_attention=2, global_attn_every_n_layers=4,
                           global_rope_theta=50000.0, local_rope_theta=500.0),
}
SPECIAL = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random, large enough that attention is peaked (positions and the window
    matter); norm weights near 1 and biases small."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise * 0.3 if p.dim() > 1 else 1 + 0.1 * noise if name.endswith("weight") else 0.1 * noise)


def hf_folder(tmp_path, shape: str, heads: bool = True, seed: int = 0):
    """A random ModernBertForMaskedLM (or ModernBertModel) saved by transformers into tmp_path."""
    config = transformers.ModernBertConfig(**SHAPES[shape], **SPECIAL, max_position_embeddings=512)
    torch.manual_seed(seed)
    model = (transformers.ModernBertForMaskedLM if heads else transformers.ModernBertModel)(config)
    randomize(model, seed)
    folder = tmp_path / f"{shape}-{'mlm' if heads else 'base'}"
    model.save_pretrained(folder)
    return model.eval(), folder


def our_config(folder, **overrides) -> BertConfig:
    fields = hf_convert.bert_fields_from_hf(hf_io.read_hf_config(folder))
    return BertConfig(**{**fields, "seq_length": 512, "attention": "dense", **overrides})


def our_model(folder, **overrides) -> BertModel:
    config = our_config(folder, **overrides)
    model = BertModel(config).eval()
    model.load_state_dict(hf_convert.load_hf_as_bert_state(folder, config))
    return model


def inputs(length: int, vocab: int, seed: int = 1):
    """Two samples: one full, one padded from 2/3 of the length."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (2, length), generator=g)
    real = torch.ones(2, length, dtype=torch.long)
    real[1, max(1, 2 * length // 3):] = 0
    return tokens.masked_fill(real == 0, 0), real


def compare(ours: BertModel, hf, length: int, label: str) -> tuple[float, float]:
    """Max |diff| of the final hidden states and the MLM logits (our padded vocab cut to HF's) at
    every real token; HF given the padding as its attention_mask."""
    vocab = ours.config.vocab_size
    tokens, real = inputs(length, vocab)
    with torch.no_grad():
        hidden = ours.encode(tokens, torch.zeros_like(tokens), torch.arange(length).expand(2, length), real)
        logits = ours.lm_head(hidden, ours.embeddings.word_embeddings.weight)[..., :vocab]
        base = hf.model if isinstance(hf, transformers.ModernBertForMaskedLM) else hf
        hf_hidden = base(input_ids=tokens, attention_mask=real).last_hidden_state
        mask = real.bool()
        diffs = (max_diff(hidden[mask], hf_hidden[mask]),)
        if isinstance(hf, transformers.ModernBertForMaskedLM):
            diffs += (max_diff(logits[mask], hf(input_ids=tokens, attention_mask=real).logits[mask]),)
    print(f"{label} length {length}: max |hidden diff| {diffs[0]:.1e}" +
          (f", max |MLM logit diff| {diffs[1]:.1e}" if len(diffs) > 1 else ""))
    return diffs


def lengths(window: int) -> list:
    """Below the window (every key in reach), at it, just above and well above."""
    return sorted({max(1, window // 2), window, window + 1, 6 * window + 5})


# ---------------------------------------------------------------- HF -> ours

@pytest.mark.parametrize("shape", SHAPES)
def test_hf_to_ours_same_hidden_states_and_logits(tmp_path, shape):
    hf, folder = hf_folder(tmp_path, shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a complete folder: no tensor initialised or ignored
        ours = our_model(folder)
    window = SHAPES[shape]["local_attention"]
    assert ours.config.local_attention_window == window
    assert [ours.config.is_local_layer(i) for i in range(ours.config.num_layers)] == [
        kind == "sliding_attention" for kind in hf.config.layer_types]
    for length in lengths(window):
        assert max(compare(ours, hf, length, shape)) <= ATOL


def rank_outputs(folder: str, variant: str, lengths: list) -> list:
    """This rank's (hidden states, MLM logits) of its chunk at SP 2, per length (hybrid: Ulysses 2)."""
    hybrid = variant == "hybrid"
    state.initialize(sequence=2, ulysses=2 if hybrid else 1)
    ours = our_model(Path(folder), attention=variant, **({"ulysses_size": 2} if hybrid else {}))
    outputs = []
    for length in lengths:
        tokens, real = inputs(length, ours.config.vocab_size)
        rank, step = state.get_sequence_parallel_rank(), length // 2
        chunk = slice(rank * step, (rank + 1) * step)
        with torch.no_grad():
            hidden = ours.encode(tokens[:, chunk], torch.zeros_like(tokens[:, chunk]),
                                 torch.arange(length).expand(2, length)[:, chunk], real[:, chunk])
            outputs.append((hidden, ours.lm_head(hidden, ours.embeddings.word_embeddings.weight)))
    return outputs


@pytest.mark.parametrize("variant", ["ring", "hybrid"])
def test_hf_to_ours_at_sequence_parallel_two(tmp_path, variant):
    """The converted model split over two ranks (local layers exchanging halos) gives transformers'
    outputs within 1e-5 of their largest magnitude: the ring's log-sum-exp merge sums in another
    order than one softmax, so its absolute differences reach 4e-5 on logits of about 9 (SP = 1
    stays within 1e-5 absolute)."""
    hf, folder = hf_folder(tmp_path, "geglu-every3")
    window = SHAPES["geglu-every3"]["local_attention"]
    lengths = [window, 6 * window + 6]  # at the window; well above it, with halos crossing the chunks
    ranks = run_on_ranks(rank_outputs, 2, str(folder), variant, lengths, timeout=300)
    for index, length in enumerate(lengths):
        tokens, real = inputs(length, hf.config.vocab_size)
        with torch.no_grad():
            hf_hidden = hf.model(input_ids=tokens, attention_mask=real).last_hidden_state
            hf_logits = hf(input_ids=tokens, attention_mask=real).logits
        mask = real.bool()
        for name, position, want in (("hidden", 0, hf_hidden), ("logits", 1, hf_logits)):
            got = torch.cat([r[index][position] for r in ranks], 1)[..., :want.shape[-1]]
            error = max_diff(got[mask], want[mask]) / want[mask].abs().max().item()
            assert error <= ATOL, f"{variant} sp=2 length {length} {name}: {error:.1e} of the largest"


def test_model_folder_initialises_only_the_mlm_head_in_one_warning(tmp_path):
    hf, folder = hf_folder(tmp_path, "swiglu-bias-every2", heads=False)
    with pytest.warns(UserWarning) as record:
        ours = our_model(folder)
    assert len(record) == 1 and str(record[0].message) == (
        "not in the Hugging Face folder, initialised: lm_head.bias, lm_head.dense.bias, lm_head.dense.weight, "
        "lm_head.layernorm.bias, lm_head.layernorm.weight")
    for length in lengths(16):
        assert compare(ours, hf, length, "ModernBertModel")[0] <= ATOL


def test_a_fine_tuned_classifier_folder_reads_as_its_model_in_one_warning(tmp_path):
    """ModernBertForSequenceClassification's head.* feeds its classifier, never the tied decoder: dropped
    with the classifier, the MLM head initialised as for a ModernBertModel (was: 'lacks decoder.bias')."""
    config = transformers.ModernBertConfig(**SHAPES["geglu-every3"], **SPECIAL, num_labels=3)
    torch.manual_seed(0)
    hf = transformers.ModernBertForSequenceClassification(config)
    randomize(hf, seed=0)
    hf.eval().save_pretrained(tmp_path / "classifier")
    with pytest.warns(UserWarning) as record:
        ours = our_model(tmp_path / "classifier")
    assert len(record) == 1 and str(record[0].message) == (
        "a ModernBertForSequenceClassification folder: its task head is dropped (not a masked-LM head): "
        "classifier.bias, classifier.weight, head.dense.weight, head.norm.weight; not in the Hugging Face folder, "
        "initialised: lm_head.bias, lm_head.dense.weight, lm_head.layernorm.weight")
    assert compare(ours, hf.model, 30, "ModernBertForSequenceClassification")[0] <= ATOL


def test_a_folder_without_decoder_bias_reads_as_a_zero_bias(tmp_path):
    config = transformers.ModernBertConfig(**SHAPES["geglu-every3"], **SPECIAL, decoder_bias=False)
    torch.manual_seed(0)
    hf = transformers.ModernBertForMaskedLM(config)
    randomize(hf, seed=0)
    hf.eval().save_pretrained(tmp_path / "no-bias")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = our_model(tmp_path / "no-bias")
    assert not ours.lm_head.bias[:100].any()
    assert max(compare(ours, hf, 30, "decoder_bias false")) <= ATOL


@pytest.mark.parametrize("removed", [
    ("model.layers.2.attn.Wqkv.weight",),  # a layer's
    ("model.embeddings.norm.weight", "model.final_norm.weight"),  # the embedding norm, the final norm
    ("head.norm.weight",),  # part of the MLM head: a folder holds it whole or not at all
])
def test_a_missing_tensor_is_one_error_line(tmp_path, removed):
    _, folder = hf_folder(tmp_path, "geglu-every3")
    tensors = hf_io.read_safetensors(folder / "model.safetensors")
    hf_io.write_safetensors(folder / "model.safetensors", {n: t for n, t in tensors.items() if n not in removed})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no "initialised" warning first
        with pytest.raises(DataError) as error:
            hf_convert.load_hf_as_bert_state(folder, our_config(folder))
    text = str(error.value)
    assert "\n" not in text and f"lacks {len(removed)} tensor(s) of the model: " in text, text
    assert all(name in text for name in removed)


OWN_CONFIG = "or put the config.json of these weights in the folder"


@pytest.mark.parametrize("kind,changes,message", [
    ("modernbert", {"model_type": "bert"}, "says model_type 'bert', but the weights are a modernbert model's "
     f"(e.g. ...); set model_type to 'modernbert' in config.json, {OWN_CONFIG}"),
    ("bert", {"model_type": "modernbert"}, "says model_type 'modernbert', but the weights are a bert model's "
     f"(e.g. ...); set model_type to 'bert' in config.json, {OWN_CONFIG}"),
    ("megatron-bert", {"model_type": "bert"}, "says model_type 'bert', but the weights are a megatron-bert "
     f"model's (e.g. ...); set model_type to 'megatron-bert' in config.json, {OWN_CONFIG}"),
    ("modernbert", {"vocab_size": 90}, "the Hugging Face config.json's vocab_size 90 contradicts the 100 rows of "
     "model.embeddings.tok_embeddings.weight; set vocab_size to 100 in config.json"),
    ("bert", {"vocab_size": 90}, "the Hugging Face config.json's vocab_size 90 contradicts the 97 rows of "
     "bert.embeddings.word_embeddings.weight; set vocab_size to 97 in config.json"),
])
def test_a_config_json_that_contradicts_its_weights_names_its_field(tmp_path, kind, changes, message):
    """Was 'lacks 53 tensor(s) of the model ...; copy or download the model folder again' (after a warning
    listing every weight as ignored) for one family's weights under another model_type, and 'convert with
    the settings of the Hugging Face config' for a vocab_size other than the embedding's rows (from-hf
    converts with them): one line naming config.json's field and the value the weights need."""
    from test_hf_convert import hf_model

    folder = hf_folder(tmp_path, "geglu-every3")[1] if kind == "modernbert" else hf_model(kind, tmp_path)[1]
    settings = folder / "config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), **changes}))
    fields = hf_convert.bert_fields_from_hf(hf_io.read_hf_config(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "ignored" warning line first
        with pytest.raises(DataError) as error:
            hf_convert.load_hf_weights(folder, BertConfig(**fields, seq_length=64))
    assert re.sub(r"\(e\.g\. \S+\)", "(e.g. ...)", str(error.value).replace(f"{settings} ", "")) == message


def test_sharded_folder_reads_alike(tmp_path):
    hf, folder = hf_folder(tmp_path, "geglu-every3")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    config = our_config(folder)
    want, got = (hf_convert.load_hf_as_bert_state(path, config) for path in (folder, tmp_path / "sharded"))
    assert set(got) == set(want) and all(torch.equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("preset,sizes", [
    ("modernbert-base", {}),
    ("modernbert-large", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, intermediate_size=2624)),
])
def test_modernbert_configs_read_as_our_presets(preset, sizes):
    """ModernBERT-base's and -large's configs give the presets' fields, the 50368 vocab unpadded."""
    from megatron.model.args import MODEL_PRESETS

    fields = hf_convert.bert_fields_from_hf(transformers.ModernBertConfig(**sizes).to_dict())
    assert {name: fields[name] for name in MODEL_PRESETS[preset]} == MODEL_PRESETS[preset]
    assert BertConfig(**fields).padded_vocab_size == 50368


def test_a_run_takes_the_layer_rule_of_a_modern_start_only():
    """What the trainer takes from a start beyond the shapes: a modern model's layer rule, head and
    padding (only the options its layers read); nothing from a classic BERT's (even one whose own
    fields are not a valid config alone, as an HF folder's without the run's seq_length)."""
    bert = hf_convert.bert_fields_from_hf(transformers.BertConfig(max_position_embeddings=64).to_dict())
    assert hf_modernbert.carried_fields(bert) == {} == hf_modernbert.carried_fields(dataclasses.asdict(BertConfig()))
    modern = hf_modernbert.fields_from_hf(transformers.ModernBertConfig(**SHAPES["geglu-every3"]).to_dict())
    assert hf_modernbert.carried_fields(modern) == dict(
        add_binary_head=False, make_vocab_size_divisible_by=64, rotary_base=1000.0, local_rotary_base=100.0,
        local_attention_window=8, global_attention_every=3)
    one_layer = {**modern, "num_layers": 1}  # no local layer: the window, period and local theta are unread
    assert hf_modernbert.carried_fields(one_layer) == dict(add_binary_head=False, make_vocab_size_divisible_by=64,
                                                           rotary_base=1000.0)


# ---------------------------------------------------------------- both config schemas

def old_schema(config: dict) -> dict:
    """transformers 4.x's config.json of the same model: no layer_types / rope_parameters."""
    old = {k: v for k, v in config.items() if k not in ("layer_types", "rope_parameters")}
    return {**old, "global_rope_theta": config["rope_parameters"]["full_attention"]["rope_theta"],
            "local_rope_theta": config["rope_parameters"]["sliding_attention"]["rope_theta"],
            "position_embedding_type": "absolute", "layer_norm_eps": 1e-5}  # two keys 4.x folders carry unread


def test_both_config_schemas_read_alike_and_as_transformers_reads_them(tmp_path):
    hf, folder = hf_folder(tmp_path, "window2-every4")
    new = json.loads((folder / "config.json").read_text())
    assert "layer_types" in new and "rope_parameters" in new  # what the installed transformers writes
    (folder / "config.json").write_text(json.dumps(old_schema(new)))
    fields = hf_modernbert.fields_from_hf(old_schema(new))
    assert fields == hf_modernbert.fields_from_hf(new)
    assert (fields["rotary_base"], fields["local_rotary_base"], fields["global_attention_every"]) == (
        50000.0, 500.0, 4)
    reread = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()  # transformers reads 4.x's too
    assert reread.config.layer_types == hf.config.layer_types
    ours = our_model(folder)
    for length in lengths(2):
        assert max(compare(ours, reread, length, "4.x schema")) <= ATOL
    # 4.x defaults for keys left out, and a null local theta read as the global one (4.x's reading)
    bare = {k: v for k, v in old_schema(new).items() if k not in ("global_attn_every_n_layers", "local_attention",
                                                                   "global_rope_theta", "local_rope_theta")}
    fields = hf_modernbert.fields_from_hf(bare)
    assert (fields["global_attention_every"], fields["local_attention_window"], fields["rotary_base"],
            fields["local_rotary_base"]) == (3, 128, 160000.0, 10000.0)
    assert hf_modernbert.fields_from_hf({**old_schema(new), "local_rope_theta": None})["local_rotary_base"] == 50000.0
    # 5.x's rope_parameters win over 4.x's keys, as in transformers
    assert hf_modernbert.fields_from_hf({**new, "global_rope_theta": 7.0})["rotary_base"] == 50000.0


@pytest.mark.parametrize("change,message", [
    (dict(hidden_activation="gelu_new"), "hidden_activation 'gelu_new' is not reproduced here"),
    (dict(classifier_activation="relu"), "classifier_activation 'relu' is not reproduced here"),
    (dict(mlp_bias=True), "this model has biases everywhere or nowhere"),
    (dict(tie_word_embeddings=False), "sets tie_word_embeddings false (its MLM decoder has weights of its own): this "
                                      "trainer ties the decoder to the token embeddings, so the model cannot be "
                                      "converted without changing its outputs"),
    (dict(layer_types=["sliding_attention"] + ["full_attention"] * 4), "has no global layer every N"),
    (dict(layer_types=["full_attention"] * 3), "is not a list of 5 entries"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     "rope_type 'yarn'"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling"),
    (dict(num_attention_heads="4"), "num_attention_heads = '4' in the Hugging Face config.json is not an integer"),
    (dict(local_attention=1), "local_attention = 1 in the Hugging Face config.json is not an integer >= 2"),
])
def test_configs_we_do_not_reproduce_are_one_line(change, message):
    config = transformers.ModernBertConfig(**SHAPES["window2-every4"], **SPECIAL).to_dict()
    with pytest.raises(ConfigError) as error:
        hf_convert.bert_fields_from_hf({**config, **change})
    assert message in str(error.value) and "\n" not in str(error.value)


HEAD_OPTIONS = dict(classifier_bias=True, classifier_activation="silu", tie_word_embeddings=False)


@pytest.mark.parametrize("architecture", ["ModernBertForSequenceClassification", "ModernBertForTokenClassification",
                                          "ModernBertModel"])
def test_options_of_an_mlm_head_that_is_not_read_refuse_nothing(architecture):
    """classifier_bias / classifier_activation configure head.* and tie_word_embeddings the decoder: a
    fine-tuned folder's head is dropped and a base model has none, so they cannot refuse it (was:
    'convert a model whose biases are all on or off', which no fine-tuned classifier can follow)."""
    base = transformers.ModernBertConfig(**SHAPES["window2-every4"], **SPECIAL).to_dict()
    fields = hf_convert.bert_fields_from_hf({**base, **HEAD_OPTIONS, "architectures": [architecture]})
    assert fields["add_bias_linear"] is False  # the encoder's, not the dropped head's
    for key, value in HEAD_OPTIONS.items():  # each refused where the MLM head is read
        with pytest.raises(ConfigError, match=key):
            hf_convert.bert_fields_from_hf({**base, key: value, "architectures": ["ModernBertForMaskedLM"]})


def test_a_run_changes_the_thetas_and_window_not_the_tensors(tmp_path):
    """A longer context wants a new global theta: allowed; a size or a layer option is not."""
    _, folder = hf_folder(tmp_path, "geglu-every3")
    hf_convert.load_hf_as_bert_state(folder, our_config(folder, rotary_base=640000.0, local_attention_window=16))
    with pytest.raises(ConfigError, match="the Hugging Face model has mlp_type geglu, this model swiglu; "
                                          "set mlp_type to geglu"):
        hf_convert.load_hf_as_bert_state(folder, our_config(folder, mlp_type="swiglu"))
    with pytest.raises(ConfigError, match="has first_layer_attention_norm False, this model True"):
        hf_convert.load_hf_as_bert_state(folder, our_config(folder, first_layer_attention_norm=True))


# ---------------------------------------------------------------- the layouts a converter gets wrong

def test_wrong_layouts_would_fail_the_parity(tmp_path):
    """What a careless port does, each far beyond the tolerance: Wqkv read as [heads][3][head_dim],
    the GeGLU halves swapped, the sliding window dropped (every layer global)."""
    hf, folder = hf_folder(tmp_path, "geglu-every3")
    right = our_model(folder)
    state = right.state_dict()
    qkv = "layers.1.attention.query_key_value.weight"
    interleaved = {qkv: state[qkv].view(4, 3, 8, 32).transpose(0, 1).reshape(96, 32)}
    wi = "layers.1.mlp.dense_h_to_4h.weight"
    swapped = {wi: torch.cat(state[wi].chunk(2)[::-1])}
    for label, change, overrides in (("qkv interleaved", interleaved, {}), ("GeGLU halves swapped", swapped, {}),
                                     ("window dropped", {}, dict(local_attention_window=None))):
        wrong = BertModel(our_config(folder, **overrides)).eval()
        wrong.load_state_dict({**state, **change})
        assert max(compare(wrong, hf, 53, label)) > 1e-2, label


# ---------------------------------------------------------------- ours -> HF and back

def modern_config(**overrides) -> BertConfig:
    values = dict(vocab_size=97, hidden_size=32, num_layers=4, num_attention_heads=4, ffn_hidden_size=40,
                  seq_length=128, max_position_embeddings=128, make_vocab_size_divisible_by=64,
                  position_embedding_type="rope", rotary_base=2000.0, local_rotary_base=300.0,
                  local_attention_window=10, global_attention_every=3, mlp_type="geglu", add_bias_linear=False,
                  embedding_layernorm=True, first_layer_attention_norm=False, type_vocab_size=0,
                  add_binary_head=False, hidden_dropout=0.0, attention_dropout=0.0, attention="dense")
    return BertConfig(**{**values, **overrides})


def test_export_states_the_length_a_rope_model_trained_at():
    """Rope has no table: a run may train beyond max_position_embeddings (a folder's 128, continued at
    512); the export's positions and the tokenizer's model_max_length are the trained length then."""
    config = modern_config(seq_length=512)
    assert hf_modernbert.hf_config_from_bert(config, {"pad": 0, "cls": 2, "sep": 3})["max_position_embeddings"] == 512
    assert hf_io.tokenizer_config(config, lower_case=True)["model_max_length"] == 512
    learned = modern_config(position_embedding_type="learned", seq_length=64)
    assert hf_io.hf_positions(learned) == 128  # a table's rows


@pytest.mark.parametrize("overrides", [{}, dict(mlp_type="swiglu", add_bias_linear=True, global_attention_every=2)],
                         ids=["geglu", "swiglu-bias"])
def test_ours_to_hf_loads_in_transformers_and_back_bitwise(tmp_path, overrides):
    config = modern_config(**overrides)
    assert config.padded_vocab_size == 128  # 31 padded rows: trimmed on export, re-made on import
    torch.manual_seed(3)
    ours = BertModel(config).eval()
    randomize(ours, seed=3)
    vocab = write_vocab_file(tmp_path / "vocab.txt")
    hf_convert.save_hf_folder(tmp_path / "hf", ours.state_dict(), config, vocab, lower_case=True)
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["architectures"] == ["ModernBertForMaskedLM"] and written["vocab_size"] == 97
    full, sliding = "full_attention", "sliding_attention"
    assert written["local_attention"] == 10 and written["layer_types"] == (
        [full, sliding, sliding, full] if config.global_attention_every == 3 else [full, sliding, full, sliding])
    assert (written["global_attn_every_n_layers"], written["global_rope_theta"], written["local_rope_theta"]) == (
        config.global_attention_every, 2000.0, 300.0)  # 4.x's keys too, consistent
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "ModernBertForMaskedLM"
    assert hf.decoder.weight.data_ptr() == hf.model.embeddings.tok_embeddings.weight.data_ptr()  # tied
    for length in lengths(10):
        assert max(compare(ours, hf, length, f"ours ({config.mlp_type}) -> HF")) <= ATOL
    # back: bitwise on every real row (the padded rows are re-made: zero embeddings, bias -1e4)
    back = hf_convert.load_hf_as_bert_state(tmp_path / "hf", config)
    assert set(back) == set(ours.state_dict())
    for name, tensor in ours.state_dict().items():
        rows = config.vocab_size if name in hf_io.PADDED else None
        assert torch.equal(back[name][:rows], tensor[:rows]), name
    assert (back["lm_head.bias"][97:] == hf_io.PADDED_VOCAB_BIAS).all()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.pad_token_id == written["pad_token_id"] == 0 and written["cls_token_id"] == 2
    assert tokenizer.mask_token_id == 4 and tokenizer("Tok1 tok2").input_ids == [2, 6, 7, 3]  # [CLS] .. [SEP]


@pytest.mark.parametrize("shape", ["geglu-every3", "swiglu-bias-every2"])  # vocab padded / not
def test_hf_to_ours_to_hf_is_bitwise(tmp_path, shape):
    _, folder = hf_folder(tmp_path, shape)
    config = our_config(folder)
    hf_convert.save_hf_folder(tmp_path / "again", hf_convert.load_hf_as_bert_state(folder, config), config,
                              vocab_of(tmp_path, config.vocab_size), True)
    original = hf_io.read_safetensors(folder / "model.safetensors")
    again = hf_io.read_safetensors(tmp_path / "again" / "model.safetensors")
    assert set(again) == set(original)
    assert all(torch.equal(again[name], original[name]) for name in original)
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    saved = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "rope_parameters", "local_attention", "hidden_activation", "attention_bias",
                "norm_eps", "vocab_size", "intermediate_size"):
        assert written[key] == saved[key], key


def vocab_of(tmp_path, size: int):
    path = tmp_path / f"vocab{size}.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(size - 5)]))
    return path


def test_export_refuses_what_modernbert_cannot_hold_and_leaves_nothing(tmp_path):
    vocab = write_vocab_file(tmp_path / "vocab.txt")
    for overrides, message in ((dict(normalization="RMSNorm"), "normalization RMSNorm"),
                               (dict(first_layer_attention_norm=True), "first_layer_attention_norm True"),
                               (dict(type_vocab_size=2, position_embedding_type="learned"),
                                "position_embedding_type learned, type_vocab_size 2")):
        config = modern_config(**overrides)
        with pytest.raises(ConfigError, match=f"a model with {message} has no Hugging Face ModernBERT"):
            hf_convert.save_hf_folder(tmp_path / "out", BertModel(config).state_dict(), config, vocab, True)
    # the flags to retrain with, not only the fields (docs/modern-layers.md's table without --embedding-layernorm)
    config = modern_config(embedding_layernorm=False, type_vocab_size=2)
    with pytest.raises(ConfigError) as error:
        hf_convert.save_hf_folder(tmp_path / "out", BertModel(config).state_dict(), config, vocab, True)
    assert str(error.value) == (
        "a model with embedding_layernorm False, type_vocab_size 2 has no Hugging Face ModernBERT (nor Bert) "
        "equivalent (a conversion cannot change the layers a model was trained with); retrain with "
        "--embedding-layernorm --type-vocab-size 0 (--model-preset modernbert-base sets them all) to export a "
        "ModernBERT")  # a classic BERT would need five changes (rope, the window, GeGLU, biases, the first norm)
    # the classic way out is a retrain too (a rope model has no learned positions to export), and it exports
    rope_only = modern_config(**{**hf_convert.CLASSIC_LAYER, "position_embedding_type": "rope", "type_vocab_size": 2,
                                 "embedding_layernorm": False})
    with pytest.raises(ConfigError, match=r"or with --position-embedding-type learned to export a classic BERT$"):
        hf_convert.save_hf_folder(tmp_path / "out", BertModel(rope_only).state_dict(), rope_only, vocab, True)
    assert export_problem(dataclasses.replace(rope_only, position_embedding_type="learned")) is None
    # a classic BERT but for its local layers: the window is what no HF model holds, named as the cause
    config = modern_config(**{**hf_convert.CLASSIC_LAYER, "local_attention_window": 8, "global_attention_every": 2,
                              "type_vocab_size": 2, "layernorm_layout": "post"})
    with pytest.raises(ConfigError, match=r"^a classic BERT with local layers \(local_attention_window 8, "
                                          r"global_attention_every 2\) has no Hugging Face equivalent: .*; export a "
                                          "model trained with every layer global"):
        hf_convert.save_hf_folder(tmp_path / "out", BertModel(config).state_dict(), config, vocab, True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.txt"]
    config = modern_config(add_binary_head=True)  # a sentence-order head: left out, in one warning
    with pytest.warns(UserWarning, match="^not exported .*: binary_head.classifier.weight, binary_head.pooler.weight$"):
        hf_convert.save_hf_folder(tmp_path / "sop", BertModel(config).state_dict(), config, vocab, True)
    assert not any("binary" in name for name in hf_io.read_safetensors(tmp_path / "sop" / "model.safetensors"))


# ---------------------------------------------------------------- the tool and the trainer

MODERN_RUN = dict(position_embedding_type="rope", rotary_base=1000.0, local_rotary_base=100.0, local_attention_window=16,
                  global_attention_every=3, mlp_type="geglu", ffn_hidden_size=48, add_bias_linear=False,
                  layernorm_layout="pre", embedding_layernorm=True, first_layer_attention_norm=False, num_layers=3,
                  type_vocab_size=0, add_binary_head=False)


def train_and_save_modern(directory: str, pipeline: int, zero: int) -> dict:
    """One step of a ModernBERT-shaped model at `pipeline` stages x sequence 2 (ZeRO `zero`), saved;
    returns this rank's weights in BertModel names (gathered under ZeRO 3)."""
    import deepspeed

    from bert_fixtures import small_model
    from megatron import checkpoint_save
    from megatron.config import resolve
    from megatron.engine import build_engine, train_step
    from megatron.model.pipe import bert_to_pipe_name
    from megatron.parallel import state
    from test_deepspeed_engine import GLOBAL_BATCH, ds_config, micro_batches, model_flags

    flags = {**model_flags(), **MODERN_RUN, "pipeline_parallel_size": pipeline}
    config = resolve(flags, ds_config(2, GLOBAL_BATCH // 2 // (4 // pipeline // 2), zero, 2),
                     torch.distributed.get_world_size())
    engine = build_engine(config, bert_state=small_model(config.model).state_dict())
    data_rank, data_size = state.get_data_parallel_rank(), state.get_data_parallel_world_size()
    train_step(engine, micro_batches(2)[data_rank * (2 // data_size):][:2 // data_size])
    checkpoint_save.save(engine, config, directory, iteration=1, consumed_samples=GLOBAL_BATCH)
    names = {bert_to_pipe_name(name, config.model.num_layers): name for name in small_model(config.model).state_dict()}
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=zero == 3):
        return {names.get(name, name): p.detach().clone() for name, p in engine.module.named_parameters()}


@pytest.mark.parametrize("pipeline,zero", [(2, 1), (1, 3)], ids=["pp2-sp2-zero1", "sp2-dp2-zero3"])
def test_a_training_checkpoint_exports_through_the_tool_and_back(tmp_path, pipeline, zero):
    from megatron import checkpoint, checkpoint_weights
    from megatron.parallel.spawn import run_on_ranks
    from test_convert_checkpoint import convert

    trained = {}
    for rank in run_on_ranks(train_and_save_modern, 4, str(tmp_path / "ckpt"), pipeline, zero, timeout=300):
        trained.update(rank)
    stored = checkpoint.stored_config(str(tmp_path / "ckpt"), checkpoint.tag_for(1))["model"]
    config = BertConfig(**{**stored, "attention": "dense"})
    reference = BertModel(config).eval()
    reference.load_state_dict(trained)  # strict: the ranks together hold every weight
    done = convert("to-hf", "--load", tmp_path / "ckpt", "--vocab-file", write_vocab_file(tmp_path / "vocab.txt"),
                   "--output", tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    assert "wrote ModernBertForMaskedLM (3 layers, hidden 32)" in done.stdout, done.stdout
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    for length in lengths(16):
        assert max(compare(reference, hf, length, f"pp{pipeline} sp2 zero{zero} checkpoint -> HF")) <= ATOL

    done = convert("from-hf", "--hf-dir", tmp_path / "hf", "--save", tmp_path / "back",
                   "--make-vocab-size-divisible-by", config.make_vocab_size_divisible_by)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    back = checkpoint_weights.bert_state_from_checkpoint(str(tmp_path / "back"))
    assert set(back) == set(trained)
    for name, tensor in trained.items():
        rows = config.vocab_size if name in hf_io.PADDED else None
        assert torch.equal(back[name][:rows], tensor[:rows]), name
    back_config = checkpoint.stored_config(str(tmp_path / "back"), checkpoint.tag_for(0))["model"]
    for field in (*hf_modernbert.STRUCTURE, "rotary_base", "local_rotary_base", "local_attention_window",
                  "global_attention_every", "add_binary_head"):
        assert back_config[field] == stored[field], field


def trainer_folder(tmp_path, data_dir, heads: bool):
    """A random ModernBERT with the sizes test_training's TINY flags restate and the default corpus's vocab:
    two layers (global, local), a window of 32 in 128 tokens, its own rope thetas."""
    vocab = len((Path(data_dir) / "vocab.txt").read_text().splitlines())
    config = transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
        local_attention=32, global_attn_every_n_layers=2, global_rope_theta=5000.0, local_rope_theta=50.0,
        max_position_embeddings=128, **SPECIAL)
    torch.manual_seed(4)
    model = (transformers.ModernBertForMaskedLM if heads else transformers.ModernBertModel)(config)
    randomize(model, seed=4)
    model.save_pretrained(tmp_path / "modernbert")
    return tmp_path / "modernbert"


def check_started_from(run_dir, folder) -> None:
    """The run (at --lr 0) saved the folder's weights, and took its layer rule without a flag or preset."""
    from megatron import checkpoint, checkpoint_weights

    stored = checkpoint.stored_config(str(run_dir), checkpoint.tag_for(1))["model"]
    assert (stored["rotary_base"], stored["local_rotary_base"], stored["local_attention_window"],
            stored["global_attention_every"]) == (5000.0, 50.0, 32, 2)
    assert (stored["mlp_type"], stored["add_bias_linear"], stored["type_vocab_size"], stored["add_binary_head"],
            stored["first_layer_attention_norm"], stored["ffn_hidden_size"]) == ("geglu", False, 0, False, False, 96)
    trained = checkpoint_weights.bert_state_from_checkpoint(str(run_dir))
    hf_state, _ = hf_modernbert.bert_state_from_hf(hf_modernbert.read_hf_tensors(folder), BertConfig(**stored))
    for name, tensor in hf_state.items():
        assert torch.equal(trained[name], tensor), name


def test_trainer_starts_from_a_modernbert_model_folder(tmp_path, data_dir):
    from test_init_from_hf import run_one_step

    folder = trainer_folder(tmp_path, data_dir, heads=False)
    result = run_one_step(tmp_path, data_dir, "--init-from-hf", str(folder))
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: not in the Hugging Face folder, initialised: lm_head.bias, lm_head.dense.weight, "
                        "lm_head.layernorm.weight"], result.stderr[-3000:]
    check_started_from(tmp_path / "run", folder)


def test_trainer_loads_the_converters_weights_only_checkpoint(tmp_path, data_dir):
    from test_convert_checkpoint import convert
    from test_init_from_hf import run_one_step

    folder = trainer_folder(tmp_path, data_dir, heads=True)
    done = convert("from-hf", "--hf-dir", folder, "--save", tmp_path / "converted")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"warning: {folder} holds no vocab.txt or tokenizer.json, so the checkpoint "
                                        "carries no tokenizer: pass --vocab-file or --tokenizer-file to "
                                        "pretrain_bert.py, to-hf and fill_mask.py with it"]  # no tensor's warning
    result = run_one_step(tmp_path, data_dir, "--load", str(tmp_path / "converted"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning:" not in result.stderr  # every tensor came from the checkpoint
    check_started_from(tmp_path / "run", folder)
