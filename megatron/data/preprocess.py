"""Loose JSON (one object per line, e.g. wikiextractor output) -> Megatron indexed datasets.

Workers tokenize chunks of lines (`imap` over bounded batches, so output order is input order
and does not depend on the worker count); the main process alone writes. A bad line stops the run with its line
number and removes the partial output, unless `skip_invalid` counts and skips it.
"""
import collections
import contextlib
import itertools
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from megatron.data.indexed_dataset import make_builder
from megatron.data.sentences import sentence_splitter
from megatron.data.tokenizer import build_tokenizer
from megatron.errors import ConfigError, DataError

CHUNK_LINES = 32  # lines per imap task: large enough to hide IPC, small enough to balance


@dataclass
class PreprocessOptions:
    input: str
    output_prefix: str
    vocab_file: str
    json_keys: tuple = ("text",)
    tokenizer_type: str = "BertWordPieceLowerCase"
    split_sentences: bool = False
    keep_newlines: bool = False
    append_eod: bool = False
    dataset_impl: str = "mmap"
    workers: int = 1
    log_interval: int = 100
    skip_invalid: bool = False
    lang: str = "english"


@dataclass
class PreprocessReport:
    documents: int = 0
    skipped: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    outputs: dict = field(default_factory=dict)  # json key -> output prefix


def output_prefix(options: PreprocessOptions, key: str) -> str:
    level = "sentence" if options.split_sentences else "document"
    return f"{options.output_prefix}_{key}_{level}"


class Encoder:
    """Per-process tokenizer and splitter; built by `start()` in each worker, not pickled."""

    def __init__(self, options: PreprocessOptions):
        self.options = options

    def start(self):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # parallelism is the worker count, nothing hidden
        self.tokenizer = build_tokenizer(self.options.tokenizer_type, self.options.vocab_file)
        self.split = (sentence_splitter(self.options.lang, self.options.keep_newlines)
                      if self.options.split_sentences else lambda text: [text])

    def encode(self, numbered_line) -> tuple:
        """(line number, raw bytes) -> (line number, {key: [sentence ids]} or an error string, bytes)."""
        number, raw = numbered_line
        try:
            record = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return number, f"invalid JSON ({error.__class__.__name__}: {error})", len(raw)
        if not isinstance(record, dict):
            return number, "not a JSON object", len(raw)
        documents = {}
        for key in self.options.json_keys:
            if key not in record:
                return number, f"no key {key!r}", len(raw)
            if not isinstance(record[key], str):
                return number, f"key {key!r} is not a string", len(raw)
            sentences = [ids for ids in self.tokenizer.tokenize_batch(self.split(record[key])) if ids]
            if sentences and self.options.append_eod:
                sentences[-1].append(self.tokenizer.eod)
            documents[key] = sentences
        return number, documents, len(raw)


def _numbered_lines(path):
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, 1):
            if raw.strip():
                yield number, raw


def preprocess(options: PreprocessOptions, log=sys.stderr) -> PreprocessReport:
    """Writes one dataset per json key; returns counts. Raises ConfigError/DataError on user errors."""
    if not Path(options.input).is_file():
        raise DataError(f"input file {options.input} does not exist", "pass --input with a loose-JSON file (one object per line)")
    if options.workers < 1:
        raise ConfigError(f"--workers {options.workers} must be >= 1", "pass a positive worker count")
    vocab_size = build_tokenizer(options.tokenizer_type, options.vocab_file).vocab_size
    if options.split_sentences:
        sentence_splitter(options.lang, options.keep_newlines)  # fail now, not in every worker
    created = _missing_folders(Path(options.output_prefix).parent)
    for folder in created:
        folder.mkdir()
    report = PreprocessReport(outputs={key: output_prefix(options, key) for key in options.json_keys})
    builders = {}
    encoded = _encoded(options)
    start = time.perf_counter()
    try:
        for key, prefix in report.outputs.items():
            builders[key] = make_builder(prefix, options.dataset_impl, vocab_size)
        for number, documents, size in encoded:
            report.bytes_read += size
            if isinstance(documents, str):
                if not options.skip_invalid:
                    raise DataError(f"{options.input} line {number}: {documents}",
                                    "fix the line or pass --skip-invalid to skip such lines")
                report.skipped += 1
                continue
            for key, sentences in documents.items():
                if sentences:
                    builders[key].add_document(sentences)
            report.documents += 1
            if options.log_interval and report.documents % options.log_interval == 0:
                _log_progress(report, time.perf_counter() - start, log)
        for key, builder in builders.items():
            if len(builder.doc_idx) == 1:  # only the leading 0: an empty dataset would fail every reader later
                raise DataError(f"{options.input} has no documents with text under the key '{key}' "
                                f"({report.documents} documents read, {report.skipped} skipped)",
                                "pass a non-empty loose-JSON corpus and check --json-keys")
        for builder in builders.values():
            builder.finalize()
    except BaseException:
        encoded.close()  # stops the worker pool now, not when the generator is collected
        for builder in builders.values():
            builder.abort()
        for folder in reversed(created):
            with contextlib.suppress(OSError):  # a folder something else wrote into stays
                folder.rmdir()
        raise
    report.seconds = time.perf_counter() - start
    return report


def _missing_folders(folder: Path) -> list:
    """The folders to create for `folder` to exist, outermost first (removed again on failure)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def _encoded(options: PreprocessOptions):
    """(line number, documents or error, bytes) for every non-blank line, in input order.

    Lines go to the pool in bounded batches, two in flight so workers never wait on the
    writer. On any exit the pool is closed and joined, never terminated: terminating a Pool
    whose task feeder is still reading the input can deadlock (seen here under load).
    """
    encoder = Encoder(options)
    lines = _numbered_lines(options.input)
    if options.workers == 1:
        encoder.start()
        yield from map(encoder.encode, lines)
        return
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    pool = context.Pool(options.workers, initializer=_start_worker, initargs=(encoder,))
    batch_lines = CHUNK_LINES * options.workers * 4
    in_flight = collections.deque()
    try:
        while batch := list(itertools.islice(lines, batch_lines)):
            in_flight.append(pool.imap(_encode_in_worker, batch, CHUNK_LINES))
            if len(in_flight) == 2:
                yield from in_flight.popleft()
        while in_flight:
            yield from in_flight.popleft()
    finally:
        pool.close()
        pool.join()


_WORKER_ENCODER: Encoder | None = None


def _start_worker(encoder: Encoder):
    global _WORKER_ENCODER
    encoder.start()
    _WORKER_ENCODER = encoder


def _encode_in_worker(numbered_line):
    return _WORKER_ENCODER.encode(numbered_line)


def _log_progress(report: PreprocessReport, elapsed: float, log):
    elapsed = max(elapsed, 1e-9)
    print(f"processed {report.documents} documents ({report.documents / elapsed:.1f} docs/s, "
          f"{report.bytes_read / elapsed / 2**20:.2f} MB/s)", file=log, flush=True)
