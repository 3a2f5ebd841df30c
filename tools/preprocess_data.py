"""Turns a corpus into Megatron indexed datasets: `{prefix}_{key}_{sentence|document}.bin/.idx`.

The corpus is loose JSON (one object per line), plain or compressed (`.jsonl.gz`, `.jsonl.zst`), or
Parquet (`--json-keys` name its columns); one file, a folder of shards or a quoted glob.

Flags follow Megatron's tools/preprocess_data.py (plus `--vocab`/`--json-key` spellings and
`--skip-invalid`), so existing launch scripts run unchanged.
"""
import sys

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import OneLineParser, run_tool, start_up_stops_in_one_line

with start_up_stops_in_one_line("preprocess_data.py"):  # Ctrl-C during the imports: one line
    from megatron.data.indexed_dataset import IMPLS
    from megatron.data.preprocess import EncodingCrashed, PreprocessOptions, preprocess
    from megatron.data.tokenizer import add_tokenizer_flags
    from megatron.flag_habits import PREPROCESS_HABITS


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="preprocess_data.py", description=__doc__, habits=PREPROCESS_HABITS)
    group = parser.add_argument_group("input")
    group.add_argument("--input", required=True, nargs="+",
                       help="loose JSON (one object per line), .jsonl.gz, .jsonl.zst or .parquet; or a folder or "
                            "quoted glob of such shards, read in sorted order; several (an unquoted glob the shell "
                            "expanded) are read in the order given")
    group.add_argument("--json-keys", "--json-key", nargs="+", default=["text"],
                       help="keys (Parquet: columns) to extract; each gets its own output (default text)")
    group.add_argument("--split-sentences", action="store_true", help="one item per sentence (Punkt), needed for BERT")
    group.add_argument("--keep-newlines", action="store_true", help="keep newlines between sentences when splitting")
    group.add_argument("--lang", help="Punkt model language for --split-sentences (default english)")
    group.add_argument("--skip-invalid", action="store_true",
                       help="count and skip bad records (lines, Parquet rows) instead of stopping")
    group = parser.add_argument_group("tokenizer")
    add_tokenizer_flags(group, "BERT vocab.txt (or --tokenizer-file)")
    group.add_argument("--append-eod", action="store_true",
                       help="append [SEP] to each document (a GPT flag: BERT samples add their own; warned of)")
    group = parser.add_argument_group("output")
    group.add_argument("--output-prefix", required=True, help="path prefix of the .bin/.idx files")
    group.add_argument("--dataset-impl", default="mmap", choices=IMPLS, help="indexed dataset format (default mmap)")
    group = parser.add_argument_group("runtime")
    group.add_argument("--workers", type=int, default=1, help="tokenizing processes (default 1)")
    group.add_argument("--log-interval", type=int, default=None,
                       help="documents between progress lines; 0: none (default: a line every 15 s, the first after "
                            "2 s, with the input read, percent and ETA)")
    group.add_argument("--debug", action="store_true",
                       help="print the traceback of an error no check foresaw (in a tokenizing worker too)")
    return parser


def parse_args(argv=None) -> PreprocessOptions:
    args = build_parser().parse_args(argv)
    inputs = args.input[0] if len(args.input) == 1 else tuple(args.input)
    return PreprocessOptions(**{**vars(args), "input": inputs, "json_keys": tuple(args.json_keys)})


def main(argv=None):
    options = parse_args(argv)
    try:
        report = preprocess(options)
    except EncodingCrashed as error:  # one line; --debug: the traceback where it happened (a worker's too)
        if options.debug:
            print(error.trace, end="", file=sys.stderr)
        print(f"preprocess_data.py: error: {error}", file=sys.stderr, flush=True)
        return 1
    for key, prefix in report.outputs.items():
        print(f"{key}: {prefix}.bin/.idx")
    empty = f" ({report.empty} without text, left out)" if report.empty else ""
    print(f"{report.documents} documents{empty}, {report.skipped} skipped, {report.bytes_read / 2**20:.2f} MB "
          f"in {report.seconds:.2f} s")
    if report.removed_maps:
        print(f"removed {len(report.removed_maps)} index maps of the data these outputs replaced")


if __name__ == "__main__":
    sys.exit(run_tool("preprocess_data.py", main))
