"""Hugging Face <-> BertModel: same logits both ways (fp32, padded batch), exact round trips,
position extension, and the one-line errors. HF models are built from small configs with random
weights, offline."""
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from bert_fixtures import VOCAB, padded_batch
from megatron import hf_convert, hf_io
from megatron.errors import ConfigError, DataError
from megatron.model.bert import BertConfig, BertModel

ATOL = 1e-5
SEQ = 48
HF_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64, type_vocab_size=2)
HF_CLASSES = {"bert": (transformers.BertConfig, transformers.BertForPreTraining, transformers.BertModel),
              "megatron-bert": (transformers.MegatronBertConfig, transformers.MegatronBertForPreTraining,
                                transformers.MegatronBertModel)}


@pytest.fixture
def vocab_file(tmp_path_factory):
    return write_vocab_file(tmp_path_factory.mktemp("vocab") / "vocab.txt")


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random (HF and we init biases to 0 and LayerNorms to 1, which would hide
    a swapped bias or LayerNorm); LayerNorm weights stay near 1 so activations stay O(1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            is_norm_weight = p.dim() == 1 and name.endswith("weight")
            p.copy_(1 + 0.1 * noise if is_norm_weight else 0.1 * noise)


def hf_model(model_type: str, tmp_path, heads=True, seed=0, **overrides):
    """A random HF model saved to tmp_path (with safetensors through transformers itself)."""
    config_class, with_heads, base = HF_CLASSES[model_type]
    config = config_class(**{**HF_SIZES, **overrides}, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    model = (with_heads if heads else base)(config)
    randomize(model, seed)
    model.save_pretrained(tmp_path / model_type)
    return model.eval(), tmp_path / model_type


def our_config(model_type: str, **overrides) -> BertConfig:
    fields = hf_convert.bert_fields_from_hf(HF_CLASSES[model_type][0](**HF_SIZES).to_dict())
    return BertConfig(**{**fields, "hidden_dropout": 0.0, "attention_dropout": 0.0, "seq_length": SEQ,
                         "make_vocab_size_divisible_by": 16, "attention": "dense", **overrides})


def hf_logits(model, batch):
    out = model(input_ids=batch.tokens, token_type_ids=batch.token_types, attention_mask=(~batch.key_padding_mask).long())
    return out.prediction_logits[~batch.key_padding_mask], out.seq_relationship_logits


def our_logits(model, batch):
    with torch.no_grad():
        return model(*batch.model_inputs()[:4], ~batch.key_padding_mask, batch.cls_mask)


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def assert_same_logits(ours, hf, batch, label: str) -> tuple:
    """Compares MLM logits at every real token (our padded vocab cut to HF's) and SOP logits;
    returns (our MLM logits, HF MLM logits)."""
    with torch.no_grad():
        hf_mlm, hf_sop = hf_logits(hf, batch)
    mlm, sop = our_logits(ours, batch)
    print(f"{label}: max |MLM logit diff| {max_diff(mlm[:, :VOCAB], hf_mlm):.2e}, "
          f"max |SOP logit diff| {max_diff(sop, hf_sop):.2e}")
    assert max_diff(mlm[:, :VOCAB], hf_mlm) <= ATOL and max_diff(sop, hf_sop) <= ATOL
    return mlm, hf_mlm


def assert_same_weights(converted: dict, original: dict) -> None:
    """Equal bit for bit, padded vocab rows aside (they are re-made on import)."""
    assert set(converted) == set(original)
    for name, tensor in original.items():
        rows = VOCAB if name in hf_io.PADDED else None
        assert torch.equal(converted[name][:rows], tensor[:rows]), name


def write_vocab_file(path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(VOCAB - 5)]
    path.write_text("\n".join(tokens) + "\n")
    return path


@pytest.mark.parametrize("model_type", ["bert", "megatron-bert"])
def test_hf_to_ours_same_logits_and_loss(tmp_path, model_type):
    hf, folder = hf_model(model_type, tmp_path)
    config = our_config(model_type)
    assert config.padded_vocab_size > VOCAB  # the padded rows are exercised
    ours = BertModel(config).eval()
    ours.load_state_dict(hf_convert.load_hf_as_bert_state(folder, config))
    batch = padded_batch()
    mlm, hf_mlm = assert_same_logits(ours, hf, batch, f"{model_type} -> ours")
    # padded vocab entries take no probability: the MLM loss over the padded vocab is HF's
    labels = batch.labels[~batch.key_padding_mask]
    assert abs(F.cross_entropy(mlm, labels).item() - F.cross_entropy(hf_mlm, labels).item()) <= ATOL


@pytest.mark.parametrize("layout,embedding_layernorm,model_type",
                         [("post", True, "bert"), ("pre", False, "megatron-bert")])
def test_ours_to_hf_and_back(tmp_path, layout, embedding_layernorm, model_type, vocab_file):
    config = our_config(model_type, layernorm_layout=layout, embedding_layernorm=embedding_layernorm,
                        layernorm_epsilon=1e-5)
    torch.manual_seed(3)
    ours = BertModel(config).eval()
    randomize(ours, seed=3)
    hf_convert.save_hf_folder(tmp_path / "hf", ours.state_dict(), config, vocab_file, lower_case=True)

    hf = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == hf_convert.LAYOUTS[layout][1]
    assert_same_logits(ours, hf, padded_batch(), f"ours ({layout}) -> HF")
    assert_same_weights(hf_convert.load_hf_as_bert_state(tmp_path / "hf", config), ours.state_dict())
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.do_lower_case and tokenizer.pad_token_id == 0 and len(tokenizer) == VOCAB


def test_bert_model_folder_initialises_missing_heads_in_one_warning(tmp_path):
    _, folder = hf_model("bert", tmp_path, heads=False)
    config = our_config("bert")
    with pytest.warns(UserWarning) as record:
        state = hf_convert.load_hf_as_bert_state(folder, config)
    assert len(record) == 1 and "\n" not in str(record[0].message)
    message = str(record[0].message)
    for name in ("lm_head.dense.weight", "lm_head.layernorm.bias", "lm_head.bias", "binary_head.classifier.weight"):
        assert name in message
    assert "binary_head.pooler.weight" not in message  # a BertModel has the pooler
    assert set(state) == set(BertModel(config).state_dict())


def test_positions_extend_by_repeating(tmp_path):
    hf, folder = hf_model("megatron-bert", tmp_path, max_position_embeddings=20)
    config = our_config("megatron-bert", max_position_embeddings=50, seq_length=16)
    state = hf_convert.load_hf_as_bert_state(folder, config)
    table, learned = state["embeddings.position_embeddings.weight"], hf.bert.embeddings.position_embeddings.weight
    assert table.shape == (50, 32)
    assert all(torch.equal(table[i], learned[i % 20]) for i in range(50))
    ours = BertModel(config).eval()
    ours.load_state_dict(state)
    assert_same_logits(ours, hf, padded_batch(seq_length=16, pad_starts=(16, 9, 3, 12)), "extended positions")

    with pytest.raises(ConfigError, match=r"bert.embeddings.position_embeddings.weight has 20 positions, "
                                          r"max_position_embeddings is 50 and extension is refused; set "
                                          r"--max-position-embeddings 20, or drop --no-position-extension"):
        hf_convert.load_hf_as_bert_state(folder, config, extend_positions=False)
    with pytest.raises(ConfigError, match="has 20 positions, max_position_embeddings is 16; set --max-position"):
        hf_convert.load_hf_as_bert_state(folder, our_config("megatron-bert", max_position_embeddings=16, seq_length=16))


def test_mismatches_name_the_setting_or_tensor(tmp_path):
    _, folder = hf_model("bert", tmp_path)
    with pytest.raises(ConfigError, match="the Hugging Face model has num_attention_heads 4, this model 8; "
                                          "set num_attention_heads to 4"):
        hf_convert.load_hf_as_bert_state(folder, our_config("bert", num_attention_heads=8))
    with pytest.raises(ConfigError, match="has layernorm_layout post, this model pre"):
        hf_convert.load_hf_as_bert_state(folder, our_config("bert", layernorm_layout="pre"))
    tensors = hf_convert.read_hf_tensors(folder)
    with pytest.raises(ConfigError, match=r"^bert.encoder.layer.0.intermediate.dense.weight has shape \[64, 32\], "
                                          r"the model expects \[48, 32\];"):
        hf_convert.bert_state_from_hf(tensors, our_config("bert", ffn_hidden_size=48))
    with pytest.raises(ConfigError, match="hidden_act 'relu' differs"):
        hf_convert.bert_fields_from_hf({**HF_CLASSES["bert"][0](**HF_SIZES).to_dict(), "hidden_act": "relu"})


def test_an_untied_decoder_is_refused_by_its_config_where_the_mlm_head_is_read(tmp_path):
    """tie_word_embeddings false: refused before the weights are read (a dry run says it), for the
    classes whose folder holds the decoder; a base model has none. A folder that claims a tied decoder
    but stores another is the same line's kind, from the weights."""
    config = HF_CLASSES["bert"][0](**HF_SIZES).to_dict()
    for architecture in ("BertForPreTraining", "BertForMaskedLM"):
        with pytest.raises(ConfigError, match="sets tie_word_embeddings false .* cannot be converted without "
                                              "changing its outputs; convert a model with tie_word_embeddings true"):
            hf_convert.bert_fields_from_hf({**config, "tie_word_embeddings": False, "architectures": [architecture]})
    assert hf_convert.bert_fields_from_hf({**config, "tie_word_embeddings": False, "architectures": ["BertModel"]})
    _, folder = hf_model("bert", tmp_path)
    tensors = hf_convert.read_hf_tensors(folder)
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"] + 1
    with pytest.raises(ConfigError, match="^cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings"
                                          ".weight in the Hugging Face folder: this trainer ties them, so the model "
                                          "cannot be converted without changing its outputs"):
        hf_convert.bert_state_from_hf(tensors, our_config("bert"))


def test_layers_beyond_the_configs_are_refused_other_unused_tensors_named_in_a_warning(recwarn):
    """A config.json edited to fewer layers than its weights hold converted with a warning and the
    layers dropped; a head the model lacks stays a warning (as HF's). BERT's and ModernBERT's names."""
    config = our_config("bert", num_layers=2)
    for names in (["bert.encoder.layer.2.output.dense.weight", "bert.encoder.layer.3.output.dense.bias"],
                  ["model.layers.2.attn.Wo.weight", "model.layers.3.mlp.Wi.weight"]):
        with pytest.raises(DataError, match="^the Hugging Face config.json's num_hidden_layers 2 leaves out layers of "
                                            "its weights, which hold 4; set num_hidden_layers to 4 in config.json$"):
            hf_io.warn_ignored(sorted(["cls.seq_relationship.bias", *names]), config)
    assert not recwarn.list
    hf_io.warn_ignored(["bert.pooler.dense.weight", "classifier.weight"], config)
    assert [str(warning.message) for warning in recwarn.list] == [
        "Hugging Face tensors ignored (not part of this model): bert.pooler.dense.weight, classifier.weight"]


def test_export_refuses_what_hf_cannot_hold(tmp_path, vocab_file):
    config = our_config("megatron-bert", embedding_layernorm=True)
    with pytest.raises(ConfigError, match="layernorm_layout 'pre' with embedding_layernorm True has no Hugging Face"):
        hf_convert.save_hf_folder(tmp_path / "a", BertModel(config).state_dict(), config, vocab_file, True)
    config = our_config("megatron-bert", attention="linformer", linformer_k=8)
    with pytest.raises(ConfigError, match=r"tensors layers\.0\.attention\.core\.\S+ .*have no Hugging Face"):
        hf_convert.save_hf_folder(tmp_path / "b", BertModel(config).state_dict(), config, vocab_file, True)
    assert not list(tmp_path.iterdir())  # nothing half-written
    config = our_config("megatron-bert")
    tokens = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    (tmp_path / "longer.txt").write_text("\n".join(tokens + ["extra"]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=f"has {len(tokens) + 1} tokens, the model's vocab_size is {len(tokens)}"):
        hf_convert.save_hf_folder(tmp_path / "c", BertModel(config).state_dict(), config, tmp_path / "longer.txt", True)
    # a model larger than its vocab (--vocab-size): rows no token reaches, as HF allows
    (tmp_path / "shorter.txt").write_text("\n".join(tokens[:-5]) + "\n", encoding="utf-8")
    hf_convert.save_hf_folder(tmp_path / "d", BertModel(config).state_dict(), config, tmp_path / "shorter.txt", True)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "d").vocab_size == len(tokens)


def test_safetensors_files_read_by_the_reference_library(tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7), "c": torch.randn(4).bfloat16(), "d": torch.zeros(0, 2)}
    hf_io.write_safetensors(tmp_path / "ours.safetensors", tensors)
    save_file(tensors, tmp_path / "theirs.safetensors")
    for got in (load_file(tmp_path / "ours.safetensors"), hf_io.read_safetensors(tmp_path / "theirs.safetensors")):
        assert set(got) == set(tensors)
        assert all(got[k].dtype == t.dtype and torch.equal(got[k], t) for k, t in tensors.items())
    # the data starts 8-byte aligned (the format's rule; zero-copy readers map the tensors in place)
    for names in (("a",), ("a", "b"), ("a", "b", "c")):  # headers of several lengths
        hf_io.write_safetensors(tmp_path / "ours.safetensors", {name: tensors[name] for name in names})
        header_length = int.from_bytes((tmp_path / "ours.safetensors").read_bytes()[:8], "little")
        assert header_length % 8 == 0, (names, header_length)


def test_warning_free_conversion_of_a_complete_folder(tmp_path):
    _, folder = hf_model("megatron-bert", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf_convert.load_hf_as_bert_state(folder, our_config("megatron-bert"))


def test_model_without_sentence_order_head_exports_as_masked_lm(tmp_path, vocab_file):
    config = our_config("bert", add_binary_head=False)
    torch.manual_seed(5)
    ours = BertModel(config).eval()
    randomize(ours, seed=5)
    hf_convert.save_hf_folder(tmp_path / "hf", ours.state_dict(), config, vocab_file, lower_case=True)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "BertForMaskedLM"
    batch = padded_batch()
    with torch.no_grad():
        hf_mlm = hf(input_ids=batch.tokens, token_type_ids=batch.token_types,
                    attention_mask=(~batch.key_padding_mask).long()).logits[~batch.key_padding_mask]
    mlm, sop = our_logits(ours, batch)
    assert sop is None and max_diff(mlm[:, :VOCAB], hf_mlm) <= ATOL


def test_sharded_and_pytorch_bin_folders_read_alike(tmp_path):
    """Sharded safetensors, and an old pytorch_model.bin with TF-era LayerNorm gamma/beta names."""
    hf, folder = hf_model("bert", tmp_path)
    config = our_config("bert")
    want = hf_convert.load_hf_as_bert_state(folder, config)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((folder / "config.json").read_text())
    legacy = {name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): t
              for name, t in hf.state_dict().items()}
    assert any(name.endswith("gamma") for name in legacy)
    torch.save(legacy, tmp_path / "bin" / "pytorch_model.bin")
    for other in ("sharded", "bin"):
        got = hf_convert.load_hf_as_bert_state(tmp_path / other, config)
        assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want), other


def test_a_sharded_pytorch_bin_folder_reads_as_the_safetensors_one(tmp_path):
    """pytorch_model-0000N-of-0000M.bin shards with their pytorch_model.bin.index.json (save_pretrained before
    safetensors): 'holds no model.safetensors or pytorch_model.bin'."""
    hf, folder = hf_model("bert", tmp_path)
    config = our_config("bert")
    want = hf_convert.load_hf_as_bert_state(folder, config)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((folder / "config.json").read_text())
    names = sorted(hf.state_dict())
    halves = {f"pytorch_model-0000{i + 1}-of-00002.bin": names[i::2] for i in range(2)}
    for shard, part in halves.items():
        torch.save({name: hf.state_dict()[name] for name in part}, tmp_path / "bin" / shard)
    index = {"metadata": {}, "weight_map": {name: shard for shard, part in halves.items() for name in part}}
    (tmp_path / "bin" / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    got = hf_convert.load_hf_as_bert_state(tmp_path / "bin", config)
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("model_type", ["bert", "megatron-bert"])
def test_config_keys_a_folder_leaves_out_are_read_as_transformers_reads_them(tmp_path, model_type):
    """A config.json without layer_norm_eps converted with this trainer's 1e-5 where transformers builds the
    model with its 1e-12: other logits, no word."""
    hf, folder = hf_model(model_type, tmp_path)
    config_json = json.loads((folder / "config.json").read_text())
    del config_json["layer_norm_eps"]
    (folder / "config.json").write_text(json.dumps(config_json))
    fields = hf_convert.bert_fields_from_hf(config_json)
    assert fields["layernorm_epsilon"] == HF_CLASSES[model_type][0]().layer_norm_eps == 1e-12
    reloaded = HF_CLASSES[model_type][1].from_pretrained(folder).eval()
    ours = BertModel(our_config(model_type, layernorm_epsilon=fields["layernorm_epsilon"])).eval()
    ours.load_state_dict(hf_convert.load_hf_as_bert_state(folder, ours.config))
    assert_same_logits(ours, reloaded, padded_batch(), f"{model_type} without layer_norm_eps")


def test_a_folder_that_contradicts_its_config_or_is_a_decoder_is_refused(tmp_path):
    """A config.json without max_position_embeddings over a 64-row table: the table repeated to 512 and the
    model recorded as trained at 512 (transformers refuses the folder). A decoder BERT (is_decoder:
    BertLMHeadModel's causal attention) converted as a bidirectional encoder."""
    _, folder = hf_model("bert", tmp_path)
    config_json = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({key: value for key, value in config_json.items()
                                                    if key != "max_position_embeddings"}))
    with pytest.raises(DataError, match=r"config.json has no max_position_embeddings \(transformers reads 512\), "
                                        r"and bert.embeddings.position_embeddings.weight has 64 rows; set "
                                        r"max_position_embeddings to 64 in config.json"):
        hf_convert.load_hf_as_bert_state(folder, our_config("bert", max_position_embeddings=512))
    for key in hf_convert.DECODER_KEYS:
        with pytest.raises(ConfigError, match=rf"config.json sets {key} true: a decoder BERT \(BertLMHeadModel\) "
                                              r".*; convert an encoder"):
            hf_convert.bert_fields_from_hf({**config_json, key: True})


def test_an_mlm_bias_stored_under_its_tied_name_only_is_read(tmp_path):
    """cls.predictions.decoder.bias alone (transformers loads it: the two names are one parameter) was
    'lacks cls.predictions.bias; copy or download the model folder again'."""
    _, folder = hf_model("bert", tmp_path)
    want = hf_convert.load_hf_as_bert_state(folder, our_config("bert"))
    tensors = hf_io.read_safetensors(folder / "model.safetensors")
    tensors["cls.predictions.decoder.bias"] = tensors.pop("cls.predictions.bias")
    hf_io.write_safetensors(folder / "model.safetensors", tensors)
    got = hf_convert.load_hf_as_bert_state(folder, our_config("bert"))
    assert torch.equal(got["lm_head.bias"], want["lm_head.bias"])


def without_tensors(folder, *names):
    """The folder's model.safetensors rewritten without `names` (a damaged or partial download)."""
    tensors = hf_io.read_safetensors(folder / "model.safetensors")
    assert set(names) <= set(tensors), sorted(tensors)
    hf_io.write_safetensors(folder / "model.safetensors", {n: t for n, t in tensors.items() if n not in names})


@pytest.mark.parametrize("removed", [
    ("bert.encoder.layer.1.attention.self.key.weight",),  # an encoder layer's
    ("bert.embeddings.word_embeddings.weight", "bert.encoder.ln.weight"),  # the embeddings, the final norm
    ("cls.predictions.transform.LayerNorm.weight",),  # part of the MLM head: a folder holds a head whole or not
])
def test_a_missing_model_tensor_is_one_error_line_not_a_random_layer(tmp_path, removed):
    from megatron.errors import DataError

    _, folder = hf_model("megatron-bert", tmp_path)
    without_tensors(folder, *removed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no "initialised" warning first
        with pytest.raises(DataError) as error:
            hf_convert.load_hf_as_bert_state(folder, our_config("megatron-bert"))
    text = str(error.value)
    assert "\n" not in text and f"lacks {len(removed)} tensor(s) of the model: " in text, text
    assert all(name in text for name in removed) and "copy or download the model folder again" in text


def test_a_masked_lm_folder_initialises_the_whole_sentence_order_head(tmp_path):
    """BertForMaskedLM has no pooler and no seq_relationship: both heads are initialised, one warning."""
    hf, folder = hf_model("bert", tmp_path)
    without_tensors(folder, "bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
                    "cls.seq_relationship.bias")
    with pytest.warns(UserWarning, match="initialised: binary_head.classifier.bias, binary_head.classifier.weight, "
                                         "binary_head.pooler.bias, binary_head.pooler.weight$"):
        state = hf_convert.load_hf_as_bert_state(folder, our_config("bert"))
    assert torch.equal(state["lm_head.dense.weight"], hf.cls.predictions.transform.dense.weight)


@pytest.mark.parametrize("key,value,message", [
    ("num_hidden_layers", "2", 'num_hidden_layers = "2" in the Hugging Face config.json is not an integer >= 0'),
    ("hidden_size", 32.5, "hidden_size = 32.5 in the Hugging Face config.json is not an integer >= 0"),
    ("layer_norm_eps", 0, "layer_norm_eps = 0 in the Hugging Face config.json is not a number > 0"),
    ("initializer_range", -0.02, "initializer_range = -0.02 in the Hugging Face config.json is not a number > 0"),
])
def test_hf_config_values_of_the_wrong_type_are_one_line(tmp_path, key, value, message):
    from megatron.errors import DataError

    config = {**HF_CLASSES["bert"][0](**HF_SIZES).to_dict(), key: value}
    with pytest.raises(DataError, match=message.replace(".", r"\.")):
        hf_convert.bert_fields_from_hf(config)


def test_hf_config_with_nan_is_refused(tmp_path):
    from megatron.errors import ConfigError as Error

    (tmp_path / "config.json").write_text('{"model_type": "bert", "layer_norm_eps": NaN}')
    with pytest.raises(Error, match=r"config.json: layer_norm_eps = NaN is not a finite number"):
        hf_io.read_hf_config(tmp_path)


def test_a_sharded_folder_missing_a_shard_is_one_line(tmp_path):
    from megatron.errors import DataError

    hf, _ = hf_model("bert", tmp_path)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    shards[-1].unlink()
    with pytest.raises(DataError, match=f"names the shard {shards[-1].name}, which is not in"):
        hf_convert.read_hf_tensors(tmp_path / "sharded")


def rewrite_header(path, change) -> None:
    """The safetensors file at `path` with `change` applied to its JSON header (the data as it was)."""
    import json
    import struct

    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    change(header)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + length:])


@pytest.mark.parametrize("change,message", [
    (lambda h: h["w"].update(dtype="F8_XX"), ': tensor w has dtype "F8_XX", not one read here (F64, F32'),
    (lambda h: h["w"].update(shape=[7, 7]), " is damaged: the header entry of tensor w is F32 [7, 7] (196 bytes) but "
                                            "its data_offsets [0, 24] hold 24 bytes"),
    (lambda h: h["w"].pop("data_offsets"), " is damaged: the header entry of tensor w has no data_offsets"),
    (lambda h: h.update(w="oops"), ' is damaged: the header entry of tensor w is "oops", not an object with dtype, '
                                   'shape and data_offsets'),
], ids=["dtype", "shape", "offsets", "entry"])
def test_a_damaged_safetensors_header_is_one_line(tmp_path, change, message):
    """Was a KeyError, TypeError or reshape RuntimeError traceback (from-hf, --init-from-hf, extend_context)."""
    from megatron.errors import DataError

    path = tmp_path / "model.safetensors"
    hf_io.write_safetensors(path, {"w": torch.ones(2, 3), "b": torch.zeros(3)})
    rewrite_header(path, change)
    with pytest.raises(DataError) as error:
        hf_io.read_hf_weights(tmp_path)
    text = str(error.value)
    assert text.startswith(f"{path}{message}"), text
    assert text.endswith("copy or download the model folder again") and "\n" not in text, text


@pytest.mark.parametrize("content,message", [
    ("truncated", r"cannot be read: truncated or not a PyTorch file \([A-Za-z]+Error: [^\n]+\); copy or download "
                  r"the model folder again$"),
    ("pickled", r"holds a pickled torch\.nn\.modules\.linear\.Linear, not only tensors \(not loaded: unpickling it "
                r"could run any code\); copy or download the model folder again \(or save the model with "
                r"save_pretrained"),
    ("nested", r"maps 'state_dict' to a dict, not a tensor; copy or download"),
], ids=["truncated", "pickled", "nested"])
def test_a_damaged_pytorch_bin_is_one_line(tmp_path, content, message):
    """Was torch's RuntimeError / UnpicklingError traceback; a nested dict was 'lacks N tensors'."""
    from megatron.errors import DataError

    path = tmp_path / "pytorch_model.bin"
    tensors = {"w": torch.ones(64, 64)}
    torch.save({"truncated": tensors, "pickled": {"w": torch.nn.Linear(2, 2)},
                "nested": {"state_dict": tensors}}[content], path)
    if content == "truncated":
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    with pytest.raises(DataError, match=f"^{path} {message}"):
        hf_io.read_hf_weights(tmp_path)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.txt"])
def test_a_git_lfs_pointer_is_named_as_such(tmp_path, name):
    """A hub repository cloned without git-lfs holds a ~130-byte pointer in place of each large file. It
    was 'not a complete safetensors file (134 bytes: truncated or overwritten)' or 'not a Hugging Face
    tokenizer.json (expected value at line 1 column 1)', whose 'download again' gives the same pointer."""
    from megatron.errors import DataError
    from test_corpus_formats import LFS_POINTER

    _, folder = hf_model("bert", tmp_path)
    write_vocab_file(folder / "vocab.txt")
    if name == "pytorch_model.bin":
        (folder / "model.safetensors").unlink()
    if name == "tokenizer.json":
        (folder / "vocab.txt").unlink()
    (folder / name).write_bytes(LFS_POINTER)
    read = hf_io.read_hf_weights if name.startswith(("model", "pytorch")) else hf_convert.read_hf_tokenizer
    with pytest.raises(DataError) as error:
        read(folder)
    assert str(error.value) == (f"{folder / name} is a Git LFS pointer, not the file; run git lfs pull in {folder} "
                                "(after git lfs install)")


def test_adapters_share_hf_io_and_import_no_other_adapter():
    """The adapters (hf_convert's BERT one, hf_modernbert) stand on hf_io's plumbing: hf_io imports no
    adapter, hf_modernbert not hf_convert, and none imports an hf_ module inside a function (the import
    cycle the split removed); ADAPTERS has one for each model_type converted."""
    import ast
    import inspect

    from megatron import hf_modernbert

    def imported(module, inside_functions: bool) -> set:
        tree = ast.parse(inspect.getsource(module))
        scopes = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)] if inside_functions else [tree]
        return {alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
                for scope in scopes for node in ast.walk(scope) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}

    adapters = ("hf_convert", "hf_modernbert")
    assert not [name for name in imported(hf_io, False) if any(adapter in name for adapter in adapters)]
    assert not [name for name in imported(hf_modernbert, False) if "hf_convert" in name]
    for module in (hf_convert, hf_modernbert, hf_io):
        assert not [name for name in imported(module, True) if "megatron.hf_" in name or name.startswith("hf_")]
    assert set(hf_convert.ADAPTERS) == {"bert", "megatron-bert", hf_modernbert.MODEL_TYPE}
    assert hf_convert.ADAPTERS["modernbert"] is hf_modernbert.ADAPTER


def test_a_vocab_saved_with_a_byte_order_mark_exports_the_tokens_transformers_reads(tmp_path, vocab_file):
    """The trainer reads past a BOM (Windows editors write one): the export writes the tokens, not the file's
    bytes, so transformers' BertTokenizer (which keeps a BOM in the first token) finds [PAD] at id 0."""
    config = our_config("bert")
    tokens = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + Path(vocab_file).read_bytes().replace(b"\n", b"\r\n"))
    hf_convert.save_hf_folder(tmp_path / "hf", BertModel(config).state_dict(), config, tmp_path / "bom.txt", True)
    assert (tmp_path / "hf" / "vocab.txt").read_bytes() == "".join(f"{token}\n" for token in tokens).encode()
    assert transformers.BertTokenizer.from_pretrained(tmp_path / "hf").pad_token_id == 0
