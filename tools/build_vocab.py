"""Trains a BERT WordPiece `vocab.txt` from a corpus in any format preprocessing reads (special tokens first:
[PAD]=0, [UNK], [CLS], [SEP], [MASK]), for users without a vocab and for the default dataset.
"""
import os
import sys
import threading
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron import paths
from megatron.data.corpus_files import Corpus
from megatron.data.shard_discovery import FORMATS_HELP
from megatron.data.tokenizer import SPECIAL_TOKENS, TOKENIZER_TYPES
from megatron.data.vocab_builder import train_vocab, write_vocab
from megatron.errors import ConfigError, OneLineParser, run_tool


def main(argv=None):
    parser = OneLineParser(prog="build_vocab.py", description=__doc__)
    parser.add_argument("--input", required=True, help=f"the corpus: {FORMATS_HELP}, or a folder or glob of shards "
                        "(as tools/preprocess_data.py reads it)")
    parser.add_argument("--output", required=True, help="vocab.txt to write (not an existing file unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --output (never one of the --input files or a dataset's .bin/.idx)")
    parser.add_argument("--json-keys", nargs="+", default=["text"],
                        help="the keys (Parquet: columns) whose text is read (default: %(default)s)")
    parser.add_argument("--tokenizer-type", default="BertWordPieceLowerCase", choices=sorted(TOKENIZER_TYPES),
                        help="lower-cased or cased WordPiece, as preprocess_data.py and the trainer will read it "
                             "(default: %(default)s)")
    parser.add_argument("--vocab-size", type=int, default=30522,
                        help="tokens in the vocab, special tokens included (default: %(default)s, BERT's)")
    parser.add_argument("--min-frequency", type=int, default=2,
                        help="a pair of pieces seen fewer times is not merged (default: %(default)s)")
    parser.add_argument("--skip-invalid", action="store_true",
                        help="leave out bad records (lines, Parquet rows), counted, instead of stopping")
    args = parser.parse_args(argv)
    input_path, output = Path(args.input), Path(args.output)
    refuse_output(output, args.input, args.json_keys, args.overwrite)
    if args.vocab_size <= len(SPECIAL_TOKENS):
        raise ConfigError(f"--vocab-size {args.vocab_size} leaves no room beyond the special tokens",
                          "pass a larger --vocab-size")
    if args.min_frequency < 1:
        raise ConfigError(f"--min-frequency {args.min_frequency} must be >= 1", "pass --min-frequency 1 or more")
    skipped = [] if args.skip_invalid else None
    tokens = in_thread(train_vocab, input_path, TOKENIZER_TYPES[args.tokenizer_type], args.vocab_size,
                       args.min_frequency, args.json_keys, skipped)
    created = paths.missing_folders(str(output.parent))
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_vocab(tokens, output)
    except BaseException as error:
        paths.remove_empty(created)
        if isinstance(error, OSError):
            raise ConfigError(f"cannot write --output {output} ({error.strerror or error})",
                              "pass an --output in a folder this user can write") from None
        raise
    print(f"wrote {len(tokens)} tokens to {output}" + (
        f"; skipped {len(skipped)} invalid record{'s' if len(skipped) > 1 else ''} (the first: {skipped[0]})"
        if skipped else "") + (
        f" ({len(tokens) - args.vocab_size} more than --vocab-size {args.vocab_size}: WordPiece keeps every character "
        "of the corpus, its alphabet, at any size)" if len(tokens) > args.vocab_size else "") + (
        f" ({args.vocab_size - len(tokens)} fewer than --vocab-size {args.vocab_size}: no other pair of pieces occurs "
        f"--min-frequency {args.min_frequency} times in this corpus; a larger corpus gives more)"
        if len(tokens) < args.vocab_size else ""))


def refuse_output(output: Path, input_spec: str, json_keys: list, overwrite: bool) -> None:
    """An --output that would destroy something: one of the --input files (the corpus replaced by a vocab),
    or what paths.refuse_replacing refuses: a dataset's .bin/.idx, or (without --overwrite) any existing file,
    most often the vocab that data and checkpoints were made with, which they need to be read again."""
    if output.is_file() and any(os.path.samefile(shard.path, output)
                                for shard in Corpus(input_spec, tuple(json_keys)).shards):
        raise ConfigError(f"--output {output} is one of the --input files: the corpus would be replaced by its vocab",
                          "pass another --output, e.g. vocab.txt beside it")
    paths.refuse_replacing(output, "a vocab", "vocab.txt", overwrite,
                           " (data and checkpoints made with a vocab need that vocab)")


_finished = []  # one event per in_thread call, set when its function has returned or raised


def in_thread(function, *args):
    """`function(*args)` in a daemon thread: the tokenizers trainer runs in Rust, where Python cannot
    act on Ctrl-C or SIGTERM until it returns; the main thread waits here and can. It waits on an
    event, not Thread.join: on Python 3.11 a join that a signal interrupts marks the thread stopped
    while it still runs (threading's bpo-45274 branch releases the thread's own lock)."""
    outcome, finished = {}, threading.Event()
    _finished.append(finished)

    def run():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # handed to the main thread
            outcome["error"] = error
        finally:
            finished.set()

    threading.Thread(target=run, daemon=True).start()
    while not finished.wait(0.1):  # wakes to run a handler for a signal that reached another thread
        pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def exit_now_if_trainer_running(code: int):
    """After an interrupt the tokenizers trainer may still run in its thread, and it cannot be
    stopped: finalising the interpreter under it crashes (SIGABRT "FATAL: exception not rethrown"
    or SIGSEGV after the one-line message, as its Rust threads take the GIL), so the process ends
    here, its output already flushed and its clean-up already done."""
    if not all(finished.is_set() for finished in _finished):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    exit_code = run_tool("build_vocab.py", main)
    exit_now_if_trainer_running(exit_code)
    sys.exit(exit_code)
