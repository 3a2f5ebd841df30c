"""Indexed datasets: round trips of all three formats, byte-level headers, files written by an
independent writer that follows Megatron's spec, and one-line errors for damaged files."""
import struct
from pathlib import Path

import numpy as np
import pytest

from megatron.data.bert_dataset import parse_data_path
from megatron.data.indexed_dataset import (IndexedCachedDataset, IndexedDataset, MMapIndexedDataset,
                                           best_fitting_dtype, make_builder, make_dataset)
from megatron.errors import DataError

# Three documents: 2, 1 and 3 items (sentences), one of them empty.
DOCUMENTS = [[[5, 6, 7], [8]], [[9, 10, 11, 12]], [[], [13, 14], [65000, 1, 2]]]


def write_dataset(prefix, impl, documents=DOCUMENTS, vocab_size=65000):
    with make_builder(prefix, impl, vocab_size) as builder:
        for document in documents:
            builder.add_document(document)
    return str(prefix)


def items(documents=DOCUMENTS):
    return [item for document in documents for item in document]


@pytest.mark.parametrize("impl", ["mmap", "cached", "lazy"])
def test_round_trip(tmp_path, impl):
    prefix = write_dataset(tmp_path / "d", impl)
    dataset = make_dataset(prefix, impl)
    assert len(dataset) == 6
    assert [dataset[i].tolist() for i in range(len(dataset))] == items()
    assert dataset.sizes.tolist() == [len(item) for item in items()]
    assert dataset.doc_idx.tolist() == [0, 2, 3, 6]
    assert dataset.get(5, offset=1).tolist() == [1, 2]
    assert dataset.get(-6, offset=1, length=2).tolist() == [6, 7]
    assert [a.tolist() for a in dataset[4:6]] == items()[4:6]
    with pytest.raises(IndexError):
        dataset.get(3, offset=3, length=2)
    with pytest.raises(IndexError):
        dataset[6]


def test_infer_picks_the_reader_from_the_magic(tmp_path):
    assert isinstance(make_dataset(write_dataset(tmp_path / "m", "mmap")), MMapIndexedDataset)
    assert type(make_dataset(write_dataset(tmp_path / "t", "lazy"))) is IndexedDataset
    assert isinstance(make_dataset(write_dataset(tmp_path / "c", "cached"), "cached"), IndexedCachedDataset)


def test_token_dtype_follows_megatron_vocab_rule():
    assert best_fitting_dtype(30522) == np.uint16
    assert best_fitting_dtype(65499) == np.uint16
    assert best_fitting_dtype(65500) == np.int32


def test_mmap_bytes_match_the_spec(tmp_path):
    write_dataset(tmp_path / "d", "mmap")
    idx = (tmp_path / "d.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<Q", idx[9:17]) == (1,)
    assert struct.unpack("<B", idx[17:18]) == (8,)  # uint16
    count, doc_count = struct.unpack("<QQ", idx[18:34])
    assert (count, doc_count) == (6, 4)
    sizes = np.frombuffer(idx, np.int32, count, 34)
    pointers = np.frombuffer(idx, np.int64, count, 34 + 4 * count)
    doc_idx = np.frombuffer(idx, np.int64, doc_count, 34 + 12 * count)
    assert sizes.tolist() == [3, 1, 4, 0, 2, 3]
    assert pointers.tolist() == [0, 6, 8, 16, 16, 20]  # bytes, 2 per uint16 token
    assert doc_idx.tolist() == [0, 2, 3, 6]
    assert len(idx) == 34 + 12 * count + 8 * doc_count
    assert np.frombuffer((tmp_path / "d.bin").read_bytes(), np.uint16).tolist() == sum(items(), [])


@pytest.mark.parametrize("impl", ["cached", "lazy"])
def test_tntidx_bytes_match_the_spec(tmp_path, impl):
    write_dataset(tmp_path / "d", impl, vocab_size=70000)
    idx = (tmp_path / "d.idx").read_bytes()
    assert idx[:8] == b"TNTIDX\x00\x00"
    version, code, element_size, count, sizes_count, doc_count = struct.unpack("<QQQQQQ", idx[8:56])
    assert (version, code, element_size, count, sizes_count, doc_count) == (1, 4, 4, 6, 6, 4)
    longs = np.frombuffer(idx, np.int64, offset=56)
    assert longs[:7].tolist() == list(range(7))  # dim_offsets
    assert longs[7:14].tolist() == [0, 3, 4, 8, 8, 10, 13]  # data_offsets in elements
    assert longs[14:20].tolist() == [3, 1, 4, 0, 2, 3]
    assert longs[20:].tolist() == [0, 2, 3, 6]
    assert np.frombuffer((tmp_path / "d.bin").read_bytes(), np.int32).tolist() == sum(items(), [])


def independent_mmap(prefix, sentences, doc_idx, dtype, code):
    """A writer made from the spec alone, as Megatron's MMapIndexedDatasetBuilder lays files out."""
    sizes = np.array([len(s) for s in sentences], np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * np.dtype(dtype).itemsize]).astype(np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for s in sentences:
            f.write(np.array(s, dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)) + struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes() + pointers.tobytes() + np.array(doc_idx, np.int64).tobytes())


def independent_tntidx(prefix, sentences, doc_idx, dtype, code):
    """Megatron's IndexedDatasetBuilder layout: int64 dim/data offsets, sizes, doc_idx."""
    sizes = [len(s) for s in sentences]
    with open(f"{prefix}.bin", "wb") as f:
        for s in sentences:
            f.write(np.array(s, dtype).tobytes())
    data_offsets = np.concatenate([[0], np.cumsum(sizes)])
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"TNTIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<QQ", code, np.dtype(dtype).itemsize))
        f.write(struct.pack("<QQ", len(sizes), len(sizes)) + struct.pack("<Q", len(doc_idx)))
        for longs in (np.arange(len(sizes) + 1), data_offsets, sizes, doc_idx):
            f.write(np.asarray(longs, np.int64).tobytes())


@pytest.mark.parametrize("dtype,code", [(np.uint16, 8), (np.int32, 4), (np.int64, 5)])
@pytest.mark.parametrize("writer,impls", [(independent_mmap, ["mmap"]), (independent_tntidx, ["lazy", "cached"])])
def test_reads_files_from_an_independent_writer(tmp_path, dtype, code, writer, impls):
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 30000, rng.integers(0, 20)).tolist() for _ in range(50)]
    doc_idx = [0, 7, 7, 30, 50]
    writer(tmp_path / "x", sentences, doc_idx, dtype, code)
    for impl in impls + ["infer"]:
        dataset = make_dataset(tmp_path / "x", impl)
        assert dataset.dtype == np.dtype(dtype)
        assert [dataset[i].tolist() for i in range(50)] == sentences
        assert dataset.doc_idx.tolist() == doc_idx


def test_failed_build_leaves_nothing_and_keeps_the_old_dataset(tmp_path):
    prefix = write_dataset(tmp_path / "d", "mmap")
    before = (tmp_path / "d.bin").read_bytes(), (tmp_path / "d.idx").read_bytes()
    with pytest.raises(RuntimeError):
        with make_builder(prefix, "mmap", 100) as builder:
            builder.add_item([1, 2, 3])
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx"]
    assert ((tmp_path / "d.bin").read_bytes(), (tmp_path / "d.idx").read_bytes()) == before


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (Linux has one)")
@pytest.mark.parametrize("items", [1, 5000], ids=["at-the-last-flush", "in-a-write"])
def test_a_build_onto_a_full_disk_leaves_nothing_and_keeps_the_old_dataset(tmp_path, items):
    """The .bin's writes fail for a full disk (its .partial is /dev/full): in a write past the buffer
    (the abort's close then fails again, flushing the rest) or in finalize's flush. The OSError is
    the disk's; no partial file stays, the old dataset does."""
    prefix = write_dataset(tmp_path / "d", "mmap")
    before = (tmp_path / "d.bin").read_bytes(), (tmp_path / "d.idx").read_bytes()
    (tmp_path / "d.bin.partial").symlink_to("/dev/full")
    with pytest.raises(OSError, match="No space left on device"):
        with make_builder(prefix, "mmap", 100) as builder:
            for _ in range(items):
                builder.add_item([1, 2, 3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx"]
    assert ((tmp_path / "d.bin").read_bytes(), (tmp_path / "d.idx").read_bytes()) == before


def damage(path, transform):
    path.write_bytes(transform(path.read_bytes()))


@pytest.mark.parametrize("impl", ["mmap", "lazy", "cached"])
@pytest.mark.parametrize("what,transform,message", [
    ("idx", lambda b: b"XXXXXXXX" + b[8:], "bad magic"),
    ("idx", lambda b: b[:4], "bad magic"),
    ("idx", lambda b: b[:-8], "header promises"),
    ("idx", lambda b: b[:9] + struct.pack("<Q", 2) + b[17:] if b.startswith(b"MMIDIDX") else b[:8] + struct.pack("<Q", 2) + b[16:],
     "version 2"),
    ("bin", lambda b: b[:-2], "overrun"),
])
def test_damaged_files_are_one_line_errors(tmp_path, impl, what, transform, message):
    prefix = write_dataset(tmp_path / "d", impl)
    damage(tmp_path / f"d.{what}", transform)
    with pytest.raises(DataError, match=message) as error:
        make_dataset(prefix, impl)
    assert "\n" not in str(error.value) and "preprocess_data" in str(error.value)


def test_wrong_impl_for_the_files_is_reported(tmp_path):
    """The trainer's flag (--data-impl) and the value that reads the files, from their magic bytes: the
    files are sound, nothing to rebuild (it named preprocessing's --dataset-impl and said rebuild)."""
    prefix = write_dataset(tmp_path / "d", "mmap")
    with pytest.raises(DataError) as error:
        make_dataset(prefix, "lazy")
    assert str(error.value) == (f"{prefix}.idx is a dataset index in the mmap format (magic b'MMIDIDX\\x00\\x00'), "
                                "which --data-impl cached/lazy does not read; pass --data-impl mmap (the default)")
    prefix = write_dataset(tmp_path / "t", "lazy")
    with pytest.raises(DataError, match=r"TNTIDX.*which --data-impl mmap does not read; pass --data-impl lazy \(or "
                                        r"cached\)$"):
        make_dataset(prefix, "mmap")


def test_missing_files_name_the_prefix(tmp_path):
    with pytest.raises(DataError, match=r"nothing\.idx does not exist.*--data-path"):
        make_dataset(tmp_path / "nothing", "infer")


@pytest.mark.parametrize("given, problem, fix", [
    ("{a},{b}", "is a comma list, read as one path", "--data-path 1 {a} 1 {b}"),  # Megatron-LM's habit
    ("[0.3, {a}, 0.7, {b}]", "is a comma list, read as one path", "--data-path 0.3 {a} 0.7 {b}"),  # NeMo's
    ("{a},", "is a comma list, read as one path", "pass the prefix alone: --data-path {a}"),
    # a prefix listed twice: the fix passes it once, with the sum of its weights (the trainer refuses it twice)
    ("0.7,{a},0.3,{a}", "is a comma list, read as one path", "pass the prefix alone (the list repeats it): "
                                                             "--data-path {a}"),
    ("0.5,{a},0.2,{b},0.1,{a}", "is a comma list, read as one path", "(a prefix the list repeats once, with the sum "
                                                                     "of its weights): --data-path 0.6 {a} 0.2 {b}"),
    ("{folder}/*_text_sentence", "is a glob, which is not expanded", "--data-path 1 {a} 1 {b}"),
    ("{folder}/*.bin", "is a glob, which is not expanded", "--data-path 1 {a} 1 {b}"),
    ("{folder}/a*", "is a glob, which is not expanded", "pass the prefix alone: --data-path {a}"),
    ("{folder}/z*", "is a glob, which is not expanded, and matches no dataset", "pass the prefixes of datasets"),
])
def test_a_list_of_prefixes_in_one_value_is_named_with_the_values_to_pass(tmp_path, given, problem, fix):
    """Other trainers' forms of several prefixes, read as one path, name the separate weighted values that
    the fix passes (the trainer blends prefixes by weight)."""
    names = {"a": write_dataset(tmp_path / "a_text_sentence", "mmap"),
             "b": write_dataset(tmp_path / "b_text_sentence", "mmap"), "folder": str(tmp_path)}
    given = given.format(**names)
    with pytest.raises(DataError) as raised:
        make_dataset(given, "infer")
    assert str(raised.value).startswith(f"--data-path {given} {problem}; ")
    fix_text = str(raised.value).split("; ", 1)[1]
    assert fix.format(**names) in fix_text
    if "--data-path" in fix_text:  # the values named are a --data-path the run reads, of those datasets
        assert set(parse_data_path(fix_text.rsplit("--data-path ", 1)[1].split())[1]) <= {names["a"], names["b"]}
