"""Corpora as they are published: loose JSON (one object per line), plain or compressed
(`.gz`, `.zst`), and Parquet, as one file or a folder or glob of shards.

tools/preprocess_data.py reads every format as one stream of records in shard order: a JSON
line's raw bytes (the tokenizing workers parse them) or a Parquet row's dict of the asked-for
columns (pyarrow reads record batches of those columns only: no whole-file load, no other
column decoded). The same text gives the same records, so the same `.bin`/`.idx` bytes. A
shard that cannot be read is one DataError naming it; Parquet shards are checked (footer and
columns) before anything is written. pyarrow and zstandard are imported by the shards that need
them: loose JSON (and the trainer, which imports the preprocessing for its default corpus) pays
for neither.
"""
import glob
import gzip
import io
import json
import os
import re
import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path

from megatron.data.index_maps import FINGERPRINT_RECORD
from megatron.data.tokenizer import DATA_IDENTITY
from megatron.errors import ConfigError, DataError, refuse_lfs_pointer

PARQUET_BATCH_ROWS = 1024  # rows decoded at once: a batch of long articles stays a few MB
FOLDER_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz", ".json.zst", ".jsonl.zst", ".json.zstd",
                   ".jsonl.zstd", ".parquet")  # what a folder's shards may be (a glob's too, where some match)
FORMATS_HELP = "loose JSON, .jsonl.gz, .jsonl.zst or .parquet"
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd", ".bz2", ".xz", ".lz4", ".zip")  # a folder notes those it leaves out
METADATA = ("dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json")  # a Hugging Face
# dataset's description beside its shards (snapshot_download, save_to_disk): JSON, not records
REDOWNLOAD = "download or compress it again (gzip -t / zstd -t test a file), or leave it out of --input"
UNFINISHED = (".incomplete", ".part", ".crdownload", ".tmp", ".aria2")  # beside or instead of a file whose download
# has not finished: huggingface_hub (its blobs and local_dir's .cache/ too: any *.incomplete), browsers, aria2
NUMBERED_SHARD = re.compile(r"(?P<head>.+)-(?P<index>\d+)-of-(?P<total>\d+)(?P<tail>.*)")  # train-00001-of-00003.json
SPLITS = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
          "val": "validation", "dev": "validation", "eval": "validation", "evaluation": "validation",
          "test": "test", "testing": "test"}  # a split's names (a Hugging Face dataset's and others') -> the split
SPLIT_FILE = re.compile(rf"(?:^|[-_.])(?P<split>{'|'.join(SPLITS)})(?P<end>[-_.]\d|\.(?:jsonl?|parquet)(?:\.\w+)?$)")
# a split word before a shard number or the suffix: `test-00000-of-00001.parquet`, `en/c4-validation.00000-of-00008
# .json.gz`, `test.jsonl`, `wiki_train.jsonl` (not `test_utils.jsonl`)
SPLIT_FOLDER = re.compile(rf"(?:partial-)?(?P<split>{'|'.join(SPLITS)})")  # `default/train/`, `partial-train/`


def shard_kind(name: str) -> str:
    """The format a file name says: parquet, gzip or zstd (compressed JSON lines), else json."""
    name = name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith((".zst", ".zstd")):
        return "zstd"
    return "json"


@dataclass(frozen=True)
class Shard:
    path: str
    kind: str

    @property
    def unit(self) -> str:
        return "row" if self.kind == "parquet" else "line"


class Corpus:
    """The shards of `--input` (a file, a folder, or a glob pattern; or several of them, read in the
    order given, as a shell expands an unquoted glob) and the columns or JSON keys to read; raises
    DataError for an input that names nothing readable (or a part of it: a download that has not
    finished), ConfigError for a key named twice."""

    def __init__(self, spec: str | tuple | list, keys: tuple):
        if repeated := sorted({key for key in keys if list(keys).count(key) > 1}):
            raise ConfigError(f"--json-keys {' '.join(keys)} names {', '.join(map(repr, repeated))} twice",
                              "name each key once (each gets its own output)")
        self.keys = tuple(keys)
        specs = [spec] if isinstance(spec, str) else list(spec)
        self.input = specs[0] + (f" and {len(specs) - 1} more" if len(specs) > 1 else "")  # as the messages name it
        found = [_shard_paths(one) for one in specs]
        paths = [path for shards, _ in found for path in shards]
        self.skipped = [path for _, skipped in found for path in skipped]  # files beside the shards, left out
        _refuse_repeated_shards(paths)
        if len(specs) > 1:  # an unquoted glob the shell expanded: `--input hf/data/*`
            _refuse_several_splits(f"the {len(specs)} --input values hold", _common_folder(paths), paths)
        self.shards = [Shard(path, shard_kind(path)) for path in paths]
        self.total_bytes = sum(os.path.getsize(shard.path) for shard in self.shards)  # as stored (compressed)
        for shard in self.shards:
            if shard.kind == "parquet":
                _check_parquet(shard.path, self.keys)
            else:
                _refuse_one_document(shard, self.keys)

    def where(self, location: tuple) -> str:
        """'path line 7' / 'path row 7' for a record's (shard index, number, ...)."""
        shard = self.shards[location[0]]
        return f"{shard.path} {shard.unit} {location[1]}"

    def records(self):
        """((shard index, number, input bytes read), record, bytes of text) for every record, in shard
        order; number counts lines (blank ones skipped, not renumbered) or rows from 1 in each shard;
        the bytes read are of the files as stored, through this record (a compressed shard's offset
        in the compressed file, a Parquet shard's size in proportion to its rows), for progress
        against total_bytes."""
        before = 0
        for index, shard in enumerate(self.shards):
            rows = _parquet_rows(shard.path, self.keys) if shard.kind == "parquet" else _json_lines(shard)
            for number, record, size, offset in rows:
                yield (index, number, before + offset), record, size
            before += os.path.getsize(shard.path)


def _shard_paths(spec: str) -> tuple[list[str], list[str]]:
    """(the shards, the files left out that a user may have meant as shards): a folder's files with
    a shard's suffix (left out: compressed files without one, `RC_2019-01.zst`, `.jsonl.xz`); a glob's
    the same where it matches any (else all it matches: `part-*` shards without one; left out: the rest)."""
    path = Path(spec)
    if path.is_file():
        return [spec], []
    if path.is_dir():
        every = sorted(path.rglob("*"))
        _refuse_unfinished(spec, every)  # hidden ones too: huggingface_hub's local_dir keeps them in .cache/
        visible = [file for file in every
                   if not any(part.startswith((".", "_")) for part in file.relative_to(path).parts)]
        _refuse_broken_links(spec, visible)
        files = [str(file) for file in visible if file.is_file() and not _derived(file.name)]
        found = [name for name in files if name.lower().endswith(FOLDER_SUFFIXES)]
        if not found:
            _refuse_arrow_folder(spec, files)
            raise DataError(f"input folder {spec} holds no corpus shards ({', '.join(FOLDER_SUFFIXES)})",
                            f"pass a folder, file or glob of {FORMATS_HELP} files")
        _refuse_several_splits(f"input folder {spec} holds", spec, found)
        _refuse_missing_shards(spec, found)
        return found, [name for name in files if name not in found and name.lower().endswith(COMPRESSED_SUFFIXES)]
    if glob.has_magic(spec):
        matched = sorted(glob.glob(spec, recursive=True))
        _refuse_unfinished(spec, [Path(name) for suffix in UNFINISHED for name in glob.glob(spec + suffix)])
        _refuse_broken_links(spec, [Path(name) for name in matched])
        found = [name for name in matched if Path(name).is_file() and not _derived(name)]
        if not found:
            raise DataError(f"--input {spec} matches no files", "check the pattern (quoted, so the shell leaves "
                                                                  "it to the tool) and the folder")
        shards = [name for name in found if name.lower().endswith(FOLDER_SUFFIXES)] or found
        if len(shards) > 1:
            _refuse_several_splits(f"--input {shlex.quote(spec)} matches", _common_folder(shards), shards)
        return shards, [name for name in found if name not in shards]
    raise DataError(f"input file {spec} does not exist",
                    f"pass --input with a {FORMATS_HELP} file, or a folder or glob of them")


def _refuse_repeated_shards(paths: list) -> None:
    """A shard that several --input values name (a folder and a file in it, a file given twice): read
    twice, its documents would weigh double."""
    seen = set()
    for path in paths:
        if (real := os.path.realpath(path)) in seen:
            raise DataError(f"--input names {path} twice (a path given twice, or a folder and a file in it)",
                            "pass each shard once")
        seen.add(real)


def _refuse_several_splits(where: str, root: str, shards: list) -> None:
    """Shards of several splits of a dataset (`data/train-*`, `data/validation-*`, `data/test-*`;
    `default/train/`, `default/test/`), in a folder, a glob or several --input values (`where` says which,
    `root` the folder they lie in): read as one corpus, the held-out text would be trained on."""
    splits = {}  # split -> where each of its shards lies
    for name in shards:
        if split := _split_of(root, name):
            splits.setdefault(split[0], []).append(split[1])
    if len(splits) < 2:
        return
    order = sorted(splits, key=list(SPLITS.values()).index)
    unit = {order[0]: " shard" if len(splits[order[0]]) == 1 else " shards"}
    listing = ", ".join(f"{split} ({len(splits[split])}{unit.get(split, '')})" for split in order)
    raise DataError(f"{where} the splits {listing}: read whole, the held-out splits would be trained on",
                    f"pass the one to read as a quoted glob, e.g. --input {_split_glob(root, splits[order[0]])}")


def _split_of(root: str, name: str) -> tuple | None:
    """(the split a shard under `root` names, where: (its split folder, that folder's name, whether the
    shard lies directly in it) or (its folder, its file name up to the split word, None)), or None. By a
    folder (`default/train/0000.parquet`, the converter's `partial-train/`) or the file name
    (`train-00000-of-00002.parquet`, `c4-validation.00000-of-00008.json.gz`, `test.jsonl`)."""
    relative = Path(os.path.relpath(name, root))
    for depth, part in enumerate(relative.parts[:-1]):
        if match := SPLIT_FOLDER.fullmatch(part.lower()):
            folder = os.path.join(root, *relative.parts[:depth + 1])
            return SPLITS[match["split"]], (folder, part, depth == len(relative.parts) - 2)
    if match := SPLIT_FILE.search(relative.name.lower()):
        return SPLITS[match["split"]], (os.path.dirname(name) or ".", relative.name[:match.start("end") + 1], None)
    return None


def _split_glob(root: str, places: list) -> str:
    """The quoted glob of one split's shards from where each lies (_split_of's): `hf/data/train-*` or
    `conv/default/train/*` where they share one, else recursive ones (`hf/**/train/**/*`) that match all."""
    if len({place[:2] for place in places}) == 1:
        folder, head, direct = places[0]
        tail = f"{head}*" if direct is None else "*" if all(place[2] for place in places) else "**/*"
        patterns = [os.path.join(folder, tail)]
    else:
        patterns = sorted({os.path.join(root, "**", head, "**/*") if direct is not None
                           else os.path.join(root, "**", f"{head}*") for _, head, direct in places})
    return " ".join(shlex.quote(os.path.normpath(pattern)) for pattern in patterns)


def _common_folder(paths: list) -> str:
    """The deepest folder holding every path (relative where they all are)."""
    try:
        return os.path.commonpath([os.path.dirname(path) or "." for path in paths])
    except ValueError:  # absolute and relative paths mixed
        return os.path.commonpath([os.path.dirname(os.path.abspath(path)) for path in paths])


def _refuse_arrow_folder(spec: str, files: list) -> None:
    """A folder `datasets.save_to_disk` wrote (Arrow files), which holds no shard read here."""
    if any(name.lower().endswith(".arrow") for name in files):
        split = "['train']" if (Path(spec) / "dataset_dict.json").is_file() else ""
        raise DataError(f"input folder {spec} is a Hugging Face save_to_disk folder (Arrow files), which is not read",
                        f"write it as Parquet, e.g. python -c \"import datasets; datasets.load_from_disk("
                        f"{str(spec)!r}){split}.to_parquet({os.path.abspath(spec) + '.parquet'!r})\"")


def _refuse_unfinished(spec: str, paths: list) -> None:
    """A download that stopped part-way (a shard's `.incomplete` / `.part` / `.crdownload` / `.tmp`, aria2's
    `.aria2` beside it, any `*.incomplete` of huggingface_hub): read, the rest would pass for a smaller corpus."""
    for path in paths:
        name = path.name.lower()
        beside_a_shard = name.endswith(UNFINISHED) and name.rsplit(".", 1)[0].endswith(FOLDER_SUFFIXES)
        if name.endswith(".incomplete") or beside_a_shard:
            raise DataError(f"{path} is a download that has not finished: --input {spec} would read as a smaller "
                            "corpus",
                            "finish the download (run it again), or delete that file to read the corpus without it")


def _refuse_broken_links(spec: str, paths: list) -> None:
    """A shard that is a link to a file that is gone (a dataset snapshot copied without its blobs), which
    would be left out as no file."""
    for path in paths:
        if path.name.lower().endswith(FOLDER_SUFFIXES) and path.is_symlink() and not path.exists():
            raise DataError(f"{path} in --input {spec} is a link to {os.readlink(path)}, which does not exist",
                            "copy the dataset with its files (cp -rL), or download it again")


def _refuse_missing_shards(spec: str, shards: list) -> None:
    """A folder's numbered shards (`train-00000-of-00003.parquet`) with one absent: a download that stopped
    between files would read as a smaller corpus. (A glob reads what it matches: the way to read some.)"""
    sets = {}  # (folder, head, total) -> {index: tail}
    for name in shards:
        if (match := NUMBERED_SHARD.fullmatch(Path(name).name)) and int(match["index"]) < int(match["total"]):
            sets.setdefault((Path(name).parent, match["head"], match["total"]), {})[int(match["index"])] = match["tail"]
    for (folder, head, total), tails in sorted(sets.items()):
        if len(tails) < int(total):
            missing = next((place for place, index in enumerate(sorted(tails)) if index != place), len(tails))
            tail = next(iter(tails.values())) if len(set(tails.values())) == 1 else "*"
            absent = folder / f"{head}-{missing:0{len(total)}d}-of-{total}{tail}"
            raise DataError(f"input folder {spec} lacks {absent}: {len(tails)} of its {int(total)} {head}-*-of-{total} "
                            "shards are there",
                            f"download the dataset again, or pass a glob of the shards to read ('{folder}/{head}-*')")


def _derived(name: str) -> bool:
    """Whether a `.json` is never a shard: the vocab and fingerprint records preprocessing writes beside its
    `.bin`/`.idx` (so a corpus folder that also holds its data can be preprocessed again) or a dataset's METADATA."""
    return name.endswith((DATA_IDENTITY, FINGERPRINT_RECORD)) or Path(name).name in METADATA


def _json_lines(shard: Shard):
    """(line number, raw bytes, bytes, offset in the file as stored) of the non-blank lines of a plain or
    compressed JSON-lines file."""
    file = open(shard.path, "rb")  # a missing or unreadable file: an OSError naming it
    corrupt = ()  # what a damaged compressed stream raises
    try:
        if shard.kind != "json" and not file.peek(1):  # gzip and zstd read 0 bytes as an empty text
            raise DataError(f"{shard.path} is empty (0 bytes), not a complete {shard.kind} file", REDOWNLOAD)
        lines, corrupt = _decompressed(shard, file)
        if shard.kind != "json":
            _refuse_compressed_other(shard, lines.peek(512))
        else:
            _refuse_misnamed(shard.path, file.peek(8))
        for number, raw in enumerate(lines, 1):
            if raw.strip():
                yield number, raw, len(raw), file.tell()
    except corrupt as error:
        if getattr(error, "filename", None):  # the disk, not the stream
            raise
        refuse_lfs_pointer(shard.path)  # a dataset cloned without git-lfs
        raise DataError(f"{shard.path} is not a readable {shard.kind} file ({error or type(error).__name__})",
                        REDOWNLOAD) from None
    finally:
        file.close()


def _decompressed(shard: Shard, file) -> tuple:
    """(the JSON-lines bytes of an open shard, what a damaged stream of its kind raises)."""
    if shard.kind == "gzip":
        return gzip.GzipFile(fileobj=file), (OSError, EOFError, zlib.error)
    if shard.kind == "zstd":
        import zstandard

        return io.BufferedReader(_ZstdFrames(file), 1 << 20), (zstandard.ZstdError,)
    return file, ()


HEAD_BYTES = 1 << 16  # of a JSON shard, read before any worker starts to tell one JSON document from JSON lines


def _refuse_one_document(shard: Shard, keys: tuple) -> None:
    """A JSON shard that is one JSON document (an array, as json.dump and to_json(lines=False) write; an
    object indented over several lines), or no JSON at all (plain text, CSV, an Arrow file), rather than
    JSON lines: named with the conversion, before any worker starts, not as a line-1 record error whose
    --skip-invalid would skip every line. A shard whose head cannot be read is left to the reading,
    which names why."""
    with open(shard.path, "rb") as file:  # a missing or unreadable file: an OSError naming it
        stream, corrupt = _decompressed(shard, file)
        try:
            head = stream.read(HEAD_BYTES)
        except corrupt:
            return
    if shard.kind == "json":
        _refuse_misnamed(shard.path, head)
    else:
        _refuse_compressed_other(shard, head)
    if kind := _one_document(head):
        what = ("one JSON array" if kind == "array" else "indented JSON (an object over several lines)")
        raise DataError(f"{shard.path} is {what}, not JSON lines (one object per line)",
                        f"convert it, e.g. {_jq_command(shard, '.[]' if kind == 'array' else '.')}")
    _refuse_not_json(shard, head, keys[0])


def _jq_command(shard: Shard, select: str, raw: bool = False) -> str:
    """The shell line that converts a shard with jq's `select` filter into the JSON-lines file beside it
    (`raw`: each line of text is one input string)."""
    path, lines = shlex.quote(shard.path), shlex.quote(_lines_path(shard.path))
    jq = f"jq {'-R ' if raw else ''}-c {shlex.quote(select)}"
    unpack, pack = {"gzip": ("zcat ", " | gzip"), "zstd": ("zstd -dc ", " | zstd")}.get(shard.kind, ("", ""))
    return f"{unpack}{path} | {jq}{pack} > {lines}" if unpack else f"{jq} {path} > {lines}"


JSON_LINES_LOOKED_AT = 5  # non-blank lines of a shard's head, one of which is JSON in a JSON-lines shard
NOT_JSON = {".csv": "CSV", ".tsv": "TSV", ".arrow": "an Arrow file (Hugging Face save_to_disk)"}  # by the suffix


def _refuse_not_json(shard: Shard, head: bytes, key: str) -> None:
    """A shard none of whose first lines is JSON (plain text, one document a line; CSV; an Arrow file):
    named as what its suffix says, with the conversion. Where one of them is a JSON object or array or
    value (a string, a number), a bad line among them (a stray header, a damaged first record) is left to
    the reading, which names the record (--skip-invalid skips it)."""
    lines = [line.strip() for line in head.lstrip(b"\xef\xbb\xbf \t\r\n").split(b"\n")]
    if len(head) == HEAD_BYTES and len(lines) > 1:
        lines.pop()  # cut off by the head
    lines = [line for line in lines if line][:JSON_LINES_LOOKED_AT]
    if not lines or any(line.startswith((b"{", b"[")) or _parses(line) for line in lines):
        return
    name = shard.path[:-len(Path(shard.path).suffix)] if shard.kind != "json" else shard.path  # x.csv.gz -> x.csv
    suffix = next((suffix for suffix in NOT_JSON if name.lower().endswith(suffix)), None)
    what = NOT_JSON.get(suffix, "plain text")
    parquet = (name[:-len(suffix)] if suffix else name) + ".parquet"
    if what in ("CSV", "TSV"):
        separator = ", sep='\\t'" if what == "TSV" else ""
        fix = (f"convert it to Parquet and pass --json-keys with its text column, e.g. python -c \"import pandas; "
               f"pandas.read_csv({shard.path!r}{separator}).to_parquet({parquet!r})\"")
    elif what != "plain text":
        fix = (f"convert it to Parquet, e.g. python -c \"import datasets; "
               f"datasets.Dataset.from_file({shard.path!r}).to_parquet({parquet!r})\"")
    else:
        fix = f"convert it (one document a line), e.g. {_jq_command(shard, '{' + json.dumps(key) + ': .}', raw=True)}"
    raise DataError(f"{shard.path} is {what}, not JSON lines (one object per line)", fix)


def _one_document(head: bytes) -> str | None:
    """'array' or 'indented' where a JSON shard's first bytes show one JSON document, else None. JSON lines
    of arrays (a whole array on the first line, more lines after) are records, each named where it is read;
    a first line that is cut off or broken is left to the reading too."""
    first, newline, rest = head.lstrip(b"\xef\xbb\xbf \t\r\n").partition(b"\n")
    first = first.strip()
    if first.startswith(b"["):
        return None if newline and rest.strip() and _parses(first) else "array"
    opened = first.endswith((b"{", b"[", b",")) and not _parses(first)  # `{`, `{"text": "a",`: continued below
    return "indented" if first.startswith(b"{") and newline and opened else None


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        return False
    return True


def _lines_path(path: str) -> str:
    """The JSON-lines file beside `path` to convert it into: `x.json.gz` -> `x.jsonl.gz`, never `path` itself."""
    folder, name = os.path.split(path)
    compressed = next((suffix for suffix in (".gz", ".zst", ".zstd") if name.lower().endswith(suffix)), "")
    stem = name[:len(name) - len(compressed)]
    stem = next((stem[:-len(suffix)] for suffix in (".jsonl", ".json", ".txt") if stem.lower().endswith(suffix)), stem)
    lines = f"{stem}.jsonl{compressed}"
    return os.path.join(folder, lines if lines != name else f"{stem}.lines.jsonl{compressed}")


RECOMPRESS = "decompress it, or recompress it as .jsonl.gz or .jsonl.zst"
MAGIC = {  # the first bytes of what a file read as JSON lines may be instead -> (what it is, the fix)
    b"PAR1": ("a Parquet file, though its name says JSON lines", "name it *.parquet"),
    b"\x28\xb5\x2f\xfd": ("zstd-compressed, though its name says JSON lines", "name it *.jsonl.zst"),
    b"\x1f\x8b": ("gzip-compressed, though its name says JSON lines", "name it *.jsonl.gz"),
    b"BZh": ("bzip2-compressed, which is not read", RECOMPRESS),
    b"\xfd7zXZ\x00": ("xz-compressed, which is not read", RECOMPRESS),
    b"\x04\x22\x4d\x18": ("lz4-compressed, which is not read", RECOMPRESS),
    b"PK\x03\x04": ("a zip archive, which is not read", "unzip it and pass the files it holds"),
}


def _refuse_misnamed(path: str, head: bytes) -> None:
    """A file read as JSON lines for its name that is another format: named as such, not reported as
    invalid JSON with the fix --skip-invalid."""
    for magic, (problem, fix) in MAGIC.items():
        if head.startswith(magic):
            raise DataError(f"{path} is {problem}", fix)


def _refuse_compressed_other(shard: Shard, head: bytes) -> None:
    """A .gz / .zst shard that holds no JSON lines but a Parquet file (`x.parquet.gz`) or a tar archive
    (`x.tar.gz`), by its decompressed head: named as such, not reported as invalid JSON."""
    if head.startswith(b"PAR1"):
        raise DataError(f"{shard.path} is a {shard.kind}-compressed Parquet file, which is not read",
                        f"decompress it ({'gunzip' if shard.kind == 'gzip' else 'zstd -d'}) and pass the .parquet file")
    if head[257:262] == b"ustar":
        raise DataError(f"{shard.path} is a {shard.kind}-compressed tar archive, which is not read",
                        "extract it (tar -xf) and pass the files it holds")


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a zstd stream of one or more frames (as parallel writers and
    `cat a.zst b.zst` make), ended by a frame's end: zstandard's own stream_reader returns what it
    has when the input stops inside a frame, so a truncated download would pass as a shorter
    corpus; here it raises ZstdError."""

    def __init__(self, file):
        import zstandard

        self.file, self.decompressor, self.error = file, zstandard.ZstdDecompressor(), zstandard.ZstdError
        self.frame, self.in_frame, self.unused, self.out = (self.decompressor.decompressobj(), False, b"",
                                                            memoryview(b""))

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.out:
            compressed = self.unused or self.file.read(1 << 20)
            self.unused = b""
            if not compressed:
                if self.in_frame:
                    raise self.error("truncated: the stream ends inside a frame")
                return 0
            self.in_frame = True
            self.out = memoryview(self.frame.decompress(compressed))
            if self.frame.eof:  # the next frame starts in what this one left
                self.unused, self.in_frame, self.frame = (self.frame.unused_data, False,
                                                          self.decompressor.decompressobj())
        size = min(len(buffer), len(self.out))
        buffer[:size], self.out = self.out[:size], self.out[size:]
        return size


def _check_parquet(path: str, keys: tuple) -> None:
    """Refuses a shard that is not Parquet or lacks a text column `keys` names (its footer only): text
    is string, large_string, string_view, or a dictionary of them (_plain_text decodes each batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as file:
            schema = file.schema_arrow
    except (pa.ArrowException, ValueError, OSError) as error:
        refuse_lfs_pointer(path)  # a dataset cloned without git-lfs
        raise DataError(f"{path} is not a Parquet file ({_first_line(error)})",
                        "pass Parquet shards only, or name the file by its format (.jsonl, .jsonl.gz, .jsonl.zst)"
                        ) from None
    for key in keys:
        if key not in schema.names:
            raise DataError(f"{path} has no column {key!r} (it has {', '.join(schema.names)})",
                            "pass --json-keys with column names of the Parquet files")
        kind = schema.field(key).type
        text = kind.value_type if pa.types.is_dictionary(kind) else kind  # pandas categoricals are dictionaries
        if not (pa.types.is_string(text) or pa.types.is_large_string(text) or pa.types.is_string_view(text)):
            raise DataError(f"{path} column {key!r} holds {kind}, not text",
                            "pass --json-keys with text columns of the Parquet files")


def _first_line(error) -> str:
    """pyarrow's message without the lines it appends (a thrift error spans several)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _parquet_rows(path: str, keys: tuple):
    """(row number, {key: text or None}, UTF-8 bytes of the row's text, the file's size in proportion to
    the rows read) of one Parquet shard, read a record batch of the `keys` columns at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    number = 0
    try:
        with pq.ParquetFile(path) as file:
            stored, rows = os.path.getsize(path), max(file.metadata.num_rows, 1)
            for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=list(keys)):
                columns = [_plain_text(batch.column(key)) for key in keys]
                sizes = pc.binary_length(columns[0]).fill_null(0)
                for column in columns[1:]:
                    sizes = pc.add(sizes, pc.binary_length(column).fill_null(0))
                for values, size in zip(zip(*map(_python_text, columns)), sizes.to_pylist()):
                    number += 1
                    yield number, dict(zip(keys, values)), size, stored * number // rows
    except (pa.ArrowException, ValueError, OSError) as error:  # a corrupt page or decompression: OSError
        raise DataError(f"{path} row {number + 1}: the Parquet file cannot be read ({_first_line(error)})",
                        "download or write the shard again, or leave it out of --input") from None


def _python_text(column) -> list:
    """A batch's text column as str values (None for null); pyarrow leaves a writer's UTF-8 unchecked, so
    a value that is not UTF-8 stays bytes: that row alone is bad (its number named, --skip-invalid skips it)."""
    import pyarrow as pa

    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        return [_decoded(value) for value in column.cast(pa.large_binary()).to_pylist()]


def _decoded(value: bytes | None) -> str | bytes | None:
    try:
        return value.decode("utf-8") if value is not None else None
    except UnicodeDecodeError:
        return value


def _plain_text(column):
    """A batch's text column as string or large_string, the types pc.binary_length has kernels for:
    string_view is cast; a dictionary's values are cast first, then taken by its indices (a
    dictionary of string_view cannot be cast directly: no take kernel for string_view)."""
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        return column.dictionary.cast(pa.large_string()).take(column.indices)
    return column.cast(pa.large_string()) if pa.types.is_string_view(column.type) else column


def record_texts(raw, keys) -> dict | str:
    """A JSON line's bytes or a Parquet row's dict (Corpus.records) -> {key: text}, or why the
    record holds no text under those keys."""
    try:
        record = raw if isinstance(raw, dict) else json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"invalid JSON ({error.__class__.__name__}: {error})"
    if not isinstance(record, dict):
        return "not a JSON object"
    for key in keys:
        if key not in record:
            return f"no key {key!r}"
        if problem := _text_problem(key, record[key]):
            return problem
    return {key: record[key] for key in keys}


def _text_problem(key: str, value) -> str | None:
    """Why a record's value is no text a tokenizer takes, or None: not a string; a lone UTF-16 surrogate
    (JSON's "\\ud83d" escape, half an emoji cut off in a crawl); bytes that are not UTF-8 (a Parquet
    value, which corpus_files leaves undecoded)."""
    try:
        if isinstance(value, str):
            value.encode("utf-8")
            return None
        if isinstance(value, bytes):
            value.decode("utf-8")
    except UnicodeEncodeError as error:
        return (f"key {key!r} holds a lone UTF-16 surrogate (\\u{ord(value[error.start]):04x}) "
                f"at character {error.start + 1}")
    except UnicodeDecodeError as error:
        return f"key {key!r} is not valid UTF-8 (byte 0x{value[error.start]:02x} at byte {error.start + 1})"
    return f"key {key!r} is not a string"
