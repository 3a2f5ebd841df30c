"""Trains a BERT WordPiece `vocab.txt` from a corpus (loose JSON, .jsonl.gz, .jsonl.zst, Parquet; a
file, folder or glob of shards, read as preprocessing reads them), for users without a vocab and
for the embedded default dataset. Special tokens come first: [PAD]=0, [UNK], [CLS], [SEP], [MASK].
"""
import os
from pathlib import Path

from tokenizers import BertWordPieceTokenizer

from megatron.data.corpus_files import Corpus, record_texts
from megatron.data.tokenizer import SPECIAL_TOKENS
from megatron.errors import DataError


def corpus_texts(corpus: Corpus, skipped: list | None = None):
    """Every text of the corpus under its keys. A record without one stops with one line naming it,
    or, given a `skipped` list (--skip-invalid, as preprocessing has), is named there and left out."""
    for location, raw, _ in corpus.records():
        texts = record_texts(raw, corpus.keys)
        if isinstance(texts, str):
            if skipped is not None:
                skipped.append(f"{corpus.where(location)}: {texts}")
                continue
            raise DataError(f"{corpus.where(location)}: {texts}", ("pass --json-keys naming the text fields"
                            if texts.startswith("no key") else "fix or remove the record")
                            + ", or pass --skip-invalid to leave such records out")
        yield from texts.values()


def train_vocab(input_path: Path, lower_case: bool, vocab_size: int, min_frequency: int = 2, json_keys=("text",),
                skipped: list | None = None) -> list[str]:
    """The vocab as a list of tokens, index = id: special tokens, then the rest sorted. HF's
    trainer lists tokens in hash order, so sorting makes equal vocabularies equal files (ties
    in pair counts at the size limit can still swap a rare last token between runs). Records
    without text stop it, or with a `skipped` list are left out and listed there."""
    tokenizer = BertWordPieceTokenizer(lowercase=lower_case, strip_accents=None if lower_case else False)
    tokenizer.train_from_iterator(corpus_texts(Corpus(str(input_path), json_keys), skipped), vocab_size=vocab_size,
                                  min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    learned = set(tokenizer.get_vocab()) - set(SPECIAL_TOKENS)
    if not learned:  # a vocab of the special tokens alone would tokenize every word as [UNK]
        raise DataError(f"{input_path} gave no token to learn (no text under --json-keys {' '.join(json_keys)}"
                        f"{f'; {len(skipped)} records skipped' if skipped else ''})", "pass a corpus with text")
    return list(SPECIAL_TOKENS) + sorted(learned)


def write_vocab(tokens: list[str], output: Path):
    """Whole file or nothing: `<output>.partial`, then a rename; the partial file never stays."""
    output = Path(output)
    partial = output.with_name(output.name + ".partial")
    try:
        partial.write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
        os.replace(partial, output)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
