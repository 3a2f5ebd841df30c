"""tools/preprocess_data.py on corpora as published: `.jsonl.gz`, `.jsonl.zst` (several frames),
Parquet (record batches, other columns present), a folder of shards, a glob of mixed shards: the
same `.bin`/`.idx` bytes as loose JSON of the same text, at 1 and 2 workers; and each way such a
corpus can be broken is one DataError naming the shard, with nothing written."""
import bz2
import gzip
import importlib
import io
import json
import lzma
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from megatron.data import corpus_files
from megatron.data.corpus_files import Corpus
from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.data.vocab_builder import corpus_texts, train_vocab, write_vocab
from megatron.errors import ConfigError, DataError
from test_preprocess import article, file_bytes

preprocess_data = importlib.import_module("preprocess_data")  # tools/, on the path conftest.py sets up

KEYS = ("text", "title")


def jsonl(records) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def write_shard(path: Path, records: list, row_group_size: int = 16) -> Path:
    """`records` in the format the name says: .jsonl, .jsonl.gz, .jsonl.zst (one frame per half, as
    split writers make) or .parquet (string columns of the records plus an int column `length`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = corpus_files.shard_kind(path.name)
    if kind == "parquet":
        table = pa.Table.from_pylist([{**record, "length": len(record["text"] or "")} for record in records])
        pq.write_table(table, path, row_group_size=row_group_size)
    elif kind == "gzip":
        path.write_bytes(gzip.compress(jsonl(records)))
    elif kind == "zstd":
        half = len(records) // 2
        path.write_bytes(b"".join(zstandard.ZstdCompressor().compress(jsonl(part))
                                  for part in (records[:half], records[half:])))
    else:
        path.write_bytes(jsonl(records))
    return path


def shards(folder: Path, names: list, records: list) -> None:
    """`records` cut into len(names) consecutive shards."""
    step = -(-len(records) // len(names))
    for i, name in enumerate(names):
        write_shard(folder / name, records[i * step:(i + 1) * step])


def as_input(layout: str, folder: Path, records: list) -> str:
    """The --input of one corpus layout holding `records`, written under `folder`."""
    if layout == "folder of parquet shards":
        shards(folder / "shards", [f"part-{i:05d}.parquet" for i in range(3)], records)
        (folder / "shards" / "_SUCCESS").write_text("")  # what Spark leaves beside its shards: not a shard
        (folder / "shards" / ".part-00000.parquet.crc").write_bytes(b"\x00crc")
        return str(folder / "shards")
    if layout == "glob of mixed shards":
        shards(folder / "mix", ["part-0.jsonl", "part-1.jsonl.gz", "part-2.jsonl.zst", "part-3.parquet"], records)
        (folder / "mix" / "README.txt").write_text("not a shard: a glob that matches shards leaves it out\n")
        return str(folder / "mix" / "*")
    if layout == "parquet of string_view and dictionary":  # pyarrow's newer string type; a pandas categorical
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.table({"text": pa.array([record["text"] for record in records], pa.string_view()),
                          "title": pa.array([record["title"] for record in records]).dictionary_encode()})
        pq.write_table(table, folder / "wiki.parquet", row_group_size=16)
        return str(folder / "wiki.parquet")
    return str(write_shard(folder / f"wiki.{layout}", records))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(records, vocab, outputs of loose JSON): 120 articles, both keys split into sentences."""
    folder = tmp_path_factory.mktemp("reference")
    records = [article(i) for i in range(120)]
    path = write_shard(folder / "wiki.json", records)
    write_vocab(train_vocab(path, lower_case=True, vocab_size=400), folder / "vocab.txt")
    report = preprocess(options(path, folder / "out" / "wiki", folder / "vocab.txt"))
    return records, folder / "vocab.txt", report.outputs


def options(path, prefix, vocab, **overrides) -> PreprocessOptions:
    spec = path if isinstance(path, tuple) else str(path)  # several --input values stay a tuple
    return PreprocessOptions(**{"input": spec, "output_prefix": str(prefix), "vocab_file": str(vocab),
                                "json_keys": KEYS, "split_sentences": True, "log_interval": 0, **overrides})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout,workers", [("jsonl.gz", 1), ("jsonl.zst", 1), ("parquet", 1),
                                            ("folder of parquet shards", 2), ("glob of mixed shards", 1),
                                            ("parquet of string_view and dictionary", 1)])
def test_every_corpus_format_writes_the_bytes_of_loose_json(reference, tmp_path, monkeypatch, layout, workers):
    records, vocab, expected = reference
    monkeypatch.setattr(corpus_files, "PARQUET_BATCH_ROWS", 10)  # batches that cut across row groups and shards
    corpus = as_input(layout, tmp_path, records)
    report = preprocess(options(corpus, tmp_path / "out" / "wiki", vocab, workers=workers))
    assert (report.documents, report.skipped) == (120, 0)
    for key in KEYS:
        assert file_bytes(report.outputs[key]) == file_bytes(expected[key]), key
    assert report.bytes_read > sum(len(record["text"]) for record in records)
    # tools/build_vocab.py reads the same formats: the texts of loose JSON, in order
    assert list(corpus_texts(Corpus(corpus, KEYS))) == [record[key] for record in records for key in KEYS]


def test_parquet_reads_only_the_asked_columns_in_batches(reference, tmp_path, monkeypatch):
    """No whole-file load: pyarrow is asked for record batches of the --json-keys columns."""
    records, vocab, expected = reference
    path = write_shard(tmp_path / "wiki.parquet", records)
    asked = []
    iter_batches = pq.ParquetFile.iter_batches

    def recording(self, batch_size, columns, **kwargs):
        asked.append((batch_size, tuple(columns)))
        return iter_batches(self, batch_size=batch_size, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    monkeypatch.setattr(pq, "read_table", pytest.fail)
    report = preprocess(options(path, tmp_path / "out" / "wiki", vocab, json_keys=("title",)))
    assert asked == [(corpus_files.PARQUET_BATCH_ROWS, ("title",))]
    assert file_bytes(report.outputs["title"]) == file_bytes(expected["title"])


def nested(tmp: Path, records: list, null_row: int | None = None) -> str:
    """A Parquet file whose texts are the fields of a struct column `doc` (a dataset of nested records),
    beside a top-level int column; `null_row`: that row's struct is null."""
    tmp.mkdir(parents=True, exist_ok=True)
    docs = [None if i == null_row else {"title": record["title"], "text": record["text"], "lang": "en"}
            for i, record in enumerate(records)]
    pq.write_table(pa.table({"id": list(range(len(records))), "doc": docs}), tmp / "wiki.parquet",
                   row_group_size=16)
    return str(tmp / "wiki.parquet")


def test_a_struct_columns_fields_are_read_by_their_flattened_names(reference, tmp_path, monkeypatch):
    """--json-keys doc.text doc.title (pyarrow's flatten() names) read the fields of the struct `doc`:
    the bytes of loose JSON, in batches of those fields alone; build_vocab reads them alike."""
    records, vocab, expected = reference
    monkeypatch.setattr(corpus_files, "PARQUET_BATCH_ROWS", 10)
    path = nested(tmp_path, records)
    keys = ("doc.text", "doc.title")
    report = preprocess(options(path, tmp_path / "out" / "wiki", vocab, json_keys=keys))
    assert (report.documents, report.skipped) == (120, 0)
    for key, flat in zip(keys, KEYS):
        assert file_bytes(report.outputs[key]) == file_bytes(expected[flat]), key
    assert list(corpus_texts(Corpus(path, keys))) == [record[key] for record in records for key in KEYS]
    lines = write_shard(tmp_path / "nested.jsonl", [{"id": i, "doc": {"text": record["text"], "title": record["title"]}}
                                                    for i, record in enumerate(records)])  # JSON lines read alike
    report = preprocess(options(lines, tmp_path / "out" / "lines", vocab, json_keys=keys))
    for key, flat in zip(keys, KEYS):
        assert file_bytes(report.outputs[key]) == file_bytes(expected[flat]), key


def null_text(tmp: Path, records: list) -> str:
    """A Parquet file whose 5th row has no text (null)."""
    return as_input("parquet", tmp, [{**record, "text": None} if i == 4 else record for i, record in enumerate(records)])


def not_utf8_text(tmp: Path, records: list) -> str:
    """A Parquet file whose 5th row's text is Latin-1 bytes: a string column whose writer did not check UTF-8."""
    tmp.mkdir(parents=True, exist_ok=True)
    texts = [b"caf\xe9 au lait." if i == 4 else record["text"].encode() for i, record in enumerate(records)]
    table = pa.table({"title": [record["title"] for record in records],
                      "text": pa.array(texts, pa.binary()).view(pa.string())})
    pq.write_table(table, tmp / "wiki.parquet", row_group_size=16)
    return str(tmp / "wiki.parquet")


def truncated(path: Path) -> str:
    path.write_bytes(path.read_bytes()[:-40])
    return str(path)


def corrupt_page(tmp: Path, records: list) -> str:
    """A shard whose footer reads but whose pages do not (bytes zeroed in a page header of its second
    row group, as a bad disk or an interrupted copy leaves it): pyarrow raises OSError there, not
    an ArrowException."""
    path = Path(as_input("parquet", tmp, records))
    metadata = pq.ParquetFile(path).metadata
    chunk = metadata.row_group(1).column(metadata.schema.names.index("text"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset  # the column chunk's first page header
    data = bytearray(path.read_bytes())
    data[start + 8:start + 24] = bytes(16)
    path.write_bytes(bytes(data))
    return str(path)


def one_shard_not_parquet(tmp: Path, records: list) -> str:
    folder = as_input("folder of parquet shards", tmp, records)
    (tmp / "shards" / "part-00001.parquet").write_bytes(jsonl(records))
    return folder


def gzip_with_bad_line(tmp: Path, records: list) -> str:
    lines = jsonl(records).splitlines(keepends=True)
    lines[2] = b'{"text": \n'
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "wiki.jsonl.gz").write_bytes(gzip.compress(b"".join(lines)))
    return str(tmp / "wiki.jsonl.gz")


def array_in_folder(tmp: Path, records: list) -> str:
    """A folder of JSON-lines shards, one of them a JSON array after a byte order mark and a blank line."""
    shards(tmp / "shards", ["part-0.jsonl", "part-1.json"], records)
    (tmp / "shards" / "part-1.json").write_bytes(b"\xef\xbb\xbf\n" + json.dumps(records[60:]).encode())
    return str(tmp / "shards")


def parquet_bytes(records: list) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), sink)
    return sink.getvalue()


def arrow_bytes(records: list, form: str) -> bytes:
    """`records` as an Arrow IPC file (Feather v2) or stream (a datasets save_to_disk shard)."""
    import pyarrow.ipc

    table, sink = pa.Table.from_pylist(records), io.BytesIO()
    with (pyarrow.ipc.new_file if form == "file" else pyarrow.ipc.new_stream)(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_an_arrow_files_fix_writes_the_parquet_shard_of_loose_json(reference, tmp_path):
    """The command an Arrow file's error gives, run as given, leaves a shard that preprocesses to the bytes of
    loose JSON."""
    records, vocab, expected = reference
    for form in ("file", "stream"):
        path = written("wiki.parquet", lambda records: arrow_bytes(records, form))(tmp_path / form, records)
        with pytest.raises(DataError) as error:
            preprocess(options(path, tmp_path / "out" / form, vocab))
        command = error.value.fix.removeprefix("write it as Parquet: ")
        subprocess.run(command.replace("python -c", f"{shlex.quote(sys.executable)} -c"), shell=True, check=True)
        report = preprocess(options(str(tmp_path / form), tmp_path / "out" / form, vocab))
        assert file_bytes(report.outputs["text"]) == file_bytes(expected["text"])


def tar_bytes(name: str, data: bytes) -> bytes:
    sink = io.BytesIO()
    with tarfile.open(fileobj=sink, mode="w") as archive:
        member = tarfile.TarInfo(name)
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    return sink.getvalue()


# a dataset or model repository cloned without git-lfs holds such a text in place of each large file
LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
               b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n")


def written(name: str, data):
    """A writer of one file `name` holding data(records)."""
    def write(tmp: Path, records: list) -> str:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data(records))
        return str(tmp / name)
    return write


def empty_shard_in_folder(tmp: Path, records: list) -> str:
    """A folder whose second shard is 0 bytes (an interrupted download), which gzip reads as no text."""
    shards(tmp / "shards", ["part-0.jsonl.gz", "part-1.jsonl.gz"], records)
    (tmp / "shards" / "part-1.jsonl.gz").write_bytes(b"")
    return str(tmp / "shards")


def gzip_kept(tmp: Path, records: list) -> str:
    """A folder holding a shard and the copy `gzip -k` leaves beside it."""
    path = write_shard(tmp / "dup" / "wiki.jsonl", records)
    path.with_name("wiki.jsonl.gz").write_bytes(gzip.compress(path.read_bytes()))
    return str(tmp / "dup")


def converted_beside(tmp: Path, records: list) -> tuple:
    """`--input dup/*` unquoted over a JSON shard and the Parquet file converted from it."""
    return tuple(str(write_shard(tmp / "dup" / name, records)) for name in ("wiki.json", "wiki.parquet"))


def keys_disagree(tmp: Path, records: list) -> str:
    """A folder of two exports of one dataset: JSON lines with `text`, Parquet with the text as `content`."""
    shards(tmp / "mk", ["a.jsonl"], records[:60])
    table = pa.Table.from_pylist([{"content": record["text"], "title": record["title"]} for record in records[60:]])
    pq.write_table(table, tmp / "mk" / "b.parquet")
    return str(tmp / "mk")


def hub_download(tmp: Path, records: list, shard_names: list, leftover: str = "") -> str:
    """A dataset folder as a download left it: `records` in the shards named, and a `leftover` file
    (a partial download: its name, relative to the folder; a link's: `name -> target`)."""
    shards(tmp / "hf" / "data", shard_names, records)
    if " -> " in leftover:
        name, target = leftover.split(" -> ")
        (tmp / "hf" / name).symlink_to(target)
    elif leftover:
        (tmp / "hf" / leftover).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "hf" / leftover).write_bytes(b"PAR1 half a shard")
    return str(tmp / "hf")


def arrow_folder(tmp: Path, records: list) -> str:
    """What datasets' DatasetDict.save_to_disk writes: a split folder of .arrow files and JSON metadata."""
    (tmp / "saved" / "train").mkdir(parents=True)
    (tmp / "saved" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (tmp / "saved" / "train" / "state.json").write_text("{}")
    (tmp / "saved" / "train" / "data-00000-of-00001.arrow").write_bytes(b"\xff\xff\xff\xff")
    return str(tmp / "saved")


def parquet_converter(tmp: Path, records: list) -> str:
    """The Hugging Face Parquet converter's layout: a folder per split."""
    shards(tmp / "conv" / "default" / "train", ["0000.parquet"], records[:30])
    shards(tmp / "conv" / "default" / "test", ["0000.parquet"], records[30:])
    return str(tmp / "conv")


HUB_SPLITS = ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet", "validation-00000-of-00001.jsonl",
              "test-00000-of-00001.parquet"]


def expanded_glob(tmp: Path, records: list) -> tuple:
    """`--input hf/data/*` unquoted: the shell passes every split's shards."""
    return tuple(sorted(str(path) for path in (Path(hub_download(tmp, records, HUB_SPLITS)) / "data").iterdir()))


def c4_download(tmp: Path, records: list) -> str:
    """allenai/c4's layout: the split word after the dataset's name, before the shard number."""
    shards(tmp / "c4" / "en", ["c4-train.00000-of-00002.json.gz", "c4-train.00001-of-00002.json.gz",
                               "c4-validation.00000-of-00001.json.gz"], records)
    return str(tmp / "c4")


def split_folders_in_subsets(tmp: Path, records: list) -> str:
    """A split folder in each of several subsets: `wiki/train/`, `books/train/`, `wiki/validation/`."""
    shards(tmp / "mixed", ["wiki/train/a.jsonl", "books/train/b.jsonl", "wiki/validation/c.jsonl"], records)
    return str(tmp / "mixed")


def parquet_cut(tmp: Path, records: list) -> str:
    """A Parquet download cut short: it starts with PAR1, its footer is gone."""
    return str(written("wiki.parquet", lambda records: parquet_bytes(records)[:len(parquet_bytes(records)) // 2])(
        tmp, records))


def parquet_footer_damaged(tmp: Path, records: list) -> str:
    """A Parquet file whole to its last PAR1 whose footer length is garbage."""
    data = bytearray(parquet_bytes(records))
    data[-8:-4] = (len(data) * 2).to_bytes(4, "little")
    return str(written("wiki.parquet", lambda records: bytes(data))(tmp, records))


def description_beside(shard_names: list, description: str) -> object:
    """A writer of a dataset folder `snap`: `records` in the shards named, and a description .json beside them."""
    def write(tmp: Path, records: list) -> str:
        shards(tmp / "snap", shard_names, records)
        (tmp / "snap" / description).write_text(json.dumps({"name": "wiki", "num_rows": len(records)},
                                                           indent=2 if "manifest" in description else None))
        return str(tmp / "snap")
    return write


def fifo(tmp: Path, records: list) -> str:
    """`--input <(zcat wiki.jsonl.gz)`: a pipe."""
    tmp.mkdir(parents=True, exist_ok=True)
    os.mkfifo(tmp / "pipe")
    return str(tmp / "pipe")


def text_of(records: list, encoding: str, compress=lambda data: data, end: str = "\n") -> bytes:
    return compress("".join(json.dumps(record) + end for record in records).encode(encoding))


def glob_of_language_folders(tmp: Path, records: list) -> str:
    """A dataset of one folder of Parquet shards per language beside its README, read with the glob `ds/*`."""
    shards(tmp / "ds" / "en", ["part-0.parquet"], records[:60])
    shards(tmp / "ds" / "de", ["part-0.parquet"], records[60:])
    (tmp / "ds" / "README.md").write_text("# a dataset card\n")
    return str(tmp / "ds" / "*")


def folder_without_shards(tmp: Path, records: list) -> str:
    (tmp / "notes").mkdir(parents=True)
    (tmp / "notes" / "README.md").write_text("the shards are elsewhere")
    return str(tmp / "notes")


BROKEN = {  # id -> (writes the input under a folder from the records and returns --input, json keys, message)
    "parquet_missing_column": (lambda tmp, records: as_input("parquet", tmp, records), ("body",),
                               r"wiki\.parquet has no column 'body' \(it has id, title, text, length\); pass "
                               "--json-keys with column names"),
    "parquet_no_such_field": (nested, ("text",), r"wiki\.parquet has no column 'text' \(it has id, doc\.title, "
                                                r"doc\.text, doc\.lang\); pass --json-keys with column names"),
    "json_text_under_another_key": (written("wiki.jsonl", lambda records: jsonl(
        {"raw_content": record["text"], "meta": {"url": "https://example.org"}} for record in records)), ("text",),
        r"wiki\.jsonl line 1: no key 'text' \(its keys: 'raw_content', 'meta\.url'\); pass --json-keys with the "
        r"key that holds the text"),
    "parquet_column_and_field_of_one_name": (
        written("wiki.parquet", lambda records: parquet_bytes([{"doc.text": "a flat column.",
                                                                  "doc": {"text": "a struct's field."}}])),
        ("doc.text",), r"wiki\.parquet has both a column 'doc\.text' and a field 'text' of the struct column 'doc': "
                       r"--json-keys doc\.text could mean either; rename one"),
    "glob_of_folders": (glob_of_language_folders, KEYS,
                        r"--input '\S+/ds/\*' matches the folders \S+/ds/de, \S+/ds/en and no shard file \(only "
                        r"\S+/ds/README\.md\): a glob reads the files it matches, not what folders hold; pass the "
                        r"folder itself \(--input \S+/ds\) or a glob of its shards \(--input '\S+/ds/\*\*/\*\.parquet'\)$"),
    "parquet_struct_column": (nested, ("doc",), r"wiki\.parquet column 'doc' holds struct<.*>, not text \(its "
                                                r"fields: doc\.title, doc\.text, doc\.lang\); pass --json-keys"),
    "parquet_null_struct": (lambda tmp, records: nested(tmp, records, null_row=4), ("doc.text",),
                            r"wiki\.parquet row 5: key 'doc\.text' is not a string; .*--skip-invalid"),
    "parquet_column_not_text": (lambda tmp, records: as_input("parquet", tmp, records), ("length",),
                                r"wiki\.parquet column 'length' holds int64, not text; pass --json-keys with text"),
    "shard_not_parquet": (one_shard_not_parquet, KEYS,
                          r"part-00001\.parquet is uncompressed JSON text, though its name says Parquet; name it "
                          r"\*\.jsonl, e\.g\. mv /\S+/part-00001\.parquet /\S+/part-00001\.jsonl$"),
    "feather_named_parquet": (written("wiki.parquet", lambda records: arrow_bytes(records, "file")), KEYS,
                              r"wiki\.parquet is an Arrow \(Feather\) file, which is not read; write it as Parquet: mv "
                              r"\S+/wiki\.parquet \S+/wiki\.arrow && python -c \"import .*feather\.read_table"),
    "arrow_stream_named_parquet": (written("wiki.parquet", lambda records: arrow_bytes(records, "stream")), KEYS,
                                   r"wiki\.parquet is an Arrow stream \(as datasets' save_to_disk writes\), which is "
                                   r"not read; write it as Parquet: mv .*ipc\.open_stream"),
    "parquet_garbage": (written("wiki.parquet", lambda records: b"\x00\x01\x02 not a format" * 8), KEYS,
                        r"wiki\.parquet is not a Parquet file \(.*magic bytes.*\); pass Parquet shards"),
    "parquet_empty": (written("wiki.parquet", lambda records: b""), KEYS,
                      r"wiki\.parquet is empty \(0 bytes\), not a complete Parquet file; download or write it again"),
    "parquet_cut_short": (parquet_cut, KEYS, r"wiki\.parquet is a truncated Parquet file: it starts as one, but its "
                                             r"end \(the footer\) is missing, .*; download or copy it again"),
    "parquet_footer_damaged": (parquet_footer_damaged, KEYS, r"wiki\.parquet is a damaged Parquet file: its footer "
                                                             r"cannot be read \(.+\); download or write it again"),
    "gzip_named_parquet": (written("wiki.parquet", lambda records: gzip.compress(jsonl(records))), KEYS,
                           r"wiki\.parquet is gzip-compressed, though its name says Parquet; name it \*\.jsonl\.gz, "
                           r"e\.g\. mv /\S+/wiki\.parquet /\S+/wiki\.jsonl\.gz$"),
    "parquet_corrupt_page": (corrupt_page, KEYS, r"wiki\.parquet row \d+: the Parquet file cannot be read \(.+\); "
                                                 "download or write the shard again"),
    "gzip_truncated": (lambda tmp, records: truncated(write_shard(tmp / "wiki.jsonl.gz", records)), KEYS,
                       r"wiki\.jsonl\.gz is not a readable gzip file \(Compressed file ended.*\); download or "
                       "compress"),
    # compression mislabeled: named for what the first bytes show, not as a damaged download
    "gzip_not_gzip": (lambda tmp, records: str(write_shard(tmp / "wiki.json", records).rename(tmp / "wiki.jsonl.gz")),
                      KEYS, r"wiki\.jsonl\.gz is uncompressed JSON text, though its name says gzip; name it "
                            r"\*\.jsonl, e\.g\. mv /\S+/wiki\.jsonl\.gz /\S+/wiki\.jsonl$"),
    "zstd_not_zstd": (written("wiki.jsonl.zst", lambda records: b"Title\n\nSome text.\n"), KEYS,
                      r"wiki\.jsonl\.zst is uncompressed text, though its name says zstd; name it \*\.jsonl"),
    "gzip_named_zstd": (written("wiki.jsonl.zst", lambda records: gzip.compress(jsonl(records))), KEYS,
                        r"wiki\.jsonl\.zst is gzip-compressed, though its name says zstd; name it \*\.jsonl\.gz, "
                        r"e\.g\. mv /\S+/wiki\.jsonl\.zst /\S+/wiki\.jsonl\.gz$"),
    "zstd_named_gzip": (written("wiki.json.gz", lambda records: zstandard.ZstdCompressor().compress(jsonl(records))),
                        KEYS, r"wiki\.json\.gz is zstd-compressed, though its name says gzip; name it \*\.jsonl\.zst, "
                              r"e\.g\. mv /\S+/wiki\.json\.gz /\S+/wiki\.json\.zst$"),
    "bzip2_named_gzip": (written("wiki.jsonl.gz", lambda records: bz2.compress(jsonl(records))), KEYS,
                         r"wiki\.jsonl\.gz is bzip2-compressed, which is not read; decompress it"),
    "parquet_named_zstd": (written("wiki.jsonl.zst", parquet_bytes), KEYS,
                           r"wiki\.jsonl\.zst is a Parquet file, though its name says zstd; name it \*\.parquet, "
                           r"e\.g\. mv /\S+/wiki\.jsonl\.zst /\S+/wiki\.parquet$"),
    "zstd_truncated": (lambda tmp, records: truncated(write_shard(tmp / "wiki.jsonl.zst", records)), KEYS,
                       r"wiki\.jsonl\.zst is not a readable zstd file \(truncated: the stream ends inside a frame\)"),
    "gzip_empty_in_folder": (empty_shard_in_folder, KEYS, r"part-1\.jsonl\.gz is empty \(0 bytes\), not a complete "
                                                          r"gzip file; download or compress it again"),
    "zstd_empty": (written("wiki.jsonl.zst", lambda records: b""), KEYS,
                   r"wiki\.jsonl\.zst is empty \(0 bytes\), not a complete zstd file"),
    "bzip2_jsonl": (written("w.jsonl.bz2", lambda records: bz2.compress(jsonl(records))), KEYS,
                    r"w\.jsonl\.bz2 is bzip2-compressed, which is not read; decompress it, or recompress it as "
                    r"\.jsonl\.gz or \.jsonl\.zst"),
    # one shard in two formats: every document read twice
    "same_shard_gzip_kept": (gzip_kept, KEYS,
        r"^--input holds /\S+/dup/wiki\.jsonl and /\S+/dup/wiki\.jsonl\.gz, one shard in two formats \(as gzip -k or "
        r"zstd -k leaves it\): both read, every document would count twice; remove one of them, or pass a quoted glob "
        r"of one format \(--input '/\S+/dup/\*\.jsonl\.gz'\)$"),
    "same_shard_converted": (converted_beside, KEYS, r"^--input holds /\S+/dup/wiki\.json and /\S+/dup/wiki\.parquet, "
                                                     r"one shard in two formats: both read, .*'/\S+/dup/\*\.parquet'"),
    # shards that name the text differently: whichever key is passed, one of them lacks it
    "keys_disagree_parquet_lacks": (keys_disagree, KEYS,
        r"^--input /\S+/mk: its shards disagree on 'text': /\S+/mk/b\.parquet has no column 'text' \(it has content, "
        r"title\), but /\S+/mk/a\.jsonl has it; preprocess them apart, a quoted glob each \(--input "
        r"'/\S+/mk/\*\.jsonl' and --input '/\S+/mk/\*\.parquet'\), each with its own --json-keys, or rename the "
        r"column or key so that every shard has 'text'$"),
    "keys_disagree_json_lacks": (keys_disagree, ("content",),
        r"^--input /\S+/mk: its shards disagree on 'content': /\S+/mk/a\.jsonl has no key 'content' in its first "
        r"records \(their keys: id, title, text\), but /\S+/mk/b\.parquet has it; preprocess them apart, a quoted glob "
        r"each \(--input '/\S+/mk/\*\.parquet' and --input '/\S+/mk/\*\.jsonl'\)"),
    "empty_glob": (lambda tmp, records: str(tmp / "nowhere" / "*.parquet"), KEYS,
                   r"--input .*nowhere/\*\.parquet matches no files; check the pattern"),
    "folder_without_shards": (folder_without_shards, KEYS, r"input folder .*notes holds no corpus shards"),
    "parquet_null_text": (null_text, KEYS, r"wiki\.parquet row 5: key 'text' is not a string; .*--skip-invalid"),
    "parquet_not_utf8": (not_utf8_text, KEYS, r"wiki\.parquet row 5: key 'text' is not valid UTF-8 \(byte 0xe9 at "
                                              r"byte 4\); .*--skip-invalid"),
    "bad_line_in_gzip": (gzip_with_bad_line, KEYS, r"wiki\.jsonl\.gz line 3: invalid JSON"),
    "parquet_git_lfs_pointer": (written("wiki.parquet", lambda records: LFS_POINTER), KEYS,
                                r"wiki\.parquet is a Git LFS pointer, not the file; run git lfs pull in /"),
    "gzip_git_lfs_pointer": (written("wiki.jsonl.gz", lambda records: LFS_POINTER), KEYS,
                             r"wiki\.jsonl\.gz is a Git LFS pointer, not the file; run git lfs pull in /"),
    "parquet_named_jsonl": (lambda tmp, records: str(Path(as_input("parquet", tmp, records)).rename(tmp / "w.jsonl")),
                            KEYS, r"w\.jsonl is a Parquet file, though its name says JSON lines; name it \*\.parquet, "
                                  r"e\.g\. mv /\S+/w\.jsonl /\S+/w\.parquet$"),
    # JSON lines saved as UTF-16 / UTF-32 (Windows "Unicode"): refused before reading, --skip-invalid or not
    "utf16_jsonl": (written("wiki.jsonl", lambda records: text_of(records, "utf-16")), KEYS,
                    r"wiki\.jsonl is UTF-16 text, not UTF-8 \(JSON lines are read as UTF-8\); convert it, e\.g\. "
                    r"iconv -f UTF-16 -t UTF-8 /\S+/wiki\.jsonl > /\S+/wiki\.utf8\.jsonl$"),
    "utf16le_gzip": (written("wiki.jsonl.gz", lambda records: text_of(records, "utf-16-le", gzip.compress)), KEYS,
                     r"wiki\.jsonl\.gz is UTF-16LE text without a byte-order mark, not UTF-8 .*; convert it, e\.g\. "
                     r"zcat /\S+/wiki\.jsonl\.gz \| iconv -f UTF-16LE -t UTF-8 \| gzip > /\S+/wiki\.utf8\.jsonl\.gz$"),
    "utf32_zstd": (written("wiki.jsonl.zst", lambda records: text_of(records, "utf-32", zstandard.ZstdCompressor(
                   ).compress)), KEYS, r"wiki\.jsonl\.zst is UTF-32 text, not UTF-8 .*; convert it, e\.g\. zstd -dc "
                                       r"/\S+/wiki\.jsonl\.zst \| iconv -f UTF-32 -t UTF-8 \| zstd > /\S+/wiki\.utf8"),
    "utf16be_named_gzip": (written("wiki.jsonl.gz", lambda records: text_of(records, "utf-16-be")), KEYS,
                           r"wiki\.jsonl\.gz is uncompressed JSON text, though its name says gzip"),
    # JSON lines written in a way the reading would take for other lines
    "trailing_commas": (written("wiki.jsonl", lambda records: text_of(records, "utf-8", end=",\n")), KEYS,
                        r"wiki\.jsonl ends its first line with a comma after the object: JSON lines hold one object "
                        r"a line, with nothing between them; remove the commas, e\.g\. sed 's/,\[\[:space:\]\]\*\$//' "
                        r"/\S+/wiki\.jsonl > /\S+/wiki\.lines\.jsonl$"),
    "cr_line_ends": (written("wiki.jsonl", lambda records: text_of(records, "utf-8", end="\r")), KEYS,
                     r"wiki\.jsonl ends its lines with CR alone \(classic Mac line ends\), so it reads as one line; "
                     r"convert them to LF, e\.g\. tr '\\r' '\\n' < /\S+/wiki\.jsonl > /\S+/wiki\.lf\.jsonl$"),
    "cr_line_ends_gzip": (written("wiki.jsonl.gz", lambda records: text_of(records, "utf-8", gzip.compress, "\r")),
                          KEYS, r"wiki\.jsonl\.gz ends its lines with CR alone .*; convert them to LF, e\.g\. zcat "
                                r"/\S+/wiki\.jsonl\.gz \| tr '\\r' '\\n' \| gzip > /\S+/wiki\.lf\.jsonl\.gz$"),
    # a dataset's description .json beside its shards, which a folder reads as a shard
    "description_beside_parquet": (description_beside(["data/train-00000-of-00001.parquet"], "stats.json"), KEYS,
                                   r"snap/stats\.json is one JSON object without 'text' or 'title' \(a dataset's "
                                   r"description, not a corpus shard\) beside 1 Parquet shard, and --input reads it "
                                   r"as a shard; pass the shards as a quoted glob, e\.g\. --input "
                                   r"'/\S+/snap/data/\*\.parquet', or move it away from the shards$"),
    "manifest_beside_jsonl": (description_beside(["part-0.jsonl", "sub/part-1.jsonl"], "manifest.json"), KEYS,
                              r"snap/manifest\.json is one JSON object .* beside 2 JSON-lines shards, .*--input "
                              r"'/\S+/snap/\*\*/\*\.jsonl', or move it"),
    "description_beside_mixed": (description_beside(["a.jsonl", "b.parquet"], "info.json"), KEYS,
                                 r"info\.json is one JSON object .* beside 2 shards, and --input reads it as a shard; "
                                 r"move it away from the shards$"),
    # --input a pipe: each shard is read twice
    "input_pipe": (fifo, KEYS, r"--input /\S+/pipe is a pipe \(as <\(\.\.\.\) and a piped /dev/stdin are\), which "
                               r"is not read: each shard is read twice .*; write it to a file and pass that"),
    "input_stdin": (lambda tmp, records: "-", KEYS, r"^--input - is standard input, which is not read"),
    # a dataset whose download stopped part-way: not a smaller corpus without a word
    "download_unfinished": (lambda tmp, records: hub_download(tmp, records, ["train-00000-of-00002.parquet"],
                                                              "data/train-00001-of-00002.parquet.incomplete"), KEYS,
                            r"hf/data/train-00001-of-00002\.parquet\.incomplete is a download that has not finished: "
                            r"--input .*hf would read as a smaller corpus; finish the download"),
    "download_unfinished_in_a_glob": (lambda tmp, records: hub_download(tmp, records, ["part-0.parquet"],
                                                                        "data/part-1.parquet.part") + "/data/*.parquet",
                                      KEYS, r"part-1\.parquet\.part is a download that has not finished"),
    "download_unfinished_hub_local_dir": (lambda tmp, records: hub_download(
        tmp, records, ["train-00000-of-00001.parquet"], ".cache/huggingface/download/data/Zm9v.3c2a.incomplete"), KEYS,
        r"Zm9v\.3c2a\.incomplete is a download that has not finished"),
    "shard_missing": (lambda tmp, records: hub_download(
        tmp, records, ["train-00000-of-00003.parquet", "train-00002-of-00003.parquet"]), KEYS,
        r"input folder .*hf lacks .*hf/data/train-00001-of-00003\.parquet: 2 of its 3 train-\*-of-00003 shards are "
        r"there; download the dataset again, or pass a glob of the shards to read \('.*hf/data/train-\*'\)"),
    "shard_link_to_nothing": (lambda tmp, records: hub_download(tmp, records, ["a.parquet"],
                                                                "data/b.parquet -> ../../blobs/9f86d081"), KEYS,
                              r"b\.parquet in --input .*hf is a link to \.\./\.\./blobs/9f86d081, which does not exist; "
                              r"copy the dataset with its files \(cp -rL\)"),
    "parquet_gzipped": (written("w.parquet.gz", lambda records: gzip.compress(parquet_bytes(records))), KEYS,
                        r"w\.parquet\.gz is a gzip-compressed Parquet file, which is not read; decompress it \(gunzip\) "
                        r"and pass the \.parquet file"),
    "parquet_zstd": (written("w.parquet.zst", lambda records: zstandard.ZstdCompressor().compress(parquet_bytes(records))),
                     KEYS, r"w\.parquet\.zst is a zstd-compressed Parquet file, which is not read; decompress it "
                           r"\(zstd -d\)"),
    "tar_gzipped": (written("w.tar.gz", lambda records: gzip.compress(tar_bytes("w.jsonl", jsonl(records)))), KEYS,
                    r"w\.tar\.gz is a gzip-compressed tar archive, which is not read; extract it \(tar -xf\)"),
    # one JSON document, not JSON lines: every line would be a bad record (and --skip-invalid skip them all)
    "json_array": (written("wiki.json", lambda records: json.dumps(records).encode()), KEYS,
                   r"wiki\.json is one JSON array, not JSON lines \(one object per line\); convert it, e\.g\. "
                   r"jq -c '\.\[\]' /\S+/wiki\.json > /\S+/wiki\.jsonl$"),
    "json_array_indented_gzip": (written("wiki.json.gz", lambda records: gzip.compress(
        json.dumps(records, indent=2).encode())), KEYS,
        r"wiki\.json\.gz is one JSON array, .*; convert it, e\.g\. zcat /\S+/wiki\.json\.gz \| jq -c '\.\[\]' \| "
        r"gzip > /\S+/wiki\.jsonl\.gz$"),
    "json_indented_objects_zstd": (written("wiki.jsonl.zst", lambda records: zstandard.ZstdCompressor().compress(
        "".join(json.dumps(record, indent=2) + "\n" for record in records).encode())), KEYS,
        r"wiki\.jsonl\.zst is indented JSON \(an object over several lines\), not JSON lines \(one object per line\); "
        r"convert it, e\.g\. zstd -dc /\S+/wiki\.jsonl\.zst \| jq -c \. \| zstd > /\S+/wiki\.lines\.jsonl\.zst$"),
    "json_array_in_folder": (array_in_folder, KEYS, r"shards/part-1\.json is one JSON array, not JSON lines"),
    # no JSON at all: --skip-invalid would skip every line, then find no documents
    "plain_text": (written("wiki.txt", lambda records: "".join(r["text"] + "\n" for r in records).encode()), KEYS,
                   r"wiki\.txt is plain text, not JSON lines \(one object per line\); convert it \(one document a "
                   r"line\), e\.g\. jq -R -c '\{\"text\": \.\}' /\S+/wiki\.txt > /\S+/wiki\.jsonl$"),
    "plain_text_gzip_named_jsonl": (written("wiki.jsonl.gz", lambda records: gzip.compress(b"Title\n\nSome text.\n")),
                                    KEYS, r"wiki\.jsonl\.gz is plain text, .*zcat /\S+/wiki\.jsonl\.gz \| jq -R -c "
                                          r"'\{\"text\": \.\}' \| gzip > /\S+/wiki\.lines\.jsonl\.gz$"),
    "csv": (written("wiki.csv", lambda records: b"id,text\n1,Some text.\n"), KEYS,
            r"wiki\.csv is CSV, not JSON lines \(one object per line\); convert it to Parquet and pass --json-keys "
            r"with its text column, e\.g\. python -c \"import pandas; pandas\.read_csv\('/\S+/wiki\.csv'\)"
            r"\.to_parquet\('/\S+/wiki\.parquet'\)\"$"),
    "arrow_file": (written("data-00000-of-00001.arrow", lambda records: arrow_bytes(records, "stream")), KEYS,
                   r"data-00000-of-00001\.arrow is an Arrow stream \(as datasets' save_to_disk writes\), which is not "
                   r"read; write it as Parquet: python -c \"import .*ipc\.open_stream\('\S+/data-00000-of-00001\.arrow'\)"
                   r"\.read_all\(\), '\S+/data-00000-of-00001\.parquet'\)\"$"),
    "arrow_folder": (arrow_folder, KEYS, r"input folder /\S+/saved is a Hugging Face save_to_disk folder \(Arrow "
                                         r"files\), which is not read; write it as Parquet, e\.g\. python -c \"import "
                                         r"datasets; datasets\.load_from_disk\('/\S+/saved'\)\['train'\]\.to_parquet"),
    # a Hugging Face dataset with its held-out splits: read whole, they would be trained on
    "hub_splits": (lambda tmp, records: hub_download(tmp, records, HUB_SPLITS), KEYS,
        r"input folder /\S+/hf holds the splits train \(2 shards\), validation \(1\), test \(1\): read whole, "
        r"the held-out splits would be trained on; pass the one to read as a quoted glob, e\.g\. --input "
        r"'/\S+/hf/data/train-\*'$"),
    "parquet_converter_splits": (parquet_converter, KEYS,
                                 r"input folder /\S+/conv holds the splits train \(1 shard\), test \(1\): .*"
                                 r"--input '/\S+/conv/default/train/\*'$"),
    "hub_splits_expanded_glob": (expanded_glob, KEYS, r"^the 4 --input values hold the splits train \(2 shards\), "
                                                      r"validation \(1\), test \(1\): read whole, .*--input "
                                                      r"'/\S+/hf/data/train-\*'$"),
    "hub_splits_quoted_glob": (lambda tmp, records: hub_download(tmp, records, HUB_SPLITS) + "/*/*", KEYS,
                               r"^--input '/\S+/hf/\*/\*' matches the splits train \(2 shards\), validation \(1\), "
                               r"test \(1\): .*--input '/\S+/hf/data/train-\*'$"),
    "c4_splits": (c4_download, KEYS, r"input folder /\S+/c4 holds the splits train \(2 shards\), validation \(1\): "
                                     r".*--input '/\S+/c4/en/c4-train\.\*'$"),
    "split_folders_in_subsets": (split_folders_in_subsets, KEYS,  # the glob reads both train folders
                                 r"holds the splits train \(2 shards\), validation \(1\): .*--input "
                                 r"'/\S+/mixed/\*\*/train/\*\*/\*'$"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_corpus_is_one_line_naming_the_shard_and_leaves_nothing(reference, tmp_path, case):
    records, vocab, _ = reference
    write, keys, pattern = BROKEN[case]
    spec = write(tmp_path, records)
    with pytest.raises(DataError) as error:
        preprocess(options(spec, tmp_path / "out" / "wiki", vocab, json_keys=keys, workers=2))
    assert re.search(pattern, str(error.value)) and "\n" not in str(error.value), str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("write", [null_text, not_utf8_text])
def test_skip_invalid_skips_a_bad_parquet_row(reference, tmp_path, write):
    records, vocab, _ = reference
    report = preprocess(options(write(tmp_path, records), tmp_path / "out" / "wiki", vocab, skip_invalid=True))
    assert (report.documents, report.skipped) == (119, 1)


def test_a_corpus_of_one_document_per_json_file_skips_one_without_text(reference, tmp_path):
    """Among .json shards only (one document a file), a file without the key is a bad record, which
    --skip-invalid skips; not a dataset's description beside the shards (that refusal needs shards of
    another kind)."""
    records, vocab, _ = reference
    folder = tmp_path / "docs"
    folder.mkdir()
    for number, record in enumerate(records[:3]):
        (folder / f"doc{number}.json").write_text(json.dumps(record))
    (folder / "doc3.json").write_text(json.dumps({"id": 3, "url": "https://example.org/3"}))
    with pytest.raises(DataError, match=r"doc3\.json line 1: no key 'text'.*--skip-invalid"):
        preprocess(options(str(folder), tmp_path / "out" / "wiki", vocab))
    report = preprocess(options(str(folder), tmp_path / "out" / "wiki", vocab, skip_invalid=True))
    assert (report.documents, report.skipped) == (3, 1)


def test_one_json_document_is_refused_before_reading_even_with_skip_invalid(reference, tmp_path):
    """--skip-invalid would skip every line of a JSON array: the file is refused when the corpus is
    opened, before a worker starts or an output is made."""
    records, vocab, _ = reference
    spec = written("wiki.json", lambda records: json.dumps(records, indent=1).encode())(tmp_path, records)
    with pytest.raises(DataError, match="is one JSON array, not JSON lines"):
        Corpus(spec, KEYS)
    with pytest.raises(DataError, match="is one JSON array, not JSON lines"):
        preprocess(options(spec, tmp_path / "out" / "wiki", vocab, skip_invalid=True, workers=2))
    assert not (tmp_path / "out").exists()


FIXED_BY_THE_COMMAND_NAMED = ["utf16_jsonl", "utf16le_gzip", "utf32_zstd", "trailing_commas", "cr_line_ends",
                              "cr_line_ends_gzip", "gzip_not_gzip", "gzip_named_zstd", "zstd_named_gzip",
                              "gzip_named_parquet", "parquet_named_zstd"]


@pytest.mark.parametrize("case", FIXED_BY_THE_COMMAND_NAMED)
def test_the_command_a_refusal_names_makes_the_corpus_read_as_it_should(reference, tmp_path, case):
    """Run as the line gives it (`iconv ...`, `sed ...`, `tr ...`, `mv ...`), the fix gives the bytes of the same
    records as loose JSON; refused up front, with --skip-invalid too, and by build_vocab.py the same way."""
    records, vocab, expected = reference
    write, keys, _ = BROKEN[case]
    spec = write(tmp_path / "corpus", records)
    with pytest.raises(DataError) as refused:
        preprocess(options(spec, tmp_path / "out" / "wiki", vocab, skip_invalid=True))
    with pytest.raises(DataError, match=re.escape(str(refused.value))):
        train_vocab(Path(spec), lower_case=True, vocab_size=400)
    command = str(refused.value).rpartition("e.g. ")[2]
    tools = [shlex.split(step)[0] for step in command.split(" | ")]
    if missing := [tool for tool in tools if not shutil.which(tool)]:
        pytest.skip(f"{', '.join(missing)} not installed")
    subprocess.run(["bash", "-c", command], check=True)
    report = preprocess(options(shlex.split(command)[-1], tmp_path / "out" / "wiki", vocab))
    for key in KEYS:
        assert file_bytes(report.outputs[key]) == file_bytes(expected[key]), key


@pytest.mark.parametrize("case", ["description_beside_parquet", "manifest_beside_jsonl", "same_shard_gzip_kept",
                                  "same_shard_converted"])
def test_the_glob_a_description_refusal_suggests_reads_the_shards(reference, tmp_path, case):
    records, vocab, expected = reference
    with pytest.raises(DataError) as refused:
        Corpus(BROKEN[case][0](tmp_path, records), KEYS)
    suggested = re.search(r"--input '(\S+)'", str(refused.value))[1]
    report = preprocess(options(suggested, tmp_path / "out" / "wiki", vocab))
    assert (report.documents, report.skipped) == (len(records), 0)


@pytest.mark.parametrize("name,data", [
    ("one_record.json", b'{"text": "One article.", "title": "One"}'),  # a shard of one record, with text
    ("extra.json", b'{"text": "a"}\n{"text": "b"}\n'),  # JSON lines named .json
    ("crlf.jsonl", b'{"text": "a"}\r\n{"text": "b"}\r\n'), ("bom.jsonl", b'\xef\xbb\xbf{"text": "a"}\n'),
    ("lone_cr.jsonl", b'{"text": "a"}\r'), ("comma_in_text.jsonl", b'{"text": "a,"}\n{"text": "b"}\n'),
    ("sub/part-0.jsonl.gz", gzip.compress(b'{"text": "a"}\n', mtime=0)),  # the same name in another folder
    ("part-00.jsonl.gz", gzip.compress(b'{"text": "a"}\n', mtime=0)),
    ("no_text.jsonl", b'{"body": "a"}\n'),  # one record without the key: a bad record (--skip-invalid), not a shard
    ("nested.jsonl", b'{"text": {"en": "a"}}\n{"text": {"en": "b"}}\n')])  # that disagrees: named when read
def test_a_shard_like_a_refused_one_is_read(reference, tmp_path, name, data):
    """What the refusals of a description, CR line ends, trailing commas, a shard in two formats and shards that
    disagree on the key must not catch."""
    records, _, _ = reference
    shards(tmp_path / "ds", ["part-0.jsonl"], records[:3])
    (tmp_path / "ds" / name).parent.mkdir(exist_ok=True)
    (tmp_path / "ds" / name).write_bytes(data)
    found = Corpus(str(tmp_path / "ds"), ("text",)).shards
    assert sorted(os.path.relpath(shard.path, tmp_path / "ds") for shard in found) == sorted(["part-0.jsonl", name])


def test_the_globs_a_key_disagreement_suggests_read_each_kind_of_shard(reference, tmp_path):
    """Each glob of the refusal, with its own --json-keys, reads its shards."""
    records, vocab, _ = reference
    with pytest.raises(DataError) as refused:
        Corpus(keys_disagree(tmp_path, records), KEYS)
    holding, others = re.findall(r"--input '(\S+)'", str(refused.value))
    assert preprocess(options(holding, tmp_path / "out" / "a", vocab)).documents == 60
    assert preprocess(options(others, tmp_path / "out" / "b", vocab, json_keys=("content", "title"))).documents == 60


def test_an_empty_json_lines_shard_among_others_is_named_in_one_warning(reference, tmp_path):
    """A 0-byte .jsonl beside other shards (a download that stopped before its first byte, or a writer with
    nothing to write) reads as no documents, and is named; a 0-byte .gz / .zst / .parquet is refused (BROKEN)."""
    records, vocab, expected = reference
    shards(tmp_path / "ds", ["part-0.jsonl"], records)
    (tmp_path / "ds" / "part-1.jsonl").write_bytes(b"")
    (tmp_path / "ds" / "part-2.jsonl.gz").write_bytes(gzip.compress(b""))  # a whole gzip file of no text: not named
    log = io.StringIO()
    report = preprocess(options(tmp_path / "ds", tmp_path / "out" / "wiki", vocab), log=log)
    for key in KEYS:
        assert file_bytes(report.outputs[key]) == file_bytes(expected[key]), key
    (warning,) = [line for line in log.getvalue().splitlines() if "0 bytes" in line]
    assert re.fullmatch(r"warning: --input \S+/ds: \S+/ds/part-1\.jsonl is empty \(0 bytes\), read as no documents; "
                        r"if a download or write stopped, write it again, else remove it", warning), warning


@pytest.mark.parametrize("head,encoding", [
    ('{"text": "a"}\n'.encode("utf-16-le"), ("UTF-16LE", False)), ('{"t": 1}'.encode("utf-32-be"), ("UTF-32BE", False)),
    ("\ufeff[1]".encode("utf-16-be"), ("UTF-16", True)), ('{"text": "中文"}'.encode("utf-16-le"), ("UTF-16LE", False)),
    (b'{"text": "caf\xe9"}\n\x00\xff\xfe', None), (b'{"text": "a"}\n', None), (b"\x00\x01binary", None)],
    ids=["utf16le", "utf32be", "utf16_marked", "utf16le_cjk", "latin1_then_nul", "utf8", "binary"])
def test_wide_text_is_told_by_its_mark_or_its_nul_bytes(head, encoding):
    assert corpus_files._wide_encoding(head) == encoding


@pytest.mark.parametrize("head,kind", [
    (b'[{"text": "a"}, {"text": "b"}]', "array"), (b'\n[\n  {\n', "array"), (b'[{"text": "a"},\n{"text": "b"}]\n', "array"),
    (b'{\n  "text": "a"\n}\n', "indented"), (b'{"text": "a",\n "title": "b"}\n', "indented"),
    (b'{"text": "a"}\n{"text": "b"}\n', None), (b'["a", "b"]\n["c"]\n', None),  # JSON lines: records named one by one
    (b'{"text": \n{"text": "b"}\n', None), (b'{"text": "a very long line cut by the head', None)])
def test_one_json_document_is_told_from_json_lines_by_its_head(head, kind):
    assert corpus_files._one_document(head) == kind


def test_a_dataset_snapshot_folder_reads_its_shards_and_notes_files_it_leaves_out(reference, tmp_path):
    """A Hugging Face dataset snapshot: dataset_infos.json (metadata, not a record) and a README beside
    data/*.parquet; and a shard in a compression that is not read (.jsonl.xz), named, not dropped silently."""
    records, vocab, expected = reference
    shards(tmp_path / "hf" / "data", ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"], records)
    (tmp_path / "hf" / "dataset_infos.json").write_text(json.dumps({"default": {"features": {"text": {}}}}))
    (tmp_path / "hf" / "README.md").write_text("---\nlicense: cc-by-sa-4.0\n---\n")
    (tmp_path / "hf" / "data" / "extra.jsonl.xz").write_bytes(lzma.compress(jsonl(records[:3])))
    log = io.StringIO()
    report = preprocess(options(tmp_path / "hf", tmp_path / "out" / "wiki", vocab), log=log)
    for key in KEYS:
        assert file_bytes(report.outputs[key]) == file_bytes(expected[key]), key
    assert "left out 1 file(s) without a corpus shard's name (extra.jsonl.xz)" in log.getvalue(), log.getvalue()


def test_a_glob_reads_the_numbered_shards_it_matches(reference, tmp_path):
    """The way to read some of a dataset's numbered shards (a folder missing one is refused): a glob."""
    records, vocab, _ = reference
    folder = hub_download(tmp_path, records[:80], ["train-00000-of-00003.parquet", "train-00002-of-00003.parquet"])
    report = preprocess(options(f"{folder}/data/train-*", tmp_path / "out" / "wiki", vocab))
    assert report.documents == 80


def test_one_split_of_a_dataset_folder_is_read_whole(reference, tmp_path):
    """A folder of one split's shards (and a glob of one split of several) is a corpus, not refused."""
    records, vocab, _ = reference
    folder = hub_download(tmp_path, records, ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet",
                                              "test-00000-of-00001.parquet"])
    (Path(folder) / "data" / "test-00000-of-00001.parquet").rename(Path(folder) / "test.parquet")
    assert len(Corpus(f"{folder}/data", KEYS).shards) == 2
    assert preprocess(options(f"{folder}/data", tmp_path / "out" / "wiki", vocab)).documents == 80


@pytest.mark.parametrize("names,splits", [
    (["train.jsonl", "training_extra.jsonl"], None), (["train.jsonl", "test_utils.jsonl", "latest.jsonl"], None),
    (["val/a.jsonl", "validation-00000-of-00001.jsonl", "dev.jsonl"], None),  # one split by three names
    (["dev/a.jsonl", "test/b.jsonl"], "validation (1 shard), test (1)"),
    (["training.jsonl.gz", "testing.jsonl.gz"], "train (1 shard), test (1)"),
    (["default/partial-train/0000.parquet", "default/test/0000.parquet"], "train (1 shard), test (1)"),
    (["wiki_train.jsonl", "wiki_eval.jsonl"], "train (1 shard), validation (1)")])
def test_split_names_are_counted_as_their_split(reference, tmp_path, names, splits):
    """Synonyms are one split (training, train; val, dev, validation); a split word is one before the
    suffix or a shard number, so `test_utils.jsonl` is no test split."""
    records, _, _ = reference
    shards(tmp_path / "ds", names, records[:12])
    if splits is None:
        assert len(Corpus(str(tmp_path / "ds"), KEYS).shards) == len(names)
    else:
        with pytest.raises(DataError, match=rf"holds the splits {re.escape(splits)}: read whole"):
            Corpus(str(tmp_path / "ds"), KEYS)


def test_the_glob_a_split_refusal_suggests_reads_that_split(reference, tmp_path):
    """Copied from the line, the suggested glob reads every shard of the split, and only those."""
    records, _, _ = reference
    writers = (c4_download, split_folders_in_subsets, lambda tmp, records: hub_download(tmp, records, HUB_SPLITS))
    for number, write in enumerate(writers):
        with pytest.raises(DataError) as error:
            Corpus(write(tmp_path / str(number), records), KEYS)
        suggested = re.search(r"--input '(\S+)'$", str(error.value))[1]
        assert len(Corpus(suggested, KEYS).shards) == 2, (suggested, str(error.value))


def test_a_save_to_disk_folder_named_dot_is_refused_in_one_line(reference, tmp_path, monkeypatch):
    """`--input .` inside the split folder: the Parquet file suggested is named from the folder's own name."""
    records, _, _ = reference
    monkeypatch.chdir(Path(arrow_folder(tmp_path, records)) / "train")
    with pytest.raises(DataError, match=rf"is not read; .*load_from_disk\('\.'\)\.to_parquet\("
                                        rf"'{re.escape(str(tmp_path))}/saved/train\.parquet'\)\"$"):
        Corpus(".", KEYS)


def test_a_stray_first_line_of_json_lines_is_one_bad_record(reference, tmp_path):
    """A header line (or a damaged first record) before JSON lines is not plain text: --skip-invalid
    skips it; without, it is named as line 1."""
    records, vocab, _ = reference
    spec = written("wiki.jsonl", lambda records: b"# exported 2026-11-27\n" + jsonl(records))(tmp_path, records)
    report = preprocess(options(spec, tmp_path / "out" / "wiki", vocab, skip_invalid=True))
    assert (report.documents, report.skipped) == (120, 1)
    with pytest.raises(DataError, match=r"wiki\.jsonl line 1: invalid JSON"):
        preprocess(options(spec, tmp_path / "out2" / "wiki", vocab))


def test_several_inputs_read_in_the_order_given_as_the_shell_expands_a_glob(reference, tmp_path):
    """`--input data/*.parquet` unquoted: the shell passes every shard; they are read in the order given,
    and give the bytes of the same records in one file. One --input stays one string."""
    records, vocab, expected = reference
    names = ["part-0.parquet", "part-1.jsonl.gz", "part-2.jsonl"]
    shards(tmp_path / "mix", names, records)
    argv = ["--vocab-file", str(vocab), "--split-sentences", "--json-keys", *KEYS, "--log-interval", "0",
            "--output-prefix", str(tmp_path / "out" / "wiki"), "--input"]
    parsed = preprocess_data.parse_args([*argv, *(str(tmp_path / "mix" / name) for name in names)])
    assert parsed.input == tuple(str(tmp_path / "mix" / name) for name in names)
    report = preprocess(parsed)
    for key in KEYS:
        assert file_bytes(report.outputs[key]) == file_bytes(expected[key]), key
    assert preprocess_data.parse_args([*argv, str(tmp_path / "mix")]).input == str(tmp_path / "mix")
    assert Corpus(parsed.input, KEYS).input == f"{tmp_path / 'mix' / names[0]} and 2 more"  # not a 1,000-shard line
    with pytest.raises(DataError, match=r"--input names \S+part-0\.parquet twice \(.*\); pass each shard once"):
        Corpus((str(tmp_path / "mix"), str(tmp_path / "mix" / "part-0.parquet")), KEYS)


def test_json_keys_named_twice_are_refused(reference, tmp_path):
    """`--json-keys text text` tokenized the text twice into one output (twice the MB reported)."""
    records, vocab, _ = reference
    with pytest.raises(ConfigError, match=r"^--json-keys text title text names 'text' twice; name each key once"):
        preprocess(options(write_shard(tmp_path / "wiki.json", records), tmp_path / "out" / "wiki", vocab,
                           json_keys=("text", "title", "text")))
    assert not (tmp_path / "out").exists()


def broken_corpus(case: str):
    """A setup for the bad-input catalogue (tests/test_bad_inputs.py): writes BROKEN[case]'s input
    from the valid sample corpus to `{tmp}/corpus/` (it names the --input on the command line)."""
    def setup(tmp: Path, assets: dict):
        records = [json.loads(line) for line in Path(assets["corpus"]).read_text().splitlines()[:40]]
        BROKEN[case][0](tmp / "corpus", records)
    return setup
