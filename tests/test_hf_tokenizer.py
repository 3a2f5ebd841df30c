"""Any Hugging Face tokenizer (a tokenizer.json): special ids read from it, ids above 65535 stored
exactly, and one path through every tool: preprocessing -> training (the checkpoint carries the
tokenizer) -> resume, fill-mask and to-hf with no tokenizer flag -> transformers' AutoTokenizer
and AutoModelForMaskedLM read the ModernBERT export -> from-hf carries it again."""
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from megatron.data.indexed_dataset import make_dataset
from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.data.sample_corpus import write_corpus
from megatron.data import tokenizer as tokenizer_module
from megatron.data.tokenizer import HFTokenizer, build_tokenizer
from megatron.data.tokenizer_identity import carried_tokenizer, data_identity_path
from megatron.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# a ModernBERT-shaped model, shrunk; its vocab is larger than the tokenizer's, as ModernBERT's padded one is
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
         "--max-position-embeddings", "64", "--micro-batch-size", "2", "--model-preset", "modernbert-base",
         "--ffn-hidden-size", "96", "--local-attention-window", "32", "--eval-iters", "1", "--vocab-size", "1600"]
TEXT = "the function returns a [MASK] of the values"
FEW_TEXTS = ["the cat sat on the mat\n", "the dog"] * 20  # enough for a BPE of 300 tokens


def train_bpe(texts, special_tokens, vocab_size=1500) -> Tokenizer:
    """A byte-level BPE as ModernBERT's and RoBERTa's are built (special tokens added, no template)."""
    tokenizer = Tokenizer(models.BPE(unk_token=special_tokens[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens))
    return tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.json"
    write_corpus(path, 200_000)
    return path


@pytest.fixture(scope="module")
def texts(corpus) -> list:
    return [json.loads(line)["text"] for line in corpus.read_text().splitlines()]


@pytest.fixture(scope="module")
def modernbert_style(texts, tmp_path_factory) -> Path:
    """[CLS] [SEP] [MASK] [PAD] [UNK] added special tokens, [CLS] $A [SEP] as the template."""
    tokenizer = train_bpe(texts, ["[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")])
    path = tmp_path_factory.mktemp("modernbert_style") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_special_ids_are_read_from_the_tokenizer(texts, modernbert_style, tmp_path):
    import transformers

    ours = HFTokenizer(modernbert_style)
    reference = Tokenizer.from_file(str(modernbert_style))
    assert (ours.cls, ours.sep, ours.mask, ours.pad, ours.eod) == tuple(
        reference.token_to_id(token) for token in ("[CLS]", "[SEP]", "[MASK]", "[PAD]", "[SEP]")) == (4, 2, 1, 3, 2)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(modernbert_style))
    sample = texts[:40]
    assert ours.tokenize_batch(sample) == [fast(text, add_special_tokens=False).input_ids for text in sample]
    assert pickle.loads(pickle.dumps(ours)).tokenize(sample[0]) == ours.tokenize(sample[0])
    assert max(max(ids) for ids in ours.tokenize_batch(sample)) < ours.vocab_size == reference.get_vocab_size()

    # RoBERTa's names, from its post-processor (cls, sep) and its tokens (mask, pad), none at BERT's ids
    roberta = train_bpe(texts[:200], ["<unk>", "<mask>", "</s>", "<pad>", "<s>"], vocab_size=600)
    roberta.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 4))
    roberta.save(str(tmp_path / "roberta.json"))
    tokenizer = build_tokenizer(None, tokenizer_file=tmp_path / "roberta.json")
    assert (tokenizer.cls, tokenizer.sep, tokenizer.mask, tokenizer.pad) == (4, 2, 1, 3)
    assert tokenizer.special_tokens() == {"cls": "<s>", "sep": "</s>", "mask": "<mask>", "pad": "<pad>", "unk": "<unk>"}

    # a model folder: its tokenizer_config.json names the tokens (here: mask and pad swapped on purpose)
    folder = tmp_path / "folder"
    folder.mkdir()
    roberta.save(str(folder / "tokenizer.json"))
    settings = {"mask_token": {"content": "<pad>"}, "pad_token": "<mask>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    swapped = build_tokenizer("HFTokenizer", tokenizer_file=folder)
    assert (swapped.mask, swapped.pad, swapped.cls) == (3, 1, 4) and swapped.file == str(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<nonexistent>"}))
    with pytest.raises(DataError, match=f"{folder / 'tokenizer_config.json'} names '<nonexistent>' as mask_token, "
                                        "which is not a token of .*tokenizer.json; set \"mask_token\""):
        build_tokenizer("HFTokenizer", tokenizer_file=folder)


@pytest.mark.parametrize("config, legacy_map", [
    ({"mask_token": "<mask>"}, {"mask_token": "<extra>"}),  # an older folder: the map wins
    (None, {"mask_token": {"content": "<pad>", "lstrip": True}, "pad_token": "<mask>"}),  # the map alone
    ({"mask_token": "<mask>", "added_tokens_decoder": {"1": {"content": "<mask>", "special": True}}},
     {"mask_token": "<pad>"}),  # a folder of transformers 4.34+: its config alone counts
])
def test_special_tokens_map_json_is_read_as_transformers_reads_it(texts, tmp_path, config, legacy_map):
    """A model folder's special_tokens_map.json (beside or instead of tokenizer_config.json) names the
    special tokens as transformers' from_pretrained takes them (checked against it): over the config
    where the config has no added_tokens_decoder, not at all where it has (the tokens here are swapped
    on purpose, so reading the wrong file gives other ids)."""
    import transformers

    folder = tmp_path / "folder"
    folder.mkdir()
    roberta = train_bpe(texts[:200], ["<unk>", "<mask>", "</s>", "<pad>", "<s>", "<extra>"], vocab_size=600)
    roberta.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").write_text(json.dumps(legacy_map))
    ours = build_tokenizer("HFTokenizer", tokenizer_file=folder)
    reference = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
    assert ours.mask == reference.mask_token_id, (ours.special_tokens(), reference.mask_token)
    if reference.pad_token is not None:
        assert ours.pad == reference.pad_token_id
    (folder / "special_tokens_map.json").write_text(json.dumps({"mask_token": "<nonexistent>"}))
    if config is None or "added_tokens_decoder" not in config:
        with pytest.raises(DataError, match="special_tokens_map.json names '<nonexistent>' as mask_token"):
            build_tokenizer("HFTokenizer", tokenizer_file=folder)
    else:  # not read at all, as transformers does not
        assert build_tokenizer("HFTokenizer", tokenizer_file=folder).mask == ours.mask


def test_ids_above_65535_round_trip_through_the_bin(tmp_path):
    """A 70000-entry WordLevel vocab whose words (all but 'low') have ids above 65535: stored as int32 and read
    back exactly (uint16 would wrap them)."""
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    vocab = {f"filler{i}": i for i in range(70_000) if i not in (3, 7)}
    vocab.update({word: 70_000 + 11 * index for index, word in enumerate(words)})  # sparse on purpose
    vocab.update({"[UNK]": 3, "low": 7})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["[CLS]", "[SEP]", "[MASK]", "[PAD]"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words + ["low", "unknown"]) for _ in range(rng.randint(1, 30))) for _ in range(50)]
    (tmp_path / "corpus.json").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    report = preprocess(PreprocessOptions(input=str(tmp_path / "corpus.json"), output_prefix=str(tmp_path / "big"),
                                          tokenizer_file=str(tmp_path / "tokenizer.json"), log_interval=0))
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    assert ours.vocab_size == 70_056 and ours.mask > 65535  # ids are sparse: the size is the largest id + 1
    dataset = make_dataset(report.outputs["text"])
    stored = [dataset[i].tolist() for i in range(len(dataset))]
    assert dataset.dtype.itemsize == 4 and stored == ours.tokenize_batch(lines)
    assert max(max(ids) for ids in stored) == 70_055 and 7 in stored[0] + stored[1] + stored[2]
    record = json.loads(data_identity_path(report.outputs["text"]).read_text())
    assert record["vocab_sha256"] == ours.identity and record["vocab_size"] == ours.vocab_size


def test_the_truncation_and_padding_a_tokenizer_json_was_saved_with_are_ignored(tmp_path):
    """Published tokenizer.json files often keep truncation (max_length 512) and padding: documents
    must not be cut at max_length nor padded with [PAD] ids."""
    words = [f"w{i}" for i in range(20)]
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                                              "[MASK]", *words])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.enable_truncation(max_length=8)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    document = " ".join(words)
    (tmp_path / "corpus.json").write_text(json.dumps({"text": document}) + "\n")
    report = preprocess(PreprocessOptions(input=str(tmp_path / "corpus.json"), output_prefix=str(tmp_path / "out"),
                                          tokenizer_file=str(tmp_path), log_interval=0))
    assert make_dataset(report.outputs["text"])[0].tolist() == list(range(5, 25))
    assert HFTokenizer(tmp_path).tokenize_batch(["w1", document]) == [[6], list(range(5, 25))]


def run(script: str, *argv, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # one process without a launcher
    result = subprocess.run([PYTHON, str(ROOT / script), *map(str, argv)], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def test_bpe_from_preprocessing_to_training_fill_mask_and_a_modernbert_export(corpus, modernbert_style, tmp_path,
                                                                               capsys):
    import torch
    import transformers

    sys.path.insert(0, str(ROOT / "tools"))
    import convert_checkpoint
    import fill_mask


    run("tools/preprocess_data.py", "--input", corpus, "--tokenizer-file", modernbert_style, "--output-prefix",
        tmp_path / "data" / "bpe", "--split-sentences", "--log-interval", "0")
    prefix = tmp_path / "data" / "bpe_text_sentence"
    tokenizer = HFTokenizer(modernbert_style)
    assert json.loads(data_identity_path(prefix).read_text())["vocab_sha256"] == tokenizer.identity

    run("pretrain_bert.py", *MODEL, "--data-path", prefix, "--tokenizer-file", modernbert_style, "--train-iters", "2",
        "--save", tmp_path / "ckpt", "--log-dir", tmp_path / "log")
    folder = tmp_path / "ckpt" / "iter_0000002"
    assert (folder / "tokenizer.json").read_bytes() == modernbert_style.read_bytes()
    carried = json.loads((folder / "tokenizer_identity.json").read_text())
    assert carried["vocab_sha256"] == tokenizer.identity and carried["special_tokens"]["mask"] == "[MASK]"

    # a resume, fill-mask and the export name no tokenizer: the checkpoint's is used
    run("pretrain_bert.py", *MODEL, "--data-path", prefix, "--train-iters", "3", "--load", tmp_path / "ckpt",
        "--log-dir", tmp_path / "log2")
    capsys.readouterr()  # the tools in this process (the trainer above ran as a process of its own)
    fill_mask.main(["--load", str(tmp_path / "ckpt"), "--text", TEXT, "--top-k", "3"])
    printed = capsys.readouterr().out.splitlines()
    expected = fill_mask.fill_mask(fill_mask.load_model(str(tmp_path / "ckpt")), tokenizer, TEXT, top_k=3)
    assert printed == [f"predictions of {tmp_path / 'ckpt' / 'iter_0000002'} (iteration 2)", TEXT,
                       "  [MASK] 1: " + ", ".join(f"{t} {p:.2g}" for t, p in expected[0])]
    convert_checkpoint.main(["to-hf", "--load", str(tmp_path / "ckpt"), "--output", str(tmp_path / "hf")])
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == modernbert_style.read_bytes()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = TEXT.replace(" [MASK]", "")
    assert hf_tokenizer(text).input_ids == [tokenizer.cls, *tokenizer.tokenize(text), tokenizer.sep]
    assert (hf_tokenizer.mask_token_id, hf_tokenizer.pad_token_id) == (tokenizer.mask, tokenizer.pad)
    model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert type(model).__name__ == "ModernBertForMaskedLM" and model.config.pad_token_id == tokenizer.pad
    ids = hf_tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, ids[0].tolist().index(tokenizer.mask), :tokenizer.vocab_size]
    best = torch.softmax(logits, dim=-1).topk(3)  # transformers' own tokenizer and model agree with fill-mask,
    decoded = [hf_tokenizer.decode([index]) for index in best.indices]  # its tokens decoded as the pipeline's
    assert [text.strip() or repr(text) for text in decoded] == [token for token, _ in expected[0]]
    assert max(abs(p - q) for p, (_, q) in zip(best.values.tolist(), expected[0])) < 1e-5
    # and back: the weights-only checkpoint made from the export carries its tokenizer again
    convert_checkpoint.main(["from-hf", "--hf-dir", str(tmp_path / "hf"), "--save", str(tmp_path / "from_hf")])
    again = carried_tokenizer(tmp_path / "from_hf" / "iter_0000000")
    assert isinstance(again, HFTokenizer) and again.identity == tokenizer.identity and again.ids == tokenizer.ids


def test_masking_never_draws_special_tokens_as_random_replacements(texts, modernbert_style, tmp_path):
    """BPE special tokens are not bracketed like BERT's: <s>, </s>, <pad>, <mask>, <unk> and any added
    special token are reserved by the tokenizer itself, ordinary tokens are not."""
    roberta = train_bpe(texts[:200], ["<unk>", "<mask>", "</s>", "<pad>", "<s>"], vocab_size=600)
    roberta.add_special_tokens(["<|endoftext|>"])
    roberta.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 4))
    roberta.save(str(tmp_path / "roberta.json"))
    tokenizer = HFTokenizer(tmp_path / "roberta.json")
    special = {roberta.token_to_id(t) for t in ("<unk>", "<mask>", "</s>", "<pad>", "<s>", "<|endoftext|>")}
    assert tokenizer.reserved_ids() == special
    modern = HFTokenizer(modernbert_style)
    assert {modern.tokens[i] for i in modern.reserved_ids()} == {"[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"}


def test_special_tokens_a_model_folder_cannot_mean_are_one_line(texts, tmp_path):
    """Settings that are no settings (a list, a number as mask_token), a mask token that is also the pad
    or unknown token (masking would write a token the text holds; fill-mask would see a mask at every
    padding position), a pad token that is also the sep, cls or unk token (accepted silently: the export's
    pad_token_id is transformers' padding_idx, whose embedding fine-tuning never updates), and a folder
    whose vocab.txt and tokenizer.json disagree (transformers reads the tokenizer.json; carrying the
    vocab.txt gave other ids): each refused naming the file."""
    from megatron import hf_convert

    roberta = train_bpe(texts[:200], ["<unk>", "<mask>", "</s>", "<pad>", "<s>"], vocab_size=600)
    cases = {"list": (["x"], "tokenizer_config.json is not a JSON object of settings"),
             "number": ({"mask_token": 5}, "tokenizer_config.json's mask_token = 5 is not a token"),
             "pad": ({"mask_token": "<pad>"}, "mask token '<pad>' is also its pad token"),
             "unk": ({"mask_token": "<unk>"}, "mask token '<unk>' is also its unk token"),
             "pad_is_sep": ({"pad_token": "</s>"}, "pad token '</s>' is also its sep token"),
             "pad_is_cls": ({"pad_token": "<s>"}, "pad token '<s>' is also its cls token"),
             "pad_is_unk": ({"pad_token": "<unk>"}, "pad token '<unk>' is also its unk token")}
    for name, (settings, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        roberta.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
        with pytest.raises(DataError, match=message.replace(".", r"\.")):
            build_tokenizer("HFTokenizer", tokenizer_file=folder)
    stray = tmp_path / "stray"
    stray.mkdir()
    roberta.save(str(stray / "tokenizer.json"))
    words = dict.fromkeys(texts[0].split()[:20])  # each once: a token twice is refused first
    (stray / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    with pytest.raises(DataError, match="holds a vocab.txt and a tokenizer.json with different tokens"):
        hf_convert.read_hf_tokenizer(stray)
    # a WordPiece ModernBERT's export: its tokenizer.json made from the same vocab.txt, one vocab
    from megatron.data.default_dataset import EMBEDDED_VOCAB
    from megatron.hf_modernbert import wordpiece_tokenizer_json

    vocab = Path(EMBEDDED_VOCAB).read_text().splitlines()
    (stray / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (stray / "tokenizer.json").write_text(json.dumps(wordpiece_tokenizer_json(vocab, True)))
    assert hf_convert.read_hf_tokenizer(stray).vocab_size == len(vocab)


def test_an_ordinary_word_as_the_mask_token_is_refused(tmp_path):
    """A tokenizer_config.json naming 'the' (a word of the vocab) as mask_token was accepted: masking then writes
    a token the text holds everywhere, and fill-mask takes every 'the' for a mask. A mask token must be an added
    special token, as RoBERTa's <mask> and ModernBERT's [MASK] are (a non-special added token is text too);
    BERT's own names pass where a tokenizer.json holds them as plain tokens (no text splits into them)."""
    roberta = train_bpe(FEW_TEXTS, ["<unk>", "<mask>", "</s>", "<pad>", "<s>"], 300)
    roberta.add_tokens(["<plain>"])
    for name, token in (("word", "the"), ("byte_level_word", "Ġthe"), ("added_not_special", "<plain>")):
        folder = tmp_path / name
        folder.mkdir()
        roberta.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps({"mask_token": token}))
        with pytest.raises(DataError) as caught:
            build_tokenizer("HFTokenizer", tokenizer_file=folder)
        assert str(caught.value) == (
            f"tokenizer {folder / 'tokenizer.json'}'s mask token {token!r} is an ordinary token of its vocab, not a "
            "special token: masked positions could not be told from the text's own; name an added special token as "
            "mask_token (e.g. <mask> or [MASK]) in the tokenizer_config.json or special_tokens_map.json beside it, "
            "or add it to the tokenizer as a special token")
    roberta.save(str(tmp_path / "roberta.json"))
    assert HFTokenizer(tmp_path / "roberta.json").special_tokens()["mask"] == "<mask>"
    plain = Tokenizer(models.WordLevel({token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                                          "[MASK]", "the"])}, unk_token="[UNK]"))
    plain.pre_tokenizer = pre_tokenizers.Whitespace()
    plain.save(str(tmp_path / "plain.json"))
    assert HFTokenizer(tmp_path / "plain.json").mask == 4


def source_tokenizer(style: str) -> tuple[Tokenizer, dict]:
    """A tokenizer.json of `style` and the tokenizer_config.json settings beside it: byte-level BPEs as RoBERTa
    (<unk> its model's) and ModernBERT are built (its [UNK] named by the model, or by the config alone, as
    ModernBERT's own tokenizer.json leaves the model's null), or a Unigram (SentencePiece: ALBERT, XLM-R, T5),
    whose model names its unknown token by id."""
    specials = ["[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"] if "modernbert" in style else [
        "<unk>", "<mask>", "</s>", "<pad>", "<s>", "<extra>"]
    if style == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        tokenizer.train_from_iterator(FEW_TEXTS, trainers.UnigramTrainer(vocab_size=100, special_tokens=specials,
                                                                         unk_token="<unk>"))
    else:
        tokenizer = train_bpe(FEW_TEXTS, specials, 300)
    if "modernbert" not in style:
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 4))
    if style == "modernbert_template":  # framing text as the trainer does
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")])
    if style == "modernbert_config_unk":  # ModernBERT's tokenizer.json: a BPE with no unknown token
        settings = json.loads(tokenizer.to_str())
        settings["model"]["unk_token"] = None
        tokenizer = Tokenizer.from_str(json.dumps(settings))
    return tokenizer, {"mask_token": "<extra>"} if style == "named_in_config" else {
        "unk_token": "[UNK]"} if style == "modernbert_config_unk" else {}


def test_a_unigrams_unknown_token_is_the_one_its_unk_id_names(tmp_path):
    """A Unigram names its unknown token by id (no unk_token): found, also for a checkpoint's record of special
    tokens from before records named it, and refused as the mask token as a BPE's is."""
    source, _ = source_tokenizer("unigram")
    source.save(str(tmp_path / "tokenizer.json"))
    before = {"cls": "<s>", "sep": "</s>", "mask": "<mask>", "pad": "<pad>"}
    assert HFTokenizer(tmp_path / "tokenizer.json", before).special_tokens() == {**before, "unk": "<unk>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<unk>"}))
    with pytest.raises(DataError, match="mask token '<unk>' is also its unk token"):
        HFTokenizer(tmp_path)


def trainer_framing(tokenizer, first: str, second: str | None = None) -> tuple[list, list]:
    """(ids, token types) of the training sample of the text `first` (and `second` as segment B), as
    bert_sample.build_segment frames it (its one masked token put back, a seed that keeps A first)."""
    import numpy as np

    from megatron.data.bert_sample import SpecialIds, build_segment

    ids = SpecialIds(tokenizer.cls, tokenizer.sep, tokenizer.mask, tokenizer.pad)
    sentences = [np.array(tokenizer.tokenize(text)) for text in (first, second) if text is not None]
    segment = next(segment for seed in range(100) for segment in [build_segment(
        sentences, 1000, 1000, ids, np.array([0]), 0.0, np.random.RandomState(seed), binary_head=second is not None)]
        if not segment["sop_labels"][0])
    return np.where(segment["loss_mask"], segment["labels"], segment["tokens"]).tolist(), \
        segment["token_types"].tolist()


@pytest.mark.parametrize("style", ["roberta", "modernbert", "named_in_config", "unigram", "modernbert_config_unk",
                                   "modernbert_template"])
def test_the_export_of_a_hugging_face_tokenizer_loads_with_the_trainers_special_ids(tmp_path, capsys, style):
    """to-hf's tokenizer_config.json named cls, sep, mask and pad but not the unknown token: AutoTokenizer
    loaded it with unk_token None, where the trainer's model writes <unk> / [UNK]; a Unigram's (named by
    unk_id) and one only the source folder's tokenizer_config.json names (ModernBERT's) were still left out.
    Each special id the trainer uses is now the one transformers' AutoTokenizer gives the export of the
    tokenizer a checkpoint carries (tokens named by the source folder's tokenizer_config.json included,
    though the checkpoint carries the tokenizer.json alone)."""
    import transformers

    from bert_fixtures import small_config, small_model
    from megatron import hf_convert
    from megatron.data.tokenizer_identity import carry

    source, settings = source_tokenizer(style)
    (tmp_path / "source").mkdir()
    source.save(str(tmp_path / "source" / "tokenizer.json"))
    (tmp_path / "source" / "tokenizer_config.json").write_text(json.dumps(settings))
    (tmp_path / "ck").mkdir()
    carry(HFTokenizer(tmp_path / "source"), tmp_path / "ck")
    tokenizer = carried_tokenizer(tmp_path / "ck")
    if style == "unigram":  # a ModernBERT export (no token types)
        from test_hf_modernbert import modern_config

        config = modern_config(seq_length=16, max_position_embeddings=16, vocab_size=tokenizer.vocab_size)
    else:
        config = small_config("dense", seq_length=16, max_position_embeddings=16, vocab_size=tokenizer.vocab_size)
    hf_convert.save_hf_folder(tmp_path / "hf", small_model(config).state_dict(), config, hf_tokenizer=tokenizer)
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    trainer = {**tokenizer.ids, "unk": source.token_to_id("[UNK]" if "modernbert" in style else "<unk>")}
    assert {kind: getattr(exported, f"{kind}_token_id") for kind in trainer} == trainer
    text = "the cat sat"
    assert exported(text, add_special_tokens=False).input_ids == tokenizer.tokenize(text)
    # text is framed as the samples were ([CLS] A [SEP] B [SEP], types 0 then 1): a tokenizer.json without a
    # post-processor added neither [CLS] nor [SEP], RoBERTa's gave <s> A </s></s> B </s> with no token types
    for texts in ([text], [text, "on the mat"]):
        encoded, (ids, types) = exported(*texts), trainer_framing(tokenizer, *texts)
        assert encoded.input_ids == ids
        assert encoded.get("token_type_ids") == (None if style == "unigram" else types)
    note = capsys.readouterr().out
    if style == "modernbert_template":
        assert not note and (tmp_path / "hf" / "tokenizer.json").read_bytes() == tokenizer.file_bytes
    else:
        found = " has no post-processor" if "modernbert" in style else "'s RobertaProcessing post-processor"
        assert note.startswith(f"note: {tokenizer.file}{found}") and note.count("\n") == 1
    if style == "roberta":  # its offsets are trimmed of spaces still (RobertaProcessing's trim_offsets)
        assert exported(text, return_offsets_mapping=True)["offset_mapping"] == source.encode(text).offsets


def test_post_processors_that_frame_text_as_the_samples_are_kept():
    """BERT's BertProcessing of the same tokens, the template, either with ByteLevel offset trimming beside it,
    frame text as the samples do (the export keeps them); RoBERTa's, another sep or none do not."""
    from megatron.data.tokenizer import frames_as_samples, sample_template

    cls, sep = ("[CLS]", 2), ("[SEP]", 3)
    bert = json.loads(processors.BertProcessing(sep, cls).__getstate__())
    byte_level = json.loads(processors.ByteLevel(trim_offsets=True).__getstate__())
    for kept in (bert, sample_template(cls, sep), {"type": "Sequence", "processors": [byte_level, bert]}):
        assert frames_as_samples(kept, cls, sep)
    roberta = json.loads(processors.RobertaProcessing(sep, cls).__getstate__())
    for replaced in (roberta, None, sample_template(cls, ("[SEP]", 4)), {"type": "Sequence", "processors": [
            byte_level, roberta]}, {"type": "Sequence", "processors": [bert, bert]}):
        assert not frames_as_samples(replaced, cls, sep)


SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]
KNOWN = ["the cat sat on the mat", "a dog ran by the river", "café au lait"] * 20


def without_unknown_token(kind: str) -> Tokenizer:
    """A tokenizer trained on KNOWN with no unknown token and no byte fallback: a Unigram (raises on a character
    it has no token for), a BPE over words (leaves it out), a WordPiece whose unk_token is no token of its vocab;
    each composes accents (NFC)."""
    if kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=60, special_tokens=SPECIALS)
    elif kind == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=SPECIALS)
    else:
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordPieceTrainer(vocab_size=60, special_tokens=SPECIALS)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.train_from_iterator(KNOWN, trainer)
    return tokenizer


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind, outcome", [("unigram", "fails on it"), ("bpe", "would leave it out of the ids"),
                                           ("wordpiece", "fails on it")])
def test_a_character_a_tokenizer_without_an_unknown_token_cannot_encode_is_named(tmp_path, kind, outcome, workers):
    """A Unigram without unk_id stopped preprocessing with a 33-line Rust traceback (45 with --workers 2), a BPE
    without unk_token wrote 'hello 你好 world' as 'hello world'. Text of its own characters is encoded as before."""
    tokenizer = without_unknown_token(kind)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    assert ours.lacks_fallback.startswith(f"its {tokenizer.model.__class__.__name__} model has no unknown token")
    known = "the cafe\u0301 dog sat"  # a combining accent, not a token alone: checked in its text, where it is é
    assert ours.tokenize_batch([known]) == [tokenizer.encode(known, add_special_tokens=False).ids]
    (tmp_path / "corpus.json").write_text("".join(json.dumps({"text": text}) + "\n" for text in
                                                  [known, "the cat 你好 sat ☃"]))
    with pytest.raises(DataError, match=rf"corpus.json line 2: the tokenizer .*tokenizer.json has no token for '你' "
                                        rf"\(U\+4F60\) and {outcome}: its .* model has no unknown token.*; retrain it "
                                        "with an unknown token") as error:
        preprocess(PreprocessOptions(input=str(tmp_path / "corpus.json"), output_prefix=str(tmp_path / "out" / "x"),
                                     tokenizer_file=str(tmp_path / "tokenizer.json"), log_interval=0, workers=workers))
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


def test_the_character_named_is_the_one_the_text_lacks(tmp_path):
    """A combining accent fails alone but not in its text (NFC joins it to é): the character named is
    the one the model cannot encode in the text, here after the accent."""
    without_unknown_token("bpe").save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(DataError, match=r"has no token for '☃' \(U\+2603\)"):
        HFTokenizer(tmp_path / "tokenizer.json").tokenize_batch(["the cafe\u0301 dog \u2603 sat"])


def test_the_character_named_is_the_one_the_model_lacks_after_normalizing(tmp_path):
    """A lower-casing BPE whose vocab holds 'Z' but not 'z': the error named 'Z', which the vocab holds."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["the cat sat Z"], trainers.BpeTrainer(vocab_size=40, special_tokens=SPECIALS))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert tokenizer.token_to_id("Z") is not None and tokenizer.token_to_id("z") is None
    with pytest.raises(DataError, match=r"has no token for 'z', what its normalizer makes of 'Z' \(U\+005A\), and "
                                        "would leave it out"):
        HFTokenizer(tmp_path / "tokenizer.json").tokenize_batch(["the Zcat"])


def test_a_word_a_wordpiece_without_an_unknown_token_cannot_split_is_one_line(tmp_path):
    """Its characters are all tokens, but not as a word's continuation (##): the Rust side's error, with the fix."""
    vocab = {token: index for index, token in enumerate([*SPECIALS, "a", "b"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    assert ours.tokenize_batch(["a b"]) == [[4, 5]]
    with pytest.raises(DataError, match=r"cannot encode a word of this text \(.*\): its WordPiece model has no unknown "
                                        r"token \(unk_token\); retrain it"):
        ours.tokenize_batch(["ab"])


def test_tokenizers_that_encode_any_text_are_not_checked(texts):
    """An unknown token, byte fallback, or a byte-level BPE holding all 256 byte characters: nothing is lost."""
    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.train_from_iterator(KNOWN, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fallback = Tokenizer(models.BPE(byte_fallback=True))
    for complete in (byte_level, fallback, train_bpe(KNOWN, ["<unk>", *SPECIALS], vocab_size=300)):
        settings = json.loads(complete.to_str())
        assert tokenizer_module._missing_fallback(settings, complete.get_vocab(with_added_tokens=True)) is None
    byte_level.model = models.BPE({"a": 0}, [])  # a byte-level BPE of one character: '你' is lost
    assert tokenizer_module._missing_fallback(json.loads(byte_level.to_str()), {"a": 0}).startswith("its BPE")


def test_special_tokens_spelled_out_in_the_text_are_encoded_as_text(tmp_path):
    """A corpus quoting `<mask>`, `</s>` or `<pad>` (HTML, code, papers on tokenizers) was written with the mask,
    sep and pad ids inside its text; an added token that is not special stays one token."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(KNOWN, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel
                                                             .alphabet(), special_tokens=["<unk>", "<s>", "</s>",
                                                                                          "<pad>", "<mask>"]))
    tokenizer.add_tokens(["tags"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    text = "use the <mask> and </s> tags, <pad><pad>"
    (tmp_path / "corpus.json").write_text(json.dumps({"text": text}) + "\n")
    report = preprocess(PreprocessOptions(input=str(tmp_path / "corpus.json"), output_prefix=str(tmp_path / "x"),
                                          tokenizer_file=str(tmp_path / "tokenizer.json"), log_interval=0))
    ours = HFTokenizer(tmp_path / "tokenizer.json")
    stored = make_dataset(report.outputs["text"])[0].tolist()
    assert not set(stored) & set(ours.added_specials()) and tokenizer.token_to_id("tags") in stored
    assert ours.decode_one(stored[0]) + "".join(ours.decode_one(index) for index in stored[1:]) == text
    assert set(tokenizer.encode(text, add_special_tokens=False).ids) & set(ours.added_specials())  # as it was
