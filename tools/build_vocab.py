"""Trains a BERT WordPiece `vocab.txt` from a loose-JSON corpus, for users without a vocab and
for the embedded default dataset. Special tokens come first: [PAD]=0, [UNK], [CLS], [SEP], [MASK].
"""
import argparse
import json
import os
import sys
from pathlib import Path

from tokenizers import BertWordPieceTokenizer

from megatron.data.tokenizer import SPECIAL_TOKENS, TOKENIZER_TYPES
from megatron.errors import ConfigError, DataError


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True, help="loose JSON, one object per line")
    parser.add_argument("--output", required=True, help="vocab.txt to write")
    parser.add_argument("--json-keys", nargs="+", default=["text"])
    parser.add_argument("--tokenizer-type", default="BertWordPieceLowerCase", choices=sorted(TOKENIZER_TYPES))
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--min-frequency", type=int, default=2)
    args = parser.parse_args(argv)
    input_path, output = Path(args.input), Path(args.output)
    if not input_path.is_file():
        raise DataError(f"input file {input_path} does not exist", "pass --input with a loose-JSON corpus (tools/make_sample_corpus.py writes one)")
    if not output.parent.is_dir():
        raise ConfigError(f"output directory {output.parent} does not exist", "create it or pass another --output")
    if args.vocab_size <= len(SPECIAL_TOKENS):
        raise ConfigError(f"--vocab-size {args.vocab_size} leaves no room beyond the special tokens", "pass a larger --vocab-size")
    tokens = train_vocab(input_path, TOKENIZER_TYPES[args.tokenizer_type], args.vocab_size, args.min_frequency, args.json_keys)
    write_vocab(tokens, output)
    print(f"wrote {len(tokens)} tokens to {output}")


if __name__ == "__main__":
    try:
        main()
    except ConfigError as error:
        sys.exit(f"error: {error}")
