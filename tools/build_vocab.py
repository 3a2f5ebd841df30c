"""Trains a BERT WordPiece `vocab.txt` from a loose-JSON corpus (special tokens first:
[PAD]=0, [UNK], [CLS], [SEP], [MASK]), for users without a vocab and for the default dataset.
"""
import argparse
import sys
from pathlib import Path

from megatron.data.tokenizer import SPECIAL_TOKENS, TOKENIZER_TYPES
from megatron.data.vocab_builder import train_vocab, write_vocab
from megatron.errors import ConfigError, DataError, run_tool


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
        raise DataError(f"input file {input_path} does not exist",
                        "pass --input with a loose-JSON corpus (tools/make_sample_corpus.py writes one)")
    if args.vocab_size <= len(SPECIAL_TOKENS):
        raise ConfigError(f"--vocab-size {args.vocab_size} leaves no room beyond the special tokens", "pass a larger --vocab-size")
    tokens = train_vocab(input_path, TOKENIZER_TYPES[args.tokenizer_type], args.vocab_size, args.min_frequency, args.json_keys)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_vocab(tokens, output)
    print(f"wrote {len(tokens)} tokens to {output}")


if __name__ == "__main__":
    sys.exit(run_tool("build_vocab.py", main))
