"""--whole-word-masking: the flag reaches the train, valid and test BertDatasets that pretrain
builds (WordPiece's masking itself: tests/test_data_bert.py), and the words of a byte-level BPE ('Ġ')
and a Metaspace ('▁') tokenizer are found by their own marker, masked whole, and trained on."""
import functools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from megatron.arguments import build_parser
from megatron.data.bert_dataset import BertDataset
from megatron.data.bert_sample import SpecialIds, build_segment
from megatron.data.indexed_dataset import make_builder, make_dataset
from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.data.sample_corpus import write_corpus as write_sample_corpus
from megatron.data.tokenizer import HFTokenizer
from megatron.data.words import BYTE_LEVEL_SPACE, word_marks, word_rule
from megatron.errors import ConfigError
from megatron.parallel.spawn import run_on_ranks
from megatron.run_data import sample_options
from megatron.training import main
from test_data_bert import write_corpus, write_vocab
from test_hf_tokenizer import train_bpe


class DatasetsBuilt(Exception):
    """Stops pretrain once its datasets exist, before the engine is built."""


def datasets_of_pretrain(argvs: list) -> list:
    """Per argv, (split name, whole-word masking on) of every BertDataset `pretrain` builds."""
    import megatron.training as training
    from megatron.data import bert_dataset

    built = []
    init = bert_dataset.BertDataset.__init__

    def recording_init(self, name, *args, **kwargs):
        init(self, name, *args, **kwargs)
        built[-1].append((name, self.words is not None))

    def stop(*args, **kwargs):
        raise DatasetsBuilt

    bert_dataset.BertDataset.__init__ = recording_init
    training.build_engine = stop
    for argv in argvs:
        built.append([])
        with pytest.raises(DatasetsBuilt):
            training.pretrain(build_parser().parse_args(argv))
    return built


def test_flag_sets_the_sample_options():
    binary_head = SimpleNamespace(model=SimpleNamespace(add_binary_head=True, max_segment_length=None),
                                  pack_samples=False)
    assert sample_options(build_parser().parse_args([]), binary_head)["whole_word_masking"] is False
    options = sample_options(build_parser().parse_args(["--whole-word-masking", "--mask-prob", "0.2"]), binary_head)
    assert options == dict(masked_lm_prob=0.2, short_seq_prob=0.1, seed=1234, binary_head=True,
                           whole_word_masking=True, pack_samples=False, max_segment_length=None)
    assert "all pieces of a word are masked together" in " ".join(build_parser().format_help().split())


def test_flag_reaches_the_train_valid_and_test_datasets(tmp_path):
    prefix, vocab = write_corpus(tmp_path / "corpus", num_docs=120), write_vocab(tmp_path)
    argv = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "64",
            "--max-position-embeddings", "64", "--micro-batch-size", "2", "--train-iters", "2", "--eval-iters", "1",
            "--split", "80,10,10", "--data-path", prefix, "--vocab-file", str(vocab.file)]
    with_flag, without = run_on_ranks(datasets_of_pretrain, 1, [[*argv, "--whole-word-masking"], argv], timeout=120)[0]
    assert with_flag == [("train", True), ("valid", True), ("test", True)]
    assert without == [("train", False), ("valid", False), ("test", False)]


# ---- words of byte-level BPE (ModernBERT, RoBERTa: 'Ġ') and SentencePiece-style (Metaspace: '▁') tokenizers

SPECIALS = ["[UNK]", "[MASK]", "[SEP]", "[PAD]", "[CLS]"]


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> list:
    path = tmp_path_factory.mktemp("wwm_corpus") / "corpus.json"
    write_sample_corpus(path, 60_000)
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    # ASCII lines only: the oracle decodes pieces one or two at a time, which would cut a character of several bytes
    return ["\n".join(line for line in text.splitlines() if line.isascii()) for text in texts]


def train_metaspace(texts) -> Tokenizer:
    """A SentencePiece-style Unigram: words marked by a '▁' where a space was (T5's, ALBERT's, XLM-R's)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=600, special_tokens=SPECIALS,
                                                                 unk_token="[UNK]"))
    return tokenizer


def train_byte_fallback(texts) -> Tokenizer:
    """A Llama-style BPE: '▁' word marks, and a character out of the vocab (the line break here) spelled by
    its byte pieces '<0x0A>', which are vocab entries, not added tokens."""
    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS))
    settings = json.loads(tokenizer.to_str())
    vocab = settings["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    return Tokenizer.from_str(json.dumps(settings))


TRAINERS = {"byte_level": lambda texts: train_bpe(texts, SPECIALS, vocab_size=600), "metaspace": train_metaspace,
            "byte_fallback": lambda texts: train_byte_fallback([text.replace("\n", " ") for text in texts])}


@pytest.fixture(scope="module", params=list(TRAINERS))
def tokenizer_file(request, texts, tmp_path_factory) -> Path:
    rust = TRAINERS[request.param](texts)
    rust.add_tokens(["<added>"])  # an added token that is no special one: a word of its own as well
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    rust.save(str(path))
    return path


def word_oracle(tokenizer):
    """-> begins_word(before, piece), from the decoded text alone: `piece` begins a word where its text
    begins with whitespace, or the text of `before` ends with whitespace other than a space (a space-only
    piece is the space in front of the word after it), or either is a special or added token."""
    own = tokenizer.own_word_ids()

    @functools.lru_cache(maxsize=None)
    def begins_word(before: int, piece: int) -> bool:
        if {before, piece} & own:
            return True
        alone = tokenizer._rust.decode([before])
        text = tokenizer._rust.decode([before, piece])[len(alone):]
        return text[:1].isspace() or (alone[-1:].isspace() and alone[-1:] != " ")

    return lambda before, piece: begins_word(int(before), int(piece))


def test_words_are_found_by_the_tokenizers_own_marker(texts, tokenizer_file):
    """Each piece of every sentence begins a word exactly where the text has whitespace before it (the
    first piece of a sentence always): 'Ġ' / '▁' read from the tokenizer, added tokens words of their own."""
    tokenizer = HFTokenizer(tokenizer_file)
    marks, begins_word = word_marks(tokenizer), word_oracle(tokenizer)
    checked = 0
    for text in texts:
        for line in [*text.splitlines()[:20], "one <added>two [MASK]three"]:
            ids = np.array(tokenizer.tokenize(line))
            if len(ids) < 2:
                continue
            expected = [True] + [begins_word(a, b) for a, b in zip(ids[:-1], ids[1:])]
            assert marks.starts(ids).tolist() == expected, tokenizer.convert_ids_to_tokens(ids)
            checked += len(ids)
    assert checked > 5000


@pytest.mark.parametrize("text, words", [
    ("I don't know the end.", ["I", " don't", " know", " the", " end."]),
    ("Not (this), x\nline", ["Not", " (this),", " x", "\n", "line"]),
])
def test_punctuation_stays_with_its_word_and_a_line_break_separates_words(texts, tokenizer_file, text, words):
    """The words are those the spaces delimit: "don't" (Ġdon 't) and "end." are one word each."""
    tokenizer = HFTokenizer(tokenizer_file)
    ids = np.array(tokenizer.tokenize(text))
    starts = np.flatnonzero(word_marks(tokenizer).starts(ids))
    pieces = [ids[start:end] for start, end in zip(starts, [*starts[1:], len(ids)])]
    decoded = [tokenizer._rust.decode(piece.tolist()) for piece in pieces]
    assert [word.strip(" ") for word in decoded] == [word.strip(" ") for word in words]


def test_a_sentence_begins_a_word_without_a_marker(tokenizer_file):
    """ByteLevel without add_prefix_space gives a sentence's first word no 'Ġ': it still begins a word,
    not the last word of the sentence before. Half of the pieces are masked: one sentence, never a part."""
    tokenizer = HFTokenizer(tokenizer_file)
    first, second = (np.array(tokenizer.tokenize(text)) for text in ("overall", "implementation"))
    ids = SpecialIds(cls=tokenizer.cls, sep=tokenizer.sep, mask=tokenizer.mask, pad=tokenizer.pad)
    words = word_marks(tokenizer)
    if word_rule(tokenizer) == ("marker", BYTE_LEVEL_SPACE):  # read as one stream, the two are one word
        assert not words.starts(np.concatenate([first, second]))[len(first)]
    sentences = [first, second]
    budget = round((len(first) + len(second)) * 0.5)
    for seed in range(20):
        segment = build_segment(sentences, 100, 100, ids, np.arange(10, 20), budget / (len(first) + len(second)),
                                np.random.RandomState(seed), binary_head=False, words=words)
        loss = segment["loss_mask"][1:-1]
        assert loss.sum() > 0
        assert loss[:len(first)].all() or not loss[:len(first)].any()
        assert loss[len(first):].all() or not loss[len(first):].any()


def write_data(tokenizer, texts, prefix) -> str:
    """The texts as documents of sentences, each tokenized with a space before it, so that the oracle
    (begins_word) sees the boundary the dataset takes a sentence's start for."""
    with make_builder(prefix, "mmap", tokenizer.vocab_size) as builder:
        for text in texts:
            for paragraph in text.splitlines():
                sentences = [tokenizer.tokenize(" " + sentence.strip()) for sentence in paragraph.split(". ")]
                if sum(1 for sentence in sentences if sentence) >= 2:
                    builder.add_document([sentence for sentence in sentences if sentence])
    return str(prefix)


def split_words(begins_word, sample) -> int:
    """Pieces inside a word whose prediction differs from the piece before them: words masked in part."""
    tokens = np.where(sample["loss_mask"], sample["labels"], sample["tokens"])
    length = int((sample["segment_ids"] > 0).sum())
    return sum(1 for p in range(1, length) if sample["loss_mask"][p] != sample["loss_mask"][p - 1]
               and not begins_word(tokens[p - 1], tokens[p]))


def test_masking_covers_whole_words_at_the_mask_rate(texts, tokenizer_file, tmp_path):
    """Every word (by the oracle) is masked entirely or not at all, 15% of the pieces are predicted; the
    control: the same samples without the option mask words in part."""
    tokenizer = HFTokenizer(tokenizer_file)
    prefix = write_data(tokenizer, texts, tmp_path / "corpus")
    indexed = make_dataset(prefix)
    whole, plain = (BertDataset("train", indexed, prefix, (0, len(indexed)), 400, 64, tokenizer,
                                whole_word_masking=flag) for flag in (True, False))
    begins_word, predicted, maskable = word_oracle(tokenizer), 0, 0
    for i in range(400):
        sample = whole[i]
        assert split_words(begins_word, sample) == 0
        predicted += sample["loss_mask"].sum()
        maskable += int((sample["segment_ids"] > 0).sum()) - 3
    assert abs(predicted / maskable - 0.15) < 0.01
    assert sum(split_words(begins_word, plain[i]) for i in range(400)) > 0


def test_a_unigram_tokenizer_without_metaspace_is_refused_in_one_line(texts, tmp_path):
    """No rule tells its words apart: a Unigram over whitespace-split text has no marker of a word's start."""
    rust = Tokenizer(models.Unigram())
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.train_from_iterator(texts[:5], trainers.UnigramTrainer(vocab_size=200, special_tokens=SPECIALS,
                                                                unk_token="[UNK]"))
    rust.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError) as raised:
        word_rule(HFTokenizer(tmp_path / "tokenizer.json"))
    assert str(raised.value).count("\n") == 0 and "a Unigram model, pre-tokenizer Whitespace" in str(raised.value)
    assert raised.value.fix == "drop --whole-word-masking"


def test_a_short_training_run_with_a_byte_level_tokenizer(texts, tmp_path):
    """preprocess_data (sentences split) -> two steps of --whole-word-masking with the tokenizer.json."""
    path = tmp_path / "tokenizer.json"
    train_bpe(texts, SPECIALS, vocab_size=600).save(str(path))
    (tmp_path / "corpus.json").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    preprocess(PreprocessOptions(input=str(tmp_path / "corpus.json"), output_prefix=str(tmp_path / "data"),
                                 tokenizer_file=str(path), split_sentences=True, log_interval=0))
    argv = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "64",
            "--max-position-embeddings", "64", "--micro-batch-size", "2", "--train-iters", "2", "--eval-iters", "1",
            "--split", "80,10,10", "--data-path", str(tmp_path / "data_text_sentence"), "--tokenizer-type",
            "HFTokenizer", "--tokenizer-file", str(path), "--whole-word-masking", "--log-dir", str(tmp_path / "log")]
    assert run_on_ranks(main, 1, argv, timeout=180) == [0]


@pytest.mark.parametrize("lengths", [(3, 2, 0), (3, 0, 2), (0, 0)])
def test_an_empty_sentence_builds_a_segment(tokenizer_file, lengths):
    """A span whose last sentence has no token (an .idx from another tool: preprocess drops them) made
    whole-word masking raise IndexError: that sentence begins at the span's length, past its last token."""
    tokenizer = HFTokenizer(tokenizer_file)
    piece = tokenizer.tokenize("implementation")[0]
    sentences = [np.full(length, piece) for length in lengths]
    ids = SpecialIds(cls=tokenizer.cls, sep=tokenizer.sep, mask=tokenizer.mask, pad=tokenizer.pad)
    segment = build_segment(sentences, 100, 100, ids, np.arange(10, 20), 0.5, np.random.RandomState(0),
                            binary_head=False, words=word_marks(tokenizer))
    assert len(segment["tokens"]) == sum(lengths) + 2


def tokenizer_of(tmp_path, model, normalizer=None, pre_tokenizer=None) -> HFTokenizer:
    rust = Tokenizer(model)
    rust.normalizer, rust.pre_tokenizer = normalizer, pre_tokenizer
    rust.add_special_tokens(SPECIALS)
    rust.save(str(tmp_path / "tokenizer.json"))
    return HFTokenizer(tmp_path / "tokenizer.json")


VOCAB = {token: index for index, token in enumerate(["a", "b", "ab", "ab</w>", "##b", "▁a", "▁ab"])}


@pytest.mark.parametrize("kind", ["wordpiece", "suffix", "replace", "wordlevel"])
def test_each_kind_of_tokenizer_has_its_rule(tmp_path, kind):
    """The rule is read from the tokenizer's settings, not its tokens: the same tokens are split into words
    by '##' (WordPiece), by a '</w>' suffix (a BPE with end_of_word_suffix), by '▁' (a BPE behind Llama's
    normalizer, which writes '▁' for each space: a '##' piece there continues a word like any other), or
    not at all (WordLevel)."""
    model, normalizer, rule, continuation, ends_word = {
        "wordpiece": (models.WordPiece(VOCAB, unk_token="a"), None, ("prefix", "##"), {"##b"}, set()),
        "suffix": (models.BPE(VOCAB, [], end_of_word_suffix="</w>"), None, ("suffix", "</w>"),
                   set(VOCAB), {"ab</w>"}),
        "replace": (models.BPE(VOCAB, []), normalizers.Sequence([normalizers.Prepend("▁"),
                                                                   normalizers.Replace(" ", "▁")]),
                    ("marker", "▁"), {"a", "b", "ab", "ab</w>", "##b"}, set()),
        "wordlevel": (models.WordLevel(VOCAB, unk_token="a"), None, ("whole", ""), set(), set()),
    }[kind]
    tokenizer = tokenizer_of(tmp_path, model, normalizer)
    assert word_rule(tokenizer) == rule
    marks = word_marks(tokenizer)
    assert {tokenizer.tokens[i] for i in np.flatnonzero(marks.continuation)} == continuation
    assert {tokenizer.tokens[i] for i in np.flatnonzero(marks.ends_word)} == ends_word | set(SPECIALS)


def test_a_bpe_without_a_marker_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"\(a BPE model, pre-tokenizer Whitespace\) has none"):
        word_rule(tokenizer_of(tmp_path, models.BPE(VOCAB, []), pre_tokenizer=pre_tokenizers.Whitespace()))
