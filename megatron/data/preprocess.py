"""Corpora (loose JSON such as wikiextractor output, plain, .gz or .zst, or Parquet; one file or a
folder/glob of shards: corpus_files.py reads them) -> Megatron indexed datasets.

Workers tokenize numbered chunks of lines (bounded in flight, reassembled in order, so the output
does not depend on the worker count); the main process alone writes. A bad line stops the run with its line
number and removes the partial output, unless `skip_invalid` counts and skips it. Index maps next
to a prefix it overwrites that were built from the old data are removed.
"""
import contextlib
import itertools
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from megatron import paths
from megatron.data import index_maps
from megatron.data.corpus_files import FORMATS_HELP, Corpus, record_texts
from megatron.data.indexed_dataset import best_fitting_dtype, make_builder
from megatron.data.sentences import sentence_splitter
from megatron.data.tokenizer import build_tokenizer, case_warning, data_identity_path, write_data_identity
from megatron.errors import (ConfigError, DataError, cannot_use, disk_full, ignore_stop_signals_in_child,
                             stop_signals_blocked_for_children)

CHUNK_LINES = 32  # lines per worker task: large enough to hide IPC, small enough to balance
SENTENCE_BATCH = 1024  # sentences tokenized at once: a book-sized document never holds all its encodings
FIRST_LOG_SECONDS, LOG_SECONDS = 2.0, 15.0  # progress by time (no --log-interval): the first line, then every


@dataclass
class PreprocessOptions:
    input: str | tuple  # a file, folder or glob; or several, read in the order given
    output_prefix: str
    vocab_file: str | None = None  # a WordPiece vocab.txt (or tokenizer_file)
    json_keys: tuple = ("text",)
    tokenizer_type: str | None = None  # None: HFTokenizer with tokenizer_file, else BertWordPieceLowerCase
    tokenizer_file: str | None = None  # a Hugging Face tokenizer.json (or its folder)
    split_sentences: bool = False
    keep_newlines: bool = False
    append_eod: bool = False
    dataset_impl: str = "mmap"
    workers: int = 1
    log_interval: int | None = None  # documents between progress lines; None: by time (LOG_SECONDS); 0: none
    skip_invalid: bool = False
    lang: str = "english"


@dataclass
class PreprocessReport:
    documents: int = 0
    skipped: int = 0
    bytes_read: int = 0  # JSON lines as decompressed; of Parquet rows, the text of the --json-keys columns
    input_read: int = 0  # of the input files as stored (compressed), through the last record
    input_total: int = 0  # the input files' size as stored
    seconds: float = 0.0
    outputs: dict = field(default_factory=dict)  # json key -> output prefix
    removed_maps: list = field(default_factory=list)  # index maps of the data the outputs replaced


def output_prefix(options: PreprocessOptions, key: str) -> str:
    level = "sentence" if options.split_sentences else "document"
    return f"{options.output_prefix}_{key}_{level}"


class Encoder:
    """Per-process tokenizer and splitter; built by `start()` in each worker, not pickled."""

    def __init__(self, options: PreprocessOptions):
        self.options = options

    def start(self):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # parallelism is the worker count, nothing hidden
        self.tokenizer = build_tokenizer(self.options.tokenizer_type, self.options.vocab_file,
                                         self.options.tokenizer_file)
        self.split = (sentence_splitter(self.options.lang, self.options.keep_newlines)
                      if self.options.split_sentences else lambda text: [text])
        self.dtype = best_fitting_dtype(self.tokenizer.vocab_size)  # the builder's

    def encode(self, item) -> tuple:
        """(location, a JSON line's bytes or a Parquet row's dict, bytes) -> (location,
        {key: (all token ids, each non-empty sentence's count)} or an error string, bytes)."""
        number, raw, size = item
        texts = record_texts(raw, self.options.json_keys)
        if isinstance(texts, str):
            return number, texts, size
        return number, {key: self.tokenized(text) for key, text in texts.items()}, size

    def tokenized(self, text: str) -> tuple:
        """(ids, sizes) of a document's sentences, as arrays (a few bytes a token, through the queue too),
        tokenized SENTENCE_BATCH sentences at a time; empty sentences dropped, --append-eod's id last."""
        sentences = self.split(text)
        parts = [self.tokenizer.tokenize_flat(sentences[start:start + SENTENCE_BATCH], self.dtype)
                 for start in range(0, len(sentences), SENTENCE_BATCH)]
        ids = np.concatenate([part[0] for part in parts] or [np.zeros(0, self.dtype)])
        sizes = np.concatenate([part[1] for part in parts] or [np.zeros(0, np.int32)])
        sizes = sizes[sizes > 0]
        if sizes.size and self.options.append_eod:
            ids = np.append(ids, np.asarray(self.tokenizer.eod, dtype=self.dtype))
            sizes[-1] += 1
        return ids, sizes


def preprocess(options: PreprocessOptions, log=sys.stderr) -> PreprocessReport:
    """Writes one dataset per json key; returns counts. Raises ConfigError/DataError on user errors."""
    if os.path.basename(options.output_prefix) in ("", ".", ".."):  # `out/`, "": files named `_text_document.bin`
        raise ConfigError(f"--output-prefix {options.output_prefix!r} names a folder",
                          f"add a file name, e.g. {os.path.join(options.output_prefix, 'corpus')}")
    corpus = Corpus(options.input, options.json_keys)
    if corpus.skipped:
        names = ", ".join(Path(name).name for name in corpus.skipped[:3]) + (", ..." if len(corpus.skipped) > 3 else "")
        print(f"note: --input {corpus.input}: left out {len(corpus.skipped)} file(s) without a corpus "
              f"shard's name ({names}); the shards are {FORMATS_HELP}", file=log, flush=True)
    if options.workers < 1:
        raise ConfigError(f"--workers {options.workers} must be >= 1", "pass a positive worker count")
    tokenizer = build_tokenizer(options.tokenizer_type, options.vocab_file, options.tokenizer_file)
    if warning := case_warning(tokenizer, options.tokenizer_type):
        print(f"warning: {warning}", file=log, flush=True)
    vocab_size = tokenizer.vocab_size  # the ids' dtype: uint16 below 65500 tokens, else int32
    if options.split_sentences:
        sentence_splitter(options.lang, options.keep_newlines)  # fail now, not in every worker
    parent = str(Path(options.output_prefix).parent)
    if problem := paths.file_in_the_way(f"--output-prefix {options.output_prefix}: its folder", parent):
        raise ConfigError(problem, "pass an --output-prefix inside a directory")
    created = [Path(made) for made in reversed(paths.missing_folders(parent))]
    try:
        for folder in created:
            folder.mkdir()
    except OSError as error:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise _unwritable(error, options.output_prefix) from None
    report = PreprocessReport(outputs={key: output_prefix(options, key) for key in options.json_keys},
                              input_total=corpus.total_bytes)
    builders = {}
    start = time.perf_counter()
    progress = _Progress(report, start, options.log_interval, log)
    encoded = _encoded(options, corpus, progress.start)
    try:
        for key, prefix in report.outputs.items():
            builders[key] = make_builder(prefix, options.dataset_impl, vocab_size)
        for number, documents, size in encoded:
            report.bytes_read += size
            report.input_read = number[2]
            if isinstance(documents, str):
                if not options.skip_invalid:
                    raise DataError(f"{corpus.where(number)}: {documents}",
                                    "fix the record or pass --skip-invalid to skip such records")
                report.skipped += 1
                continue
            for key, (ids, sizes) in documents.items():
                if sizes.size:
                    builders[key].add_flat_document(ids, sizes)
            report.documents += 1
            progress.document()
        for key, builder in builders.items():
            if len(builder.doc_idx) == 1:  # only the leading 0: an empty dataset would fail every reader later
                raise DataError(f"{corpus.input} has no documents with text under the key '{key}' "
                                f"({report.documents} documents read, {report.skipped} skipped)",
                                "pass a corpus with text and check --json-keys (column names for Parquet)")
        for key, builder in builders.items():
            _replace(builder, tokenizer, report.outputs[key])
    except BaseException as error:
        encoded.close()  # stops the workers now, not when the generator is collected
        for builder in builders.values():  # a finalized one has nothing left to remove
            builder.abort()
        for folder in reversed(created):
            with contextlib.suppress(OSError):  # a folder something else wrote into stays
                folder.rmdir()
        if isinstance(error, OSError) and (error.filename or disk_full(error)):  # a write() names no file
            raise _unwritable(error, options.output_prefix) from None
        raise
    finally:
        progress.stop()
    report.seconds = time.perf_counter() - start
    for prefix in report.outputs.values():  # built from the data just replaced: no run may use them again
        report.removed_maps += index_maps.remove_stale(prefix)
    return report


def _replace(builder, tokenizer, prefix: str) -> None:
    """The dataset at `prefix` and the record of the vocab that made its ids (checked by the trainer)
    change together: the old record goes first, so a failed finalize (a full disk) leaves the data,
    old or new, with no record rather than one naming another vocab; a later key's failure leaves this
    key's new data with its true record."""
    data_identity_path(prefix).unlink(missing_ok=True)
    builder.finalize()
    write_data_identity(tokenizer, prefix)


def _unwritable(error: OSError, prefix: str) -> ConfigError:
    """The line of a failed read or write; a full disk names the output, whose partial files are gone."""
    if full := disk_full(error):
        return ConfigError(f"cannot write --output-prefix {prefix}: {full} ({error.strerror or error})",
                           "free space there or pass an --output-prefix on another disk")
    return cannot_use(error, "check that --input is readable and the --output-prefix folder writable, with free space")


def _encoded(options: PreprocessOptions, corpus: Corpus, started=lambda: None):
    """(location, documents or error, bytes) for every record of the corpus, in input order;
    `started()` is called once the workers run (a thread started before they fork would be copied
    into them mid-print).

    Chunks of lines go to `workers` processes through a task queue, at most 8 per worker in
    flight, and come back numbered, so output order is input order. Workers ignore SIGINT, SIGTERM
    and SIGHUP (a terminal's Ctrl-C, or its closing, reaches the whole process group): the main process alone reacts,
    and when it stops early (a bad line, an interrupt) it kills the workers instead of waiting for
    them: a multiprocessing Pool whose worker died mid-task never finishes joining.
    """
    encoder = Encoder(options)
    lines = corpus.records()
    if options.workers == 1:
        encoder.start()
        started()
        yield from map(encoder.encode, lines)
        return
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    tasks, results = context.Queue(), context.Queue()
    workers, finished = [], False
    try:  # a signal held while they fork is raised as the block ends: the finally ends those started
        with stop_signals_blocked_for_children():
            for _ in range(options.workers):
                worker = context.Process(target=_worker_loop, args=(encoder, tasks, results), daemon=True)
                worker.start()
                workers.append(worker)  # once started: join() refuses a process never started
        started()
        sent = emitted = 0
        ready, more = {}, True
        while True:
            while more and sent - emitted < 8 * options.workers:
                chunk = list(itertools.islice(lines, CHUNK_LINES))
                if not chunk:
                    more = False
                    break
                tasks.put((sent, chunk))
                sent += 1
            if emitted == sent:
                break
            while emitted not in ready:
                number, encoded = _next_result(results, workers)
                ready[number] = encoded
            yield from ready.pop(emitted)
            emitted += 1
        finished = True
    finally:
        if finished:
            for _ in workers:
                tasks.put(None)
        for worker in workers:
            if not finished:
                worker.kill()
            worker.join()
        for queue in (tasks, results):
            queue.cancel_join_thread()  # nothing left to flush to workers that are gone
            queue.close()


def _next_result(results, workers) -> tuple:
    """The next (chunk number, encoded lines) from any worker; a worker that died is an error."""
    while True:
        try:
            number, encoded = results.get(timeout=1.0)
        except queue_module.Empty:
            dead = [worker for worker in workers if not worker.is_alive()]
            if dead and dead[0].exitcode < 0:  # killed by a signal, not a bug here: a traceback would not help
                signum = -dead[0].exitcode
                name = {known.value: known.name for known in signal.Signals}.get(signum, f"signal {signum}")
                raise ConfigError(f"a tokenizing worker was killed by {name}"
                                  + (" (often the out-of-memory killer)" if signum == signal.SIGKILL else ""),
                                  "rerun with fewer --workers, or where more memory is free") from None
            if dead:
                raise RuntimeError(f"a tokenizing worker died (exit code {dead[0].exitcode})") from None
            continue
        if number < 0:
            raise RuntimeError(f"a tokenizing worker failed:\n{encoded}")
        return number, encoded


def _worker_loop(encoder: Encoder, tasks, results) -> None:
    ignore_stop_signals_in_child()
    try:
        encoder.start()
        while (task := tasks.get()) is not None:
            number, chunk = task
            results.put((number, [encoder.encode(line) for line in chunk]))
    except Exception:
        results.put((-1, traceback.format_exc()))


class _Progress:
    """Progress lines: every `every` documents (--log-interval N), none for 0, else by time (the first
    after FIRST_LOG_SECONDS, then every LOG_SECONDS) from a thread, so that a document that takes
    minutes to tokenize still shows the run is alive."""

    def __init__(self, report: PreprocessReport, start: float, every: int | None, log):
        self.report, self.start_time, self.every, self.log = report, start, every, log
        self.stopped, self.thread = threading.Event(), None

    def start(self) -> None:
        if self.every is None:
            self.thread = threading.Thread(target=self._by_time, name="preprocess-progress", daemon=True)
            self.thread.start()

    def document(self) -> None:
        if self.every and self.report.documents % self.every == 0:
            self.print()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()

    def _by_time(self) -> None:
        due = FIRST_LOG_SECONDS
        while not self.stopped.wait(max(0.0, min(1.0, due - self.elapsed()))):
            if self.elapsed() >= due:
                self.print()
                due += LOG_SECONDS

    def elapsed(self) -> float:
        return time.perf_counter() - self.start_time

    def print(self) -> None:
        print(progress_line(self.report, self.elapsed()), file=self.log, flush=True)


def progress_line(report: PreprocessReport, elapsed: float) -> str:
    """'processed N documents (x docs/s, y MB/s): a of b MB of input (p%), ETA t': MB/s of text, the
    input as stored (a compressed shard counts its compressed bytes), the ETA at the rate so far."""
    elapsed = max(elapsed, 1e-9)
    read, total = report.input_read, report.input_total
    line = (f"processed {report.documents} documents ({report.documents / elapsed:.1f} docs/s, "
            f"{report.bytes_read / elapsed / 2**20:.2f} MB/s): {read / 2**20:.1f} of {total / 2**20:.1f} MB of input")
    if not total:
        return line
    line += f" ({100 * read / total:.0f}%)"
    return line + (f", ETA {duration_text(elapsed * (total - read) / read)}" if read else "")


def duration_text(seconds: float) -> str:
    """'12 s', '3 min 05 s', '2 h 07 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
