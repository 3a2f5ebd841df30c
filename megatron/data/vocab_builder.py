"""Trains a BERT WordPiece `vocab.txt` from a loose-JSON corpus, for users without a vocab and
for the embedded default dataset. Special tokens come first: [PAD]=0, [UNK], [CLS], [SEP], [MASK].
"""
import json
import os
from pathlib import Path

from tokenizers import BertWordPieceTokenizer

from megatron.data.tokenizer import SPECIAL_TOKENS
from megatron.errors import DataError


def corpus_texts(path: Path, json_keys):
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(f"{path} line {number}: not UTF-8 text (byte {raw[error.start]:#04x} at column "
                                f"{error.start + 1}); is it a binary file?",
                                "pass a loose-JSON corpus in UTF-8 (one JSON object per line)") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                texts = [record[key] for key in json_keys]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise DataError(f"{path} line {number}: not a JSON object with keys {', '.join(json_keys)} ({error})",
                                "fix the line or pass --json-keys naming the text fields") from None
            for key, text in zip(json_keys, texts):
                if not isinstance(text, str):
                    raise DataError(f"{path} line {number}: key {key!r} holds {type(text).__name__}, not text",
                                    "fix the line or pass --json-keys naming the text fields")
            yield from texts


def train_vocab(input_path: Path, lower_case: bool, vocab_size: int, min_frequency: int = 2, json_keys=("text",)) -> list[str]:
    """The vocab as a list of tokens, index = id: special tokens, then the rest sorted. HF's
    trainer lists tokens in hash order, so sorting makes equal vocabularies equal files (ties
    in pair counts at the size limit can still swap a rare last token between runs)."""
    tokenizer = BertWordPieceTokenizer(lowercase=lower_case, strip_accents=None if lower_case else False)
    tokenizer.train_from_iterator(corpus_texts(input_path, json_keys), vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    learned = set(tokenizer.get_vocab()) - set(SPECIAL_TOKENS)
    if not learned:  # a vocab of the special tokens alone would tokenize every word as [UNK]
        raise DataError(f"{input_path} gave no token to learn (no text under --json-keys {' '.join(json_keys)})",
                        "pass a corpus with text")
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
