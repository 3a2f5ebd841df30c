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
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                yield from (record[key] for key in json_keys)
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise DataError(f"{path} line {number}: not a JSON object with keys {', '.join(json_keys)} ({error})",
                                "fix the line or pass --json-keys naming the text fields") from None


def train_vocab(input_path: Path, lower_case: bool, vocab_size: int, min_frequency: int = 2, json_keys=("text",)) -> list[str]:
    """The vocab as a list of tokens, index = id: special tokens, then the rest sorted. HF's
    trainer lists tokens in hash order, so sorting makes equal vocabularies equal files (ties
    in pair counts at the size limit can still swap a rare last token between runs)."""
    tokenizer = BertWordPieceTokenizer(lowercase=lower_case, strip_accents=None if lower_case else False)
    tokenizer.train_from_iterator(corpus_texts(input_path, json_keys), vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    learned = set(tokenizer.get_vocab()) - set(SPECIAL_TOKENS)
    return list(SPECIAL_TOKENS) + sorted(learned)


def write_vocab(tokens: list[str], output: Path):
    partial = output.with_name(output.name + ".partial")
    partial.write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    os.replace(partial, output)
