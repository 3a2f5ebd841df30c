"""Corpora (loose JSON such as wikiextractor output, plain, .gz or .zst, or Parquet; one file or a
folder/glob of shards: corpus_files.py reads them) -> Megatron indexed datasets.

Workers tokenize numbered chunks of lines (bounded in flight, reassembled in order, so the output
does not depend on the worker count); the main process alone writes. A bad line stops the run with its line
number and removes the partial output, unless `skip_invalid` counts and skips it; so does text the
tokenizer cannot encode (no unknown token), and an error no check foresaw (EncodingCrashed, naming the
record). Special tokens spelled out in the text are encoded as text. Index maps next to a prefix it
overwrites that were built from the old data are removed.
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
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from megatron import locks, paths
from megatron.data import index_maps
from megatron.data.corpus_files import Corpus, MissingKey, record_texts
from megatron.data.indexed_dataset import best_fitting_dtype, lock_file_path, make_builder
from megatron.data.sentences import sentence_splitter
from megatron.data.shard_discovery import FORMATS_HELP
from megatron.data.tokenizer import build_tokenizer, case_warning
from megatron.data.tokenizer_identity import data_identity
from megatron.data.workers import workers_beyond_cpus
from megatron.errors import (ConfigError, DataError, cannot_use, disk_full, ignore_stop_signals_in_child,
                             stop_signals_blocked_for_children)

CHUNK_LINES = 32  # lines per worker task: large enough to hide IPC, small enough to balance
SENTENCE_BATCH = 1024  # sentences tokenized at once: a book-sized document never holds all its encodings
FIRST_LOG_SECONDS, LOG_SECONDS = 2.0, 15.0  # progress by time (no --log-interval): the first line, then every
RATE_SAMPLE_SECONDS = 2.0  # progress lines give rates and an ETA once the work done since the first document spans this
DEFAULT_LANG = "english"  # --split-sentences' Punkt model without --lang
# a warning above this share of [UNK] in a dataset: a vocab made for the text writes next to none (the default
# vocab, 0 of the 385k tokens of its corpus); 1% is a word lost every few sentences; the lower-case default vocab
# under BertWordPieceCase writes 6%, an English vocab on Greek, Russian or Chinese text 90%
UNKNOWN_SHARE_WARNED = 0.01


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
    lang: str | None = None  # --split-sentences' Punkt language (None: DEFAULT_LANG); refused without it
    debug: bool = False  # preprocess_data.py --debug: an EncodingCrashed's traceback is printed


@dataclass
class PreprocessReport:
    documents: int = 0
    skipped: int = 0
    empty: int = 0  # documents with no text (whitespace) under any key: counted in documents, nothing written
    bytes_read: int = 0  # JSON lines as decompressed; of Parquet rows, the text of the --json-keys columns
    input_read: int = 0  # of the input files as stored (compressed), through the last record
    input_total: int = 0  # the input files' size as stored
    seconds: float = 0.0
    outputs: dict = field(default_factory=dict)  # json key -> output prefix
    removed_maps: list = field(default_factory=list)  # index maps of the data the outputs replaced
    tokens: dict = field(default_factory=dict)  # json key -> tokens written
    unknown: dict = field(default_factory=dict)  # json key -> of those, the tokenizer's unknown token ([UNK])


class EncodingCrashed(RuntimeError):
    """An error no check foresaw while tokenizing (a bug here or in a library), or a worker that exited: one
    line naming the record where known; `trace` is the traceback where it happened (in a worker: printed by
    preprocess_data.py --debug, as the main process's own traceback would not show it)."""

    def __init__(self, problem: str, fix: str = "rerun with --debug for its traceback, and report it", trace: str = ""):
        super().__init__(f"{problem}; {fix}")
        self.trace = trace


@dataclass
class _Crash:
    """An exception no check foresaw, raised while encoding: its first line and its traceback, sent from a worker."""
    summary: str
    trace: str

    @classmethod
    def caught(cls, error: BaseException) -> "_Crash":
        first = (str(error).splitlines() or [""])[0]
        return cls(f"{type(error).__name__}: {first}" if first else type(error).__name__, traceback.format_exc())


def output_prefix(options: PreprocessOptions, key: str) -> str:
    level = "sentence" if options.split_sentences else "document"
    return f"{options.output_prefix}_{key}_{level}"


class Encoder:
    """Per-process tokenizer and splitter; built by `start()` in each worker, not pickled."""

    def __init__(self, options: PreprocessOptions):
        self.options = options
        # on_part(start, end, bytes, fraction): a document of several sentence batches is `fraction` tokenized;
        # it lies between `start` and `end` in the input as stored (the records before it in this process end
        # at `start`), `bytes` as decompressed (Corpus.records)
        self.on_part, self.previous_end, self.record = None, 0, None

    def start(self):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # parallelism is the worker count, nothing hidden
        self.tokenizer = build_tokenizer(self.options.tokenizer_type, self.options.vocab_file,
                                         self.options.tokenizer_file)
        self.tokenizer.read_specials_as_text()  # `<mask>` in a corpus is text; the samples place the special ids
        self.split = (sentence_splitter(self.options.lang or DEFAULT_LANG, self.options.keep_newlines)
                      if self.options.split_sentences else lambda text: [text])
        self.dtype = best_fitting_dtype(self.tokenizer.vocab_size)  # the builder's

    def encode(self, item) -> tuple:
        """(location, a JSON line's bytes or a Parquet row's dict, bytes) -> (location,
        {key: (all token ids, each non-empty sentence's count)} or an error string (a bad record), a DataError
        (text the tokenizer cannot encode) or a _Crash (an error no check foresaw), bytes): a worker's error
        comes back with the record's location, which the main process names."""
        number, raw, size = item
        self.record, self.previous_end = (self.previous_end, number[2], size), number[2]
        texts = record_texts(raw, self.options.json_keys)
        if isinstance(texts, str):
            return number, texts, size
        try:
            return number, {key: self.tokenized(text) for key, text in texts.items()}, size
        except ConfigError as error:
            return number, error, size
        except Exception as error:
            return number, _Crash.caught(error), size

    def tokenized(self, text: str) -> tuple:
        """(ids, sizes) of a document's sentences, as arrays (a few bytes a token, through the queue too),
        tokenized SENTENCE_BATCH sentences at a time; empty sentences dropped, --append-eod's id last."""
        sentences, parts, done = self.split(text), [], 0
        for start in range(0, len(sentences), SENTENCE_BATCH):
            batch = sentences[start:start + SENTENCE_BATCH]
            parts.append(self.tokenizer.tokenize_flat(batch, self.dtype))
            done += sum(map(len, batch))
            if self.on_part and start + SENTENCE_BATCH < len(sentences):  # the progress within a long document
                self.on_part(*self.record, min(1.0, done / len(text)))
        ids = np.concatenate([part[0] for part in parts] or [np.zeros(0, self.dtype)])
        sizes = np.concatenate([part[1] for part in parts] or [np.zeros(0, np.int32)])
        sizes = sizes[sizes > 0]
        if sizes.size and self.options.append_eod:
            ids = np.append(ids, np.asarray(self.tokenizer.eod, dtype=self.dtype))
            sizes[-1] += 1
        return ids, sizes


def preprocess(options: PreprocessOptions, log=sys.stderr) -> PreprocessReport:
    """Writes one dataset per json key; returns counts. Raises ConfigError/DataError on user errors,
    EncodingCrashed on one no check foresaw."""
    _check_options(options, log)
    corpus = Corpus(options.input, options.json_keys)
    if corpus.skipped:
        names = ", ".join(Path(name).name for name in corpus.skipped[:3]) + (", ..." if len(corpus.skipped) > 3 else "")
        print(f"note: --input {corpus.input}: left out {len(corpus.skipped)} file(s) without a corpus "
              f"shard's name ({names}); the shards are {FORMATS_HELP}", file=log, flush=True)
    if corpus.empty and len(corpus.shards) > 1:  # one shard of 0 bytes: refused below, as no documents
        shown = ", ".join(corpus.empty[:3]) + (f" and {len(corpus.empty) - 3} more" if len(corpus.empty) > 3 else "")
        one = len(corpus.empty) == 1
        print(f"warning: --input {corpus.input}: {shown} {'is' if one else 'are'} empty (0 bytes), read as no "
              f"documents; if a download or write stopped, write {'it' if one else 'them'} again, else remove "
              f"{'it' if one else 'them'}", file=log, flush=True)
    tokenizer = build_tokenizer(options.tokenizer_type, options.vocab_file, options.tokenizer_file)
    if warning := case_warning(tokenizer, options.tokenizer_type):
        print(f"warning: {warning}", file=log, flush=True)
    vocab_size = tokenizer.vocab_size  # the ids' dtype: uint16 below 65500 tokens, else int32
    if options.split_sentences:
        sentence_splitter(options.lang or DEFAULT_LANG, options.keep_newlines)  # fail now, not in every worker
    if options.append_eod:
        print(f"warning: --append-eod appends {tokenizer.convert_ids_to_tokens([tokenizer.eod])[0]} (BERT has no "
              "end-of-document token) to every document: the BERT samples add their own, so this one sits inside "
              "them as text; drop --append-eod (a GPT flag) for data pretrain_bert.py trains on", file=log, flush=True)
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
        raise _unwritable(error, options.output_prefix, f"cannot make its folder {error.filename}") from None
    report = PreprocessReport(outputs={key: output_prefix(options, key) for key in options.json_keys},
                              input_total=corpus.total_bytes, tokens=dict.fromkeys(options.json_keys, 0),
                              unknown=dict.fromkeys(options.json_keys, 0))
    builders = {}
    start = time.perf_counter()
    progress = _Progress(report, start, options.log_interval, log)
    encoded = _encoded(options, corpus, progress.start, progress.part)
    try:
        for key, prefix in report.outputs.items():
            _lock_output(options.output_prefix, prefix)
            builders[key] = make_builder(prefix, options.dataset_impl, vocab_size)
        for number, documents, size in encoded:
            report.bytes_read += size
            report.input_read = number[2]
            if isinstance(documents, MissingKey) and not report.documents + report.skipped:
                raise DataError(f"{corpus.where(number)}: {documents}", "pass --json-keys with the key that holds the "
                                "text (a nested one as doc.text)")
            if isinstance(documents, str):
                if not options.skip_invalid:
                    raise DataError(f"{corpus.where(number)}: {documents}",
                                    "fix the record or pass --skip-invalid to skip such records")
                report.skipped += 1
                continue
            if isinstance(documents, ConfigError):  # the tokenizer's: no --skip-invalid, the tokenizer is to fix
                raise DataError(f"{corpus.where(number)}: {documents.problem}", documents.fix)
            if isinstance(documents, _Crash):
                raise EncodingCrashed(f"tokenizing {corpus.where(number)} failed ({documents.summary}), an error no "
                                      "check foresaw", trace=documents.trace)
            for key, (ids, sizes) in documents.items():
                if sizes.size:
                    builders[key].add_flat_document(ids, sizes)
                    _count_tokens(report, key, ids, tokenizer.unknown_id)
            report.documents += 1
            report.empty += not any(sizes.size for _, sizes in documents.values())
            progress.document()
        for key, builder in builders.items():
            if len(builder.doc_idx) == 1:  # only the leading 0: an empty dataset would fail every reader later
                raise DataError(f"{corpus.input} has no documents with text under the key '{key}' "
                                f"({report.documents} documents read, {report.skipped} skipped)",
                                "pass a corpus with text and check --json-keys (column names for Parquet)")
        for key, builder in builders.items():  # every key's files written before any replaces an old dataset
            builder.stage(data_identity(tokenizer, report.outputs[key]))
        for builder in builders.values():
            builder.publish()
    except BaseException as error:
        encoded.close()  # stops the workers now, not when the generator is collected
        for builder in builders.values():  # a published one has nothing left to remove
            builder.abort()
        _unlock_outputs(report)
        for folder in reversed(created):
            with contextlib.suppress(OSError):  # a folder something else wrote into stays
                folder.rmdir()
        if isinstance(error, OSError) and (error.filename or disk_full(error)):  # a write() names no file
            raise _unwritable(error, options.output_prefix) from None
        raise
    finally:
        progress.stop()
        _unlock_outputs(report)
    report.seconds = time.perf_counter() - start
    _warn_of_unknown_tokens(report, tokenizer, log)
    if not options.split_sentences:  # after the data is written: an error stays the one line of a failed run
        print(f"warning: {unsplit_warning(list(report.outputs.values()))}", file=log, flush=True)
    for prefix in report.outputs.values():  # built from the data just replaced: no run may use them again
        report.removed_maps += index_maps.remove_stale(prefix)
    return report


def unsplit_warning(written: list) -> str:
    """The line of a run without --split-sentences (Megatron's GPT habit) that wrote the datasets `written`: each
    document is one item, and pretrain_bert.py's sampler (bert_dataset.skip_rule) takes documents of 2+ sentences,
    none of them overlong (over max(512, the sample) tokens), so it refuses the data (no samples) or leaves most
    of it out, a round trip later than this line."""
    return (f"{', '.join(written)} holds each document as one sentence (no --split-sentences): pretrain_bert.py's "
            "samples need documents of 2+ sentences (1 with --bert-no-binary-head), no sentence overlong, so it "
            "skips most documents or finds no sample; preprocess with --split-sentences for BERT data")


def _check_options(options: PreprocessOptions, log) -> None:
    """Flag values that cannot mean what was asked, refused before any file is read: an --output-prefix naming a
    folder or the files it would write, options read only with --split-sentences, a --log-interval or --workers
    out of range (above the CPUs: one warning line)."""
    if os.path.basename(options.output_prefix) in ("", ".", ".."):  # `out/`, "": files named `_text_document.bin`
        raise ConfigError(f"--output-prefix {options.output_prefix!r} names a folder",
                          f"add a file name, e.g. {os.path.join(options.output_prefix, 'corpus')}")
    _refuse_dataset_name(options)
    if not options.split_sentences:
        for flag, given in (("--keep-newlines", options.keep_newlines), (f"--lang {options.lang}", options.lang)):
            if given:
                raise ConfigError(f"{flag} is read only with --split-sentences (it sets how sentences are split), "
                                  "and the documents are not split", f"add --split-sentences, or drop {flag}")
    if options.log_interval is not None and options.log_interval < 0:
        raise ConfigError(f"--log-interval {options.log_interval} must be >= 0",
                          "pass N for a line every N documents, 0 for none, or leave it out for a line every 15 s")
    if options.workers < 1:
        raise ConfigError(f"--workers {options.workers} must be >= 1", "pass a positive worker count")
    too_many = workers_beyond_cpus("--workers", options.workers, "each would fork with a tokenizer of its own and "
                                   "tokenize no faster")
    if too_many:
        print(f"warning: {too_many}: the workers share them and tokenize no faster; fewer are as fast", file=log,
              flush=True)


def _lock_output(output_prefix: str, prefix: str) -> None:
    """Takes `prefix`.lock for the job writing that dataset: a second job into it (a requeued job while the
    first still runs, two users of one folder) would truncate the first's staging files and finalize a .bin
    the first still writes into; a run meeting the staging files tells a live writer from a killed one."""
    path = lock_file_path(prefix)
    folder = os.path.dirname(path) or "."
    problem = locks.take_lock(folder, (), "--output-prefix", os.path.basename(path),
                              named=f"--output-prefix {output_prefix} ({prefix}.bin/.idx)",
                              fix="pass an --output-prefix in a folder this user can write")
    if problem and "a live run" in problem[0]:
        problem = (problem[0].replace("a live run", "a live preprocess_data.py"),
                   "wait for that preprocess to finish (or stop it), or pass another --output-prefix")
    if problem:
        raise ConfigError(*problem)


def _unlock_outputs(report: PreprocessReport) -> None:
    """Gives back the outputs' locks this job took (before the folders it made are removed: they are in them)."""
    locks.release_lock(*(os.path.basename(lock_file_path(prefix)) for prefix in report.outputs.values()))


def _refuse_dataset_name(options: PreprocessOptions) -> None:
    """An --output-prefix that ends as the files it names do (`.bin`/`.idx`, `_text_document`, ...), as a
    --data-path or a file name would: the suffixes would be added again (`wiki.bin_text_document.bin`)."""
    prefix = options.output_prefix
    endings = [".bin", ".idx", *(f"_{key}_{level}" for key in options.json_keys for level in ("sentence", "document"))]
    stem = prefix
    while ending := next((ending for ending in endings if stem.endswith(ending) and stem != ending), None):
        stem = stem.removesuffix(ending)
    if stem == prefix:
        return
    if os.path.basename(stem) in ("", ".", ".."):
        stem = os.path.join(stem, "corpus")
    key = options.json_keys[0]
    raise ConfigError(f"--output-prefix {prefix} would write {output_prefix(options, key)}.bin/.idx: preprocessing "
                      f"adds the _{key}_{'sentence' if options.split_sentences else 'document'} and .bin/.idx itself",
                      f"pass --output-prefix {stem} (it writes "
                      f"{output_prefix(replace(options, output_prefix=stem), key)}.bin/.idx)")


def _count_tokens(report: PreprocessReport, key: str, ids: np.ndarray, unknown_id: int | None) -> None:
    report.tokens[key] += ids.size
    if unknown_id is not None:
        report.unknown[key] += int(np.count_nonzero(ids == unknown_id))


def _warn_of_unknown_tokens(report: PreprocessReport, tokenizer, log) -> None:
    """One warning line for each dataset of which more than UNKNOWN_SHARE_WARNED is the unknown token: a vocab
    that cannot spell the text (another language, another case), which the model would learn as [UNK]s."""
    for key, tokens in report.tokens.items():
        share = report.unknown[key] / max(tokens, 1)
        if share > UNKNOWN_SHARE_WARNED:
            unknown = tokenizer.convert_ids_to_tokens([tokenizer.unknown_id])[0]
            print(f"warning: {share:.1%} of the {tokens} tokens written to {report.outputs[key]} are {unknown}, the "
                  f"unknown token (a vocab made for the text writes under {UNKNOWN_SHARE_WARNED:.0%}): the vocab "
                  f"{tokenizer.file} does not fit this text; build one for it with "
                  f"{paths.in_repository('tools/build_vocab.py')}, or pass the tokenizer made for its language",
                  file=log, flush=True)


def _unwritable(error: OSError, prefix: str, folder_problem: str | None = None) -> ConfigError:
    """The line of a failed read or write; a full disk names the output, whose partial files are gone.
    `folder_problem`: what the failure says of the output's folder (it cannot be made, or written: a read-only
    mount), named with --output-prefix in place of the file the system names."""
    if full := disk_full(error):
        return ConfigError(f"cannot write --output-prefix {prefix}: {full} ({error.strerror or error})",
                           "free space there or pass an --output-prefix on another disk")
    if folder_problem:
        return ConfigError(f"--output-prefix {prefix}: {folder_problem} ({error.strerror or error})",
                           "pass an --output-prefix in a folder this user can write")
    return cannot_use(error, "check that --input is readable and the --output-prefix folder writable, with free space")


def _encoded(options: PreprocessOptions, corpus: Corpus, started=lambda: None, on_part=None):
    """(location, documents or error, bytes) for every record of the corpus, in input order;
    `started()` is called once the workers run (a thread started before they fork would be copied
    into them mid-print); `on_part` as Encoder.on_part, for the next record to come out only.

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
        encoder.on_part = on_part
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
                if number != PART:
                    ready[number] = encoded
                elif encoded[0] == emitted and on_part:  # how far the chunk waited for is
                    on_part(*encoded[1:])
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
    """The next (chunk number, encoded lines) from any worker, or (PART, (chunk number, *Encoder.on_part's
    arguments)); a worker that died is an error."""
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
                raise EncodingCrashed(f"a tokenizing worker exited with code {dead[0].exitcode}, an error no check "
                                      "foresaw (what it printed, if anything, is above)",
                                      "rerun with --workers 1 to see the record it stopped at") from None
            continue
        if number == PART:
            return number, encoded
        if number < 0 and isinstance(encoded, ConfigError):
            raise encoded
        if number < 0:
            raise EncodingCrashed(f"a tokenizing worker failed ({encoded.summary}), an error no check foresaw",
                                  trace=encoded.trace)
        return number, encoded


PART = -2  # a worker's message of its progress within a long document (_next_result)


def _worker_loop(encoder: Encoder, tasks, results) -> None:
    ignore_stop_signals_in_child()
    try:
        encoder.start()
        while (task := tasks.get()) is not None:
            number, chunk = task
            encoder.on_part = lambda *where, chunk_number=number: results.put((PART, (chunk_number, *where)))
            results.put((number, [encoder.encode(line) for line in chunk]))
    except ConfigError as error:  # pickled whole: the main process's one line
        results.put((-1, error))
    except Exception as error:
        results.put((-1, _Crash.caught(error)))


class _Progress:
    """Progress lines: every `every` documents (--log-interval N), none for 0, else by time (the first
    after FIRST_LOG_SECONDS, then every LOG_SECONDS) from a thread, so that a document that takes
    minutes to tokenize still shows the run is alive, and how far it is (part). The rates and the ETA
    count from the first document (or part of one) done, not from the start: the workers' start-up (a
    tokenizer and a Punkt model each, seconds) made the first ETA ten times too long."""

    def __init__(self, report: PreprocessReport, start: float, every: int | None, log):
        self.report, self.start_time, self.every, self.log = report, start, every, log
        self.stopped, self.thread = threading.Event(), None
        self.first = None  # (time, the counts then) once the first document, or part of one, is done
        self.partial = (0, 0, 0)  # of a long document being tokenized: (its end, the input and bytes done of it)

    def start(self) -> None:
        if self.every is None:
            self.thread = threading.Thread(target=self._by_time, name="preprocess-progress", daemon=True)
            self.thread.start()

    def document(self) -> None:
        self._sample()
        if self.every and self.report.documents % self.every == 0:
            self.print()

    def part(self, start: int, end: int, size: int, fraction: float) -> None:
        """Encoder.on_part of the next record to come out: the records before it have come out (their
        input is report.input_read), so it starts there."""
        begin = max(start, self.report.input_read)
        self.partial = (end, begin + fraction * (end - begin), fraction * size)
        self._sample()

    def current(self) -> PreprocessReport:
        """The report with the part done of a long document that has not come out yet."""
        end, read, size = self.partial
        if end <= self.report.input_read:  # it came out since (or there was none)
            return self.report
        return replace(self.report, bytes_read=self.report.bytes_read + size,
                       input_read=max(self.report.input_read, read))

    def _sample(self) -> None:
        if self.first is None:
            self.first = (time.perf_counter(), replace(self.current()))  # a copy: the report goes on counting

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
        first = self.first  # set by the main thread meanwhile
        sampled = first and time.perf_counter() - first[0]
        rated = (sampled, first[1]) if sampled and sampled >= RATE_SAMPLE_SECONDS else (None, None)
        print(progress_line(self.current(), *rated), file=self.log, flush=True)


def progress_line(report: PreprocessReport, elapsed: float | None, base: PreprocessReport | None = None) -> str:
    """'processed N documents (x docs/s, y MB/s): a of b MB of input (p%), ETA t': the rates over the `elapsed`
    seconds since the counts were `base` (None: 0; `elapsed` None: no rates yet, nor an ETA), MB/s of the records
    as decompressed (bytes_read), the input as stored (a compressed shard counts its compressed bytes), the ETA
    at the rate the input went."""
    base = base or PreprocessReport()
    read, total = report.input_read, report.input_total
    rates = (f" ({(report.documents - base.documents) / elapsed:.1f} docs/s, "
             f"{(report.bytes_read - base.bytes_read) / elapsed / 2**20:.2f} MB/s)" if elapsed else "")
    line = f"processed {report.documents} documents{rates}: {read / 2**20:.1f} of {total / 2**20:.1f} MB of input"
    if not total:
        return line
    line += f" ({100 * read / total:.0f}%)"
    done = read - base.input_read
    return line + (f", ETA {duration_text(elapsed * (total - read) / done)}" if elapsed and done > 0 else "")


def duration_text(seconds: float) -> str:
    """'12 s', '3 min 05 s', '2 h 07 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
