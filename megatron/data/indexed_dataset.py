"""Megatron's indexed datasets, byte for byte: `.bin` holds the tokens, `.idx` says where items are.

Two on-disk formats, both readable by Megatron and from Megatron:

* mmap (`MMIDIDX\\x00\\x00`): version <Q 1, dtype code <B, item count <Q, doc-index length <Q,
  then int32 sizes, int64 byte pointers, int64 doc_idx. Read through numpy memmap, zero copy.
* cached / lazy (`TNTIDX\\x00\\x00`): version <Q 1, (dtype code, element size) <QQ,
  (item count, sizes count) <QQ, doc count <Q, then int64 dim_offsets, data_offsets (in
  elements), sizes, doc_idx. "lazy" reads each item from the file; "cached" holds the `.bin`
  in memory.

doc_idx starts with 0 and gets one entry (the item count so far) per finished document.
Builders write to `*.partial` files and rename them only on `finalize()` (`stage()` then `publish()`),
so an interrupted run leaves nothing that looks like a dataset. Readers check every header field and offset
against the file sizes, so a damaged file is a one-line DataError, not a numpy crash.
"""
import contextlib
import glob
from array import array
import os
import struct
from pathlib import Path

import numpy as np

from megatron import locks
from megatron.data.index_maps import size_text
from megatron.errors import ConfigError, DataError
from megatron.paths import in_repository

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
MMAP_MAGIC = b"MMIDIDX\x00\x00"
TNT_MAGIC = b"TNTIDX\x00\x00"
IMPLS = ("mmap", "cached", "lazy")
_REBUILD = f"rerun {in_repository('tools/preprocess_data.py')} to rebuild it"
_MAGICS = {"mmap": MMAP_MAGIC, "lazy": TNT_MAGIC}  # the reader of each format (cached reads TNTIDX too)
_IMPL_NAMES = {"mmap": "mmap", "lazy": "cached/lazy"}  # each format by the --data-impl values that read it


def dtype_code(dtype) -> int:
    for code, candidate in DTYPES.items():
        if np.dtype(candidate) == np.dtype(dtype):
            return code
    names = sorted(np.dtype(d).name for d in DTYPES.values())
    raise ConfigError(f"dtype {np.dtype(dtype)} has no indexed-dataset code", f"use one of {names}")


def best_fitting_dtype(vocab_size: int):
    """uint16 halves the file for every vocab Megatron calls small (< 65500 ids)."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def data_file_path(prefix) -> str:
    return f"{prefix}.bin"


def index_file_path(prefix) -> str:
    return f"{prefix}.idx"


def lock_file_path(prefix) -> str:
    """The lock preprocess_data.py holds while it writes the dataset (locks.take_lock)."""
    return f"{prefix}.lock"


def dataset_exists(prefix) -> bool:
    return os.path.isfile(data_file_path(prefix)) and os.path.isfile(index_file_path(prefix))


# ---------------------------------------------------------------- builders

INDEX_CHUNK = 1 << 20  # items whose offsets are computed and written at once by finalize


class _Builder:
    """Shared by both formats: append items, close documents, commit atomically. Sizes and document
    boundaries are kept as C ints (4 and 8 bytes an item; a list took ~8 more, and finalize's arrays
    ~20 bytes an item on top: 60 GB for a 3B-sentence corpus), the offsets written INDEX_CHUNK at a time."""

    def __init__(self, prefix, dtype):
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)
        self.sizes = array("i")
        self.doc_idx = array("q", [0])
        self._bin_partial = data_file_path(self.prefix) + ".partial"
        self._idx_partial = index_file_path(self.prefix) + ".partial"
        self._sidecars = []  # (staged, final) paths of the files stage() wrote beside the dataset
        self._bin = open(self._bin_partial, "wb")

    def add_item(self, tokens):
        array = np.asarray(tokens, dtype=self.dtype)
        self._bin.write(array.tobytes(order="C"))
        self.sizes.append(array.size)

    def add_document(self, items):
        """All items (sentences) of one document, then the document boundary."""
        for item in items:
            self.add_item(item)
        self.end_document()

    def add_flat_document(self, tokens: np.ndarray, sizes: np.ndarray):
        """One document as all its tokens in one array and each item's count: the same bytes as
        add_document of the items, in one write."""
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.sizes.frombytes(np.ascontiguousarray(sizes, dtype=np.int32).tobytes())
        self.end_document()

    def end_document(self):
        self.doc_idx.append(len(self.sizes))

    def finalize(self, sidecars: dict | None = None):
        self.stage(sidecars)
        self.publish()

    def stage(self, sidecars: dict | None = None):
        """Writes all the dataset's files under their `.partial` names: the `.bin`, the `.idx` and `sidecars`
        ({path: text} kept beside them, such as the record of the vocab that made the ids). Every write that
        can fail (a full disk) happens here, before anything of an older dataset at the prefix is replaced."""
        self._bin.close()
        with open(self._idx_partial, "wb") as index:
            self._write_index(index)
        for path, text in (sidecars or {}).items():
            self._sidecars.append((f"{path}.partial", str(path)))
            Path(self._sidecars[-1][0]).write_text(text, encoding="utf-8")

    def publish(self):
        """Renames the staged files into place, which writes no data. The old sidecars go first: a rename
        that fails still leaves no record naming other data."""
        for _, path in self._sidecars:
            Path(path).unlink(missing_ok=True)
        os.replace(self._bin_partial, data_file_path(self.prefix))
        os.replace(self._idx_partial, index_file_path(self.prefix))
        for partial, path in self._sidecars:
            os.replace(partial, path)

    def abort(self):
        """Removes everything written or staged so far; the old dataset at the prefix, if any, stays. On a
        full disk the close flushes what is buffered and fails again, closing the file all the same."""
        with contextlib.suppress(OSError):
            self._bin.close()
        for path in (self._bin_partial, self._idx_partial, *(partial for partial, _ in self._sidecars)):
            Path(path).unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            self.abort()
            return
        try:
            self.finalize()
        except BaseException:  # a failed finalize (a full disk) leaves nothing either
            self.abort()
            raise


def _write_offsets(index, sizes: np.ndarray, scale: int, last: bool) -> None:
    """The int64 running sums of `sizes` times `scale`, from 0 (with the total at the end when `last`),
    written INDEX_CHUNK items at a time."""
    total = 0
    for start in range(0, len(sizes), INDEX_CHUNK):
        chunk = sizes[start:start + INDEX_CHUNK].astype(np.int64) * scale
        sums = np.cumsum(chunk) + total
        index.write((sums - chunk).tobytes())
        total = int(sums[-1])
    if last:
        index.write(struct.pack("<q", total))


def _write_chunked(index, values: np.ndarray, dtype) -> None:
    for start in range(0, len(values), INDEX_CHUNK):
        index.write(values[start:start + INDEX_CHUNK].astype(dtype).tobytes())


class MMapIndexedDatasetBuilder(_Builder):
    def _write_index(self, index):
        sizes = np.frombuffer(self.sizes, dtype=np.int32)  # no copy
        index.write(MMAP_MAGIC)
        index.write(struct.pack("<Q", 1))
        index.write(struct.pack("<B", dtype_code(self.dtype)))
        index.write(struct.pack("<Q", len(sizes)))
        index.write(struct.pack("<Q", len(self.doc_idx)))
        index.write(self.sizes)  # the buffer itself, no copy
        _write_offsets(index, sizes, self.dtype.itemsize, last=False)
        index.write(self.doc_idx)


class IndexedDatasetBuilder(_Builder):
    """TNTIDX (cached/lazy). Unlike Megatron's builder it records documents, so BERT can use it."""

    def _write_index(self, index):
        sizes = np.frombuffer(self.sizes, dtype=np.int32)
        count = len(sizes)
        index.write(TNT_MAGIC)
        index.write(struct.pack("<Q", 1))
        index.write(struct.pack("<QQ", dtype_code(self.dtype), self.dtype.itemsize))
        index.write(struct.pack("<QQ", count, count))
        index.write(struct.pack("<Q", len(self.doc_idx)))
        _write_offsets(index, np.broadcast_to(np.int32(1), (count,)), 1, last=True)  # dim_offsets: items are 1-D
        _write_offsets(index, sizes, 1, last=True)  # data_offsets, in elements
        _write_chunked(index, sizes, np.int64)
        index.write(self.doc_idx)


def make_builder(prefix, impl: str, vocab_size: int):
    dtype = best_fitting_dtype(vocab_size)
    if impl == "mmap":
        return MMapIndexedDatasetBuilder(prefix, dtype)
    if impl in ("cached", "lazy"):
        return IndexedDatasetBuilder(prefix, dtype)
    raise ConfigError(f"unknown --dataset-impl {impl}", f"use one of {', '.join(IMPLS)}")


# ---------------------------------------------------------------- readers

class _Reader:
    """Item access shared by all formats; subclasses set sizes, doc_idx, dtype and `_read`."""

    sizes: np.ndarray  # [items] tokens per item
    doc_idx: np.ndarray  # [docs + 1] first item of each document, then the item count

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("indexed datasets slice contiguously only")
            return [self.get(i) for i in range(start, stop)]
        return self.get(idx)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset + length) of item idx (the rest of it when length is None)."""
        idx = int(idx)
        if idx < 0:
            idx += len(self)
        if not 0 <= idx < len(self):
            raise IndexError(f"item {idx} out of range for {len(self)} items")
        size = int(self.sizes[idx])
        length = size - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range for item {idx} of {size} tokens")
        return self._read(idx, offset, length)

    def _check_doc_idx(self, path):
        doc_idx = self.doc_idx
        if len(doc_idx) == 0 or doc_idx[0] != 0 or np.any(np.diff(doc_idx) < 0) or doc_idx[-1] > len(self.sizes):
            raise DataError(f"{path}: document index is not an increasing list from 0 to the item count", _REBUILD)


def _read_header(path, magic: bytes, layout: str) -> tuple:
    size = os.path.getsize(path)
    need = len(magic) + struct.calcsize(layout)
    with open(path, "rb") as f:
        head = f.read(need)
    if head[:len(magic)] != magic:
        found = _impl_of(head)
        if found:  # a sound index of the other format: the trainer's --data-impl reads it
            flags = "--data-impl mmap (the default)" if found == "mmap" else "--data-impl lazy (or cached)"
            raise DataError(f"{path} is a dataset index in the {_IMPL_NAMES[found]} format (magic "
                            f"{_MAGICS[found]!r}), which --data-impl {_IMPL_NAMES[_impl_of(magic)]} does not read",
                            f"pass {flags}")
        raise DataError(f"{path}: not an indexed-dataset index (bad magic {head[:len(magic)]!r})",
                        f"pass the prefix of a .bin/.idx pair; {_REBUILD}")
    if len(head) < need:
        raise DataError(f"{path}: header truncated at {size} bytes", _REBUILD)
    fields = struct.unpack(layout, head[len(magic):])
    if fields[0] != 1:
        raise DataError(f"{path}: index version {fields[0]} is not supported (only version 1)", _REBUILD)
    if fields[1] not in DTYPES:
        raise DataError(f"{path}: unknown dtype code {fields[1]}", _REBUILD)
    return need, size, fields


def _overrun(bin_path, bin_size) -> DataError:
    return DataError(f"{bin_path}: items overrun the {bin_size}-byte data file (truncated or mismatched .bin/.idx)",
                     _REBUILD)


def _mismatch(index_path, bin_path, bin_size, described) -> DataError:
    """A .bin longer than the items its .idx describes: the pair comes from two datasets (every builder
    writes the items back to back, so the sizes agree exactly)."""
    return DataError(f"{index_path} describes {described} bytes of tokens but {bin_path} holds {bin_size}: the .idx "
                     "and .bin come from different datasets", _REBUILD)


def _require_files(prefix):
    for path in (index_file_path(prefix), data_file_path(prefix)):
        if not os.path.isfile(path):
            if mistake := misnamed_dataset(str(prefix)):
                raise DataError(*mistake)
            partial, size, writer = _partial_output(prefix)
            if writer:
                raise DataError(f"dataset {prefix} is still being written by preprocess_data.py ({writer}; "
                                f"{size} so far)", "wait for that preprocess to finish, then rerun")
            if size:
                raise DataError(f"dataset file {path} does not exist: {partial} is the output "
                                "of a preprocess_data.py that was killed", "run that preprocess again (it removes the "
                                "partial output first)")
            raise DataError(f"dataset file {path} does not exist", missing_fix(str(prefix)))


def _partial_output(prefix: str) -> tuple[str, str | None, str | None]:
    """(the .bin.partial a preprocess_data.py writes into `prefix`, its size as text, who writes it when that job
    still runs); the size is None when there is none, or it was renamed into place meanwhile (the job ended)."""
    partial = f"{data_file_path(prefix)}.partial"
    try:
        size = size_text(os.path.getsize(partial)) if os.path.isfile(partial) else None
    except OSError:
        size = None
    if size is None:
        return partial, None, None
    return partial, size, locks.live_holder(lock_file_path(prefix))


def rewrite_warning(prefix: str) -> str | None:
    """The warning for a dataset that a preprocess_data.py is writing again, or was writing when it was killed:
    a run reads the files there now, the old corpus, without a word otherwise."""
    partial, size, writer = _partial_output(prefix) if dataset_exists(prefix) else (None, None, None)
    if size is None:
        return None
    if writer:
        return (f"dataset {prefix} is being written again by preprocess_data.py ({writer}; {size} so far): this run "
                "reads the current files, which that job replaces when it ends (and removes their index maps)")
    return (f"a preprocess_data.py into {prefix} was killed ({size} of new data left in {partial}): this run trains "
            "on the older dataset there; rerun that preprocess for the new corpus")


def misnamed_dataset(prefix: str, flag: str = "--data-path") -> tuple | None:
    """(problem, fix) for a prefix without a dataset that names datasets another way: a folder holding them
    (`--data-path data`; `data/` names data/.idx), or a comma list or glob of prefixes (Megatron-LM's and
    NeMo's habits), which the data layer reads as one path. None: none of these. `flag`: how the prefix was
    given ("": a tool's argument)."""
    named = _as_given(flag, prefix)
    if os.path.isdir(prefix):
        return f"{named} is a folder, not a dataset prefix", folder_fix(prefix, flag)
    if "," in prefix:
        parts = [part.strip().strip("'\"") for part in prefix.strip("[]").split(",")]
        parts = [part for part in parts if part]
        paired = len(parts) % 2 == 0 and all(_is_number(weight) for weight in parts[0::2])
        return (f"{named} is a comma list, read as one path",
                _listed_fix(flag, parts[1::2], parts[0::2]) if paired else _listed_fix(flag, parts))
    if glob.has_magic(prefix):  # 'data/*' or 'data/*.bin' alike: the datasets it names
        stem = prefix[:-4] if prefix.endswith((".bin", ".idx")) else prefix
        matched = sorted(found[:-4] for found in glob.glob(f"{stem}.idx") if os.path.isfile(f"{found[:-4]}.bin"))
        if not matched:
            return (f"{named} is a glob, which is not expanded, and matches no dataset",
                    "pass the prefixes of datasets (their .bin/.idx paths without the suffix)")
        return f"{named} is a glob, which is not expanded", _listed_fix(flag, matched)
    return None


def _as_given(flag: str, value: str) -> str:
    """A value as the command line gives it: after its flag, or alone (a tool's argument)."""
    return f"{flag} {value}" if flag else value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _listed_fix(flag: str, prefixes: list, weights: list | None = None) -> str:
    """The fix for a comma list or glob of `prefixes`: separate values, each after its weight (the list's
    `weights`, else 1) for the trainer's --data-path; one prefix alone. A prefix the list names more than
    once is passed once, with the sum of its weights: the trainer refuses a --data-path naming it twice."""
    folded = {}
    for weight, prefix in zip(weights or ["1"] * len(prefixes), prefixes):
        folded.setdefault(os.path.normpath(prefix), [prefix, 0.0])[1] += float(weight)
    repeated = " (a prefix the list repeats once, with the sum of its weights)" if len(folded) < len(prefixes) else ""
    if len(folded) == 1:
        return f"pass the prefix alone{repeated and ' (the list repeats it)'}: {_as_given(flag, prefixes[0])}"
    if flag == "--data-path":
        values = " ".join(f"{weight:.12g} {prefix}" for prefix, weight in folded.values())
        return (f"pass the prefixes as separate values, each after its weight (its share of samples){repeated}: "
                f"{flag} {values}")
    named = " ".join(prefix for prefix, _ in folded.values())
    return f"pass the prefixes as separate arguments{repeated}: {_as_given(flag, named)}"


def folder_fix(folder: str, flag: str = "--data-path") -> str:
    """The fix for a prefix naming a folder: the prefixes of the datasets in it, else the tool to run."""
    held = sorted(found[:-4] for found in glob.glob(os.path.join(glob.escape(folder), "*.idx"))
                  if os.path.isfile(f"{found[:-4]}.bin"))
    if held:
        return (f"pass the prefix of the dataset it holds (the .bin/.idx path without its suffix): "
                f"{_as_given(flag, held[0])}" + (f" (or {', '.join(held[1:])})" if len(held) > 1 else ""))
    return "pass the prefix of a .bin/.idx pair (FOLDER/NAME without the suffix) or run " + in_repository(
        "tools/preprocess_data.py")


def missing_fix(prefix: str, flag: str = "--data-path", otherwise: str | None = None) -> str:
    """The fix for a prefix naming no dataset: the prefix with its file's suffix dropped, or the datasets
    preprocess_data.py wrote for that --output-prefix (`PREFIX_text_sentence`), else `otherwise` (by default
    the tool to run)."""
    if prefix.endswith((".bin", ".idx")):
        return f"drop the .bin/.idx suffix: {_as_given(flag, prefix[:-4])}"
    written = sorted(found[:-4] for level in ("sentence", "document")
                     for found in glob.glob(f"{glob.escape(prefix)}_*_{level}.idx")
                     if os.path.isfile(f"{found[:-4]}.bin"))
    if written:
        return (f"pass the dataset preprocess_data.py wrote for --output-prefix {prefix}: "
                f"{_as_given(flag, written[0])}" + (f" (or {', '.join(written[1:])})" if len(written) > 1 else ""))
    return otherwise or "check --data-path (a prefix without .bin/.idx) or run " + in_repository(
        "tools/preprocess_data.py")


class MMapIndexedDataset(_Reader):
    def __init__(self, prefix):
        _require_files(prefix)
        self.prefix = str(prefix)
        index_path, bin_path = index_file_path(prefix), data_file_path(prefix)
        offset, idx_size, (_, code, count, doc_count) = _read_header(index_path, MMAP_MAGIC, "<QBQQ")
        self.dtype = np.dtype(DTYPES[code])
        expected = offset + count * (4 + 8) + doc_count * 8
        if idx_size != expected:
            raise DataError(f"{index_path}: {idx_size} bytes but its header promises {expected}", _REBUILD)
        index = np.memmap(index_path, mode="r", order="C")
        self.sizes = np.frombuffer(index, dtype=np.int32, count=count, offset=offset)
        self.pointers = np.frombuffer(index, dtype=np.int64, count=count, offset=offset + count * 4)
        self.doc_idx = np.frombuffer(index, dtype=np.int64, count=doc_count, offset=offset + count * 12)
        bin_size = os.path.getsize(bin_path)
        ends = self.pointers + self.sizes.astype(np.int64) * self.dtype.itemsize
        if count and (self.sizes.min() < 0 or self.pointers.min() < 0 or ends.max() > bin_size):
            raise _overrun(bin_path, bin_size)
        described = int(ends.max()) if count else 0
        if described != bin_size:
            raise _mismatch(index_path, bin_path, bin_size, described)
        self._check_doc_idx(index_path)
        self._bin = np.memmap(bin_path, mode="r", order="C") if bin_size else np.zeros(0, np.uint8)

    def _read(self, idx, offset, length):
        start = int(self.pointers[idx]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=start)


class IndexedDataset(_Reader):
    """TNTIDX, "lazy": every item is read from the file when asked for."""

    def __init__(self, prefix):
        _require_files(prefix)
        self.prefix = str(prefix)
        index_path, bin_path = index_file_path(prefix), data_file_path(prefix)
        offset, idx_size, (_, code, element_size, count, sizes_count, doc_count) = \
            _read_header(index_path, TNT_MAGIC, "<QQQQQQ")
        self.dtype = np.dtype(DTYPES[code])
        if element_size != self.dtype.itemsize:
            raise DataError(f"{index_path}: element size {element_size} does not match dtype {self.dtype}", _REBUILD)
        expected = offset + 8 * (2 * (count + 1) + sizes_count + doc_count)
        if idx_size != expected:
            raise DataError(f"{index_path}: {idx_size} bytes but its header promises {expected}", _REBUILD)
        longs = np.fromfile(index_path, dtype=np.int64, offset=offset)
        dim_offsets, data_offsets = longs[:count + 1], longs[count + 1:2 * count + 2]
        sizes = longs[2 * count + 2:2 * count + 2 + sizes_count]
        self.doc_idx = longs[2 * count + 2 + sizes_count:]
        if sizes_count != count or np.any(dim_offsets != np.arange(count + 1)):
            raise DataError(f"{index_path}: items with more than one dimension are not supported",
                            "store one 1-D token array per item")
        self.sizes = sizes
        self.data_offsets = data_offsets
        bin_size = os.path.getsize(bin_path)
        if data_offsets[0] != 0 or np.any(np.diff(data_offsets) != sizes) or data_offsets[-1] * element_size > bin_size:
            raise _overrun(bin_path, bin_size)
        if data_offsets[-1] * element_size != bin_size:
            raise _mismatch(index_path, bin_path, bin_size, int(data_offsets[-1] * element_size))
        self._check_doc_idx(index_path)
        self._bin_path = bin_path

    def _read(self, idx, offset, length):
        start = (int(self.data_offsets[idx]) + offset) * self.dtype.itemsize
        return np.fromfile(self._bin_path, dtype=self.dtype, count=length, offset=start)


class IndexedCachedDataset(IndexedDataset):
    """TNTIDX, "cached": the whole `.bin` is read into memory once, then sliced."""

    def __init__(self, prefix):
        super().__init__(prefix)
        self._data = np.fromfile(self._bin_path, dtype=self.dtype, count=int(self.data_offsets[-1]))

    def _read(self, idx, offset, length):
        start = int(self.data_offsets[idx]) + offset
        return self._data[start:start + length]


def _impl_of(head: bytes) -> str | None:
    """The reader of an index starting with `head`, by its magic bytes: mmap, lazy (TNTIDX, which cached
    reads too), or None."""
    return next((impl for impl, magic in _MAGICS.items() if head.startswith(magic)), None)


def infer_dataset_impl(prefix) -> str:
    """mmap or lazy, from the index's magic bytes."""
    _require_files(prefix)
    with open(index_file_path(prefix), "rb") as f:
        magic = f.read(len(MMAP_MAGIC))
    impl = _impl_of(magic)
    if impl:
        return impl
    raise DataError(f"{index_file_path(prefix)}: not an indexed-dataset index (bad magic {magic!r})", _REBUILD)


def make_dataset(prefix, impl: str = "infer"):
    if impl == "infer":
        impl = infer_dataset_impl(prefix)
    readers = {"mmap": MMapIndexedDataset, "cached": IndexedCachedDataset, "lazy": IndexedDataset}
    if impl not in readers:
        raise ConfigError(f"unknown --data-impl {impl}", f"use one of infer, {', '.join(IMPLS)}")
    return readers[impl](prefix)
