"""Our WordPiece tokenizers give the ids of transformers.BertTokenizerFast loaded from the same
vocab folder (transformers 5.x ignores `vocab_file=`, so the folder is what a user would load),
on a few thousand lines of the default corpus plus lines that stress normalisation."""
import json
import shutil

import pytest
import transformers

from megatron.data.default_dataset import DEFAULT_VOCAB_SIZE
from megatron.data.sample_corpus import write_corpus
from megatron.data.tokenizer import TOKENIZER_TYPES, build_tokenizer
from megatron.data.vocab_builder import train_vocab, write_vocab

LINES = 3000
# accents (stripped only when lower-casing), CJK (split per character), control and zero-width
# characters, punctuation runs, unknown words, and words longer than WordPiece's 100 characters
STRESS = ["Café déjà vu, naïve façade — Ångström!", "東京は大きい 北京 and Seoul", "tab\there\u200bzero\u00adsoft",
          "(((nested))) ... ?!? 3.14159 -- 1,000,000", "ZXQWV qqqqq unknownish", "a" * 150 + " tail"]


@pytest.fixture(scope="module")
def corpus_lines_and_vocab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("parity")
    corpus = directory / "sample_corpus.json"
    write_corpus(corpus, 1_500_000)
    (directory / "hf").mkdir()
    vocab_file = directory / "hf" / "vocab.txt"
    write_vocab(train_vocab(corpus, lower_case=True, vocab_size=DEFAULT_VOCAB_SIZE), vocab_file)
    lines = [line for record in corpus.read_text().splitlines() for line in json.loads(record)["text"].split("\n")]
    assert len(lines) >= LINES
    return lines[:LINES] + STRESS, vocab_file


@pytest.mark.parametrize("tokenizer_type", sorted(TOKENIZER_TYPES))
def test_same_ids_as_bert_tokenizer_fast(tmp_path, corpus_lines_and_vocab, tokenizer_type):
    lines, vocab_file = corpus_lines_and_vocab
    lower_case = TOKENIZER_TYPES[tokenizer_type]
    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copyfile(vocab_file, folder / "vocab.txt")
    hf = transformers.BertTokenizerFast.from_pretrained(folder, do_lower_case=lower_case)
    assert len(hf) == DEFAULT_VOCAB_SIZE  # the folder's vocab, not a default one
    ours = build_tokenizer(tokenizer_type, vocab_file)
    expected = hf(lines, add_special_tokens=False)["input_ids"]
    got = ours.tokenize_batch(lines)
    mismatches = [(line, want, have) for line, want, have in zip(lines, expected, got) if want != have]
    assert not mismatches, f"{len(mismatches)} of {len(lines)} lines differ, first: {mismatches[0]}"
    assert sum(map(len, got)) > 20 * len(lines)  # real text, not empty encodings
    assert expected[-1][0] == ours.vocab["[UNK]"]  # the over-long word
