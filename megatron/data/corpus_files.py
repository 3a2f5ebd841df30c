"""Corpora as they are published: loose JSON (one object per line), plain or compressed
(`.gz`, `.zst`), and Parquet, as one file or a folder or glob of shards (shard_discovery.py finds
which files those are; this module reads them).

tools/preprocess_data.py reads every format as one stream of records in shard order: a JSON
line's raw bytes (the tokenizing workers parse them) or a Parquet row's dict of the asked-for
columns (pyarrow reads record batches of those columns only: no whole-file load, no other
column decoded). The same text gives the same records, so the same `.bin`/`.idx` bytes. A
shard that cannot be read is one DataError naming it; Parquet shards are checked (footer and
columns) before anything is written. pyarrow and zstandard are imported by the shards that need
them: loose JSON (and the trainer, which imports the preprocessing for its default corpus) pays
for neither.
"""
import gzip
import io
import json
import os
import re
import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path

from megatron.data.shard_discovery import (common_folder, glob_of, refuse_repeated_shards, refuse_several_splits,
                                           shard_paths)
from megatron.errors import ConfigError, DataError, refuse_lfs_pointer

PARQUET_BATCH_ROWS = 1024  # rows decoded at once: a batch of long articles stays a few MB
REDOWNLOAD = "download or compress it again (gzip -t / zstd -t test a file), or leave it out of --input"


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
        found = [shard_paths(one) for one in specs]
        paths = [path for shards, _ in found for path in shards]
        self.skipped = [path for _, skipped in found for path in skipped]  # files beside the shards, left out
        refuse_repeated_shards(paths)
        if len(specs) > 1:  # an unquoted glob the shell expanded: `--input hf/data/*`
            refuse_several_splits(f"the {len(specs)} --input values hold", common_folder(paths), paths)
        self.shards = [Shard(path, shard_kind(path)) for path in paths]
        self.total_bytes = sum(os.path.getsize(shard.path) for shard in self.shards)  # as stored (compressed)
        self.empty = [shard.path for shard in self.shards if shard.kind == "json" and not os.path.getsize(shard.path)]
        # 0-byte JSON lines: no documents (a compressed or Parquet shard of 0 bytes is refused as cut short)
        _refuse_description(self.shards, self.keys)
        schemas, names = {}, {}  # Parquet shard -> its schema; shard -> the keys of its first records or columns
        for shard in self.shards:
            if shard.kind == "parquet":
                schemas[shard.path] = _parquet_schema(shard.path)
                names[shard.path] = _flat_names(schemas[shard.path])
            elif (head_keys := _head_keys(shard, _refuse_one_document(shard, self.keys))) is not None:
                names[shard.path] = head_keys
        _refuse_disagreeing_keys(self.input, self.shards, names, self.keys)
        for path, schema in schemas.items():
            _check_parquet_columns(path, schema, self.keys)

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


SHARD_KINDS = {"json": "JSON-lines", "gzip": ".gz", "zstd": ".zst", "parquet": "Parquet"}  # in a count of shards


def _refuse_description(shards: list, keys: tuple) -> None:
    """A `.json` among several shards that is one JSON object without the keys: a dataset's description
    (a manifest, statistics) beside its shards, which read as a shard would be named as a bad record or as
    indented JSON to convert, where it is no corpus at all. Among `.json` shards only (a corpus of one
    document per file) such a file is a document without its key, a bad record (--skip-invalid)."""
    if all(shard.path.lower().endswith(".json") for shard in shards):
        return
    for shard in shards:
        if not shard.path.lower().endswith(".json") or os.path.getsize(shard.path) > HEAD_BYTES:
            continue
        try:
            document = json.loads(Path(shard.path).read_bytes())
        except ValueError:  # JSON lines, or no JSON: read as a shard
            continue
        if isinstance(document, dict) and not any(key in document for key in keys):
            others = [other.path for other in shards if other is not shard]
            kinds = {SHARD_KINDS[other.kind] for other in shards if other is not shard}
            kind = f"{kinds.pop()} " if len(kinds) == 1 else ""
            beside = f"{len(others)} {kind}shard{'s' if len(others) > 1 else ''}"
            pattern = glob_of(others)
            raise DataError(f"{shard.path} is one JSON object without {' or '.join(map(repr, keys))} (a dataset's "
                            f"description, not a corpus shard) beside {beside}, and --input reads it as a shard",
                            (f"pass the shards as a quoted glob, e.g. --input {shlex.quote(pattern)}, or " if pattern
                             else "") + "move it away from the shards")


def _json_lines(shard: Shard):
    """(line number, raw bytes, bytes, offset in the file as stored) of the non-blank lines of a plain or
    compressed JSON-lines file."""
    file = open(shard.path, "rb")  # a missing or unreadable file: an OSError naming it
    corrupt = ()  # what a damaged compressed stream raises
    try:
        if shard.kind != "json" and not file.peek(1):  # gzip and zstd read 0 bytes as an empty text
            raise DataError(f"{shard.path} is empty (0 bytes), not a complete {shard.kind} file", REDOWNLOAD)
        _refuse_misnamed(shard, file.peek(MAGIC_BYTES))
        lines, corrupt = _decompressed(shard, file)
        if shard.kind != "json":
            _refuse_compressed_other(shard, lines.peek(512))
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


def _refuse_one_document(shard: Shard, keys: tuple) -> bytes | None:
    """A JSON shard that is one JSON document (an array, as json.dump and to_json(lines=False) write; an
    object indented over several lines), or no JSON at all (plain text, CSV, an Arrow file), rather than
    JSON lines: named with the conversion, before any worker starts, not as a line-1 record error whose
    --skip-invalid would skip every line. The same for what its first bytes show to be no UTF-8 JSON lines:
    another format than its name says, UTF-16 or UTF-32 text, lines ended by CR alone, objects followed by
    commas. A shard whose head cannot be read is left to the reading, which names why. Returns the head read
    (decompressed), None where it cannot be read."""
    with open(shard.path, "rb") as file:  # a missing or unreadable file: an OSError naming it
        _refuse_misnamed(shard, file.peek(MAGIC_BYTES))
        stream, corrupt = _decompressed(shard, file)
        try:
            head = stream.read(HEAD_BYTES)
        except corrupt:
            return None
    _refuse_wide_text(shard, head)
    if shard.kind != "json":
        _refuse_compressed_other(shard, head)
    _refuse_cr_line_ends(shard, head)
    if kind := _one_document(head):
        if kind == "comma":
            without_commas = _conversion(shard, _quoted_command("sed", "s/,[[:space:]]*$//"))
            raise DataError(f"{shard.path} ends its first line with a comma after the object: JSON lines hold one "
                            "object a line, with nothing between them", f"remove the commas, e.g. {without_commas}")
        what = ("one JSON array" if kind == "array" else "indented JSON (an object over several lines)")
        raise DataError(f"{shard.path} is {what}, not JSON lines (one object per line)",
                        f"convert it, e.g. {_jq_command(shard, '.[]' if kind == 'array' else '.')}")
    _refuse_not_json(shard, head, keys[0])
    return head


def _jq_command(shard: Shard, select: str, raw: bool = False) -> str:
    """The shell line that converts a shard with jq's `select` filter into the JSON-lines file beside it
    (`raw`: each line of text is one input string)."""
    return _conversion(shard, _quoted_command("jq", *(["-R"] if raw else []), "-c", select))


def _quoted_command(*words: str) -> str:
    return " ".join(map(shlex.quote, words))


def _conversion(shard: Shard, command: str, tag: str = "lines", file_argument: bool = True) -> str:
    """The shell line that passes a shard through `command` into the file beside it (_lines_path's, with `tag`),
    decompressed before and compressed after as the shard is (`file_argument`: the command takes the file's
    name, else it reads the file on its standard input)."""
    path, lines = shlex.quote(shard.path), shlex.quote(_lines_path(shard.path, tag))
    unpack, pack = {"gzip": ("zcat ", " | gzip"), "zstd": ("zstd -dc ", " | zstd")}.get(shard.kind, ("", ""))
    if unpack:
        return f"{unpack}{path} | {command}{pack} > {lines}"
    return f"{command} {path} > {lines}" if file_argument else f"{command} < {path} > {lines}"


WIDE_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
             b"\xfe\xff": "UTF-16"}  # byte-order marks (UTF-32's first: UTF-16's little-endian one begins it)
WIDE_ENCODINGS = ("UTF-32LE", "UTF-32BE", "UTF-16LE", "UTF-16BE")  # the order they are tried in without a mark


def _wide_encoding(head: bytes) -> tuple | None:
    """(the UTF-16 or UTF-32 encoding of a file's first bytes, as iconv names it, and whether it starts with a
    byte-order mark), or None. Windows saves "Unicode" text as UTF-16 with a mark (Notepad, PowerShell's
    Out-File); without one, NUL bytes tell it, which UTF-8 JSON never holds: the encoding is the one that reads
    the head as JSON, starting `{` or `[`, without a NUL character."""
    for mark, encoding in WIDE_BOMS.items():
        if head.startswith(mark):
            return encoding, True
    sample = head[:4096]
    if b"\x00" not in sample:
        return None
    for encoding in WIDE_ENCODINGS:
        text = sample[:len(sample) // 4 * 4].decode(encoding, errors="replace")
        if text.lstrip(" \t\r\n").startswith(("{", "[")) and "\x00" not in text:
            return encoding, False
    return None


def _refuse_wide_text(shard: Shard, head: bytes) -> None:
    """A JSON shard saved as UTF-16 or UTF-32: refused before any worker starts, with --skip-invalid too, rather
    than read line by line as UTF-8, where its records fail or, cut across its code units, pass by luck."""
    if found := _wide_encoding(head):
        encoding, marked = found
        source = encoding[:6] if marked else encoding  # iconv reads the mark of UTF-16 / UTF-32 and drops it
        to_utf8 = _conversion(shard, _quoted_command("iconv", "-f", source, "-t", "UTF-8"), "utf8")
        raise DataError(f"{shard.path} is {encoding} text{'' if marked else ' without a byte-order mark'}, not UTF-8 "
                        "(JSON lines are read as UTF-8)", f"convert it, e.g. {to_utf8}")


TR_CR_TO_LF = "tr '\\r' '\\n'"  # each CR a LF: tr reads the escapes


def _refuse_cr_line_ends(shard: Shard, head: bytes) -> None:
    """A JSON shard whose lines end in CR alone (classic Mac OS): read as one line, the whole file is one bad
    record, which --skip-invalid skips. Told by a first line that is several JSON values between CRs."""
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n").partition(b"\n")[0]
    pieces = [piece for piece in first.split(b"\r") if piece.strip()]
    if len(pieces) > 1 and _parses(pieces[0]):
        to_lf = _conversion(shard, TR_CR_TO_LF, "lf", file_argument=False)
        raise DataError(f"{shard.path} ends its lines with CR alone (classic Mac line ends), so it reads as one line",
                        f"convert them to LF, e.g. {to_lf}")


JSON_LINES_LOOKED_AT = 5  # non-blank lines of a shard's head, one of which is JSON in a JSON-lines shard
NOT_JSON = {".csv": "CSV", ".tsv": "TSV"}  # by the suffix (an Arrow file by its first bytes: MAGIC)


def _refuse_not_json(shard: Shard, head: bytes, key: str) -> None:
    """A shard none of whose first lines is JSON (plain text, one document a line; CSV):
    named as what its suffix says, with the conversion. Where one of them is a JSON object or array or
    value (a string, a number), a bad line among them (a stray header, a damaged first record) is left to
    the reading, which names the record (--skip-invalid skips it)."""
    lines = _head_lines(head)
    if not lines or any(line.startswith((b"{", b"[")) or _parses(line) for line in lines):
        return
    refuse_lfs_pointer(shard.path)  # text too: a dataset cloned without git-lfs
    name = shard.path[:-len(Path(shard.path).suffix)] if shard.kind != "json" else shard.path  # x.csv.gz -> x.csv
    suffix = next((suffix for suffix in NOT_JSON if name.lower().endswith(suffix)), None)
    what = NOT_JSON.get(suffix, "plain text")
    parquet = (name[:-len(suffix)] if suffix else name) + ".parquet"
    if what in ("CSV", "TSV"):
        separator = ", sep='\\t'" if what == "TSV" else ""
        fix = (f"convert it to Parquet and pass --json-keys with its text column, e.g. python -c \"import pandas; "
               f"pandas.read_csv({shard.path!r}{separator}).to_parquet({parquet!r})\"")
    else:
        fix = f"convert it (one document a line), e.g. {_jq_command(shard, '{' + json.dumps(key) + ': .}', raw=True)}"
    raise DataError(f"{shard.path} is {what}, not JSON lines (one object per line)", fix)


def _head_lines(head: bytes) -> list:
    """The first JSON_LINES_LOOKED_AT non-blank lines of a JSON shard's head (the last one only where the head
    holds the whole file: else the head may cut it), stripped."""
    lines = [line.strip() for line in head.lstrip(b"\xef\xbb\xbf \t\r\n").split(b"\n")]
    if len(head) == HEAD_BYTES and len(lines) > 1:
        lines.pop()  # cut off by the head
    return [line for line in lines if line][:JSON_LINES_LOOKED_AT]


def _head_keys(shard: Shard, head: bytes | None) -> list | None:
    """The keys (dotted where nested, as --json-keys names them) of the JSON objects among a JSON-lines shard's
    first lines, or None where those do not tell what keys its records have: no object among them, or a shard
    that is one record (the whole file one line: a corpus of one document per `.json` file, whose file without
    the key is one bad record, which --skip-invalid skips)."""
    if not head:
        return None
    records = []
    for line in _head_lines(head):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    if not records or (len(head) < HEAD_BYTES and len(_head_lines(head)) == 1):
        return None
    return list(dict.fromkeys(key for record in records for key in _flat_keys(record)))


def _refuse_disagreeing_keys(spec: str, shards: list, names: dict, keys: tuple) -> None:
    """Shards that name their text differently (a Parquet shard's column `content`, a JSON shard's key
    `text`; two exports of one dataset): whichever --json-keys is passed, some shard lacks it, and the
    refusal of that shard alone would send the user from one key to the other. `names`: each shard's
    keys (JSON: those of its first records) or columns, where known."""
    for key in keys:
        holding = [shard for shard in shards if shard.path in names and _names_key(names[shard.path], key)]
        lacking = [shard for shard in shards if shard.path in names and not _names_key(names[shard.path], key)]
        if not holding or not lacking:
            continue
        shard, more = lacking[0], f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        what = (f"column {key!r} (it has" if shard.kind == "parquet" else f"key {key!r} in its first records (their "
                                                                            "keys:")
        others = [other.path for other in shards if other not in holding]
        patterns = [glob_of([other.path for other in holding]), glob_of(others)]
        apart = (f", a quoted glob each (--input {shlex.quote(patterns[0])} and --input {shlex.quote(patterns[1])})"
                 if all(patterns) else "")
        raise DataError(f"--input {spec}: its shards disagree on {key!r}: {shard.path}{more} has no {what} "
                        f"{', '.join(names[shard.path])}), but {holding[0].path} has it",
                        f"preprocess them apart{apart}, each with its own --json-keys, or rename the column or key "
                        f"so that every shard has {key!r}")


def _names_key(names: list, key: str) -> bool:
    """Whether a shard's keys or columns (flattened, `doc.text`) hold `key`, or a nested key below it."""
    return key in names or any(name.startswith(f"{key}.") for name in names)


def _one_document(head: bytes) -> str | None:
    """'array' or 'indented' where a JSON shard's first bytes show one JSON document, 'comma' where its first
    line is an object and a comma (objects pasted out of an array), else None. JSON lines of arrays (a whole
    array on the first line, more lines after) are records, each named where it is read; a first line that
    is cut off or broken is left to the reading too."""
    first, newline, rest = head.lstrip(b"\xef\xbb\xbf \t\r\n").partition(b"\n")
    first = first.strip()
    if first.startswith(b"["):
        return None if newline and rest.strip() and _parses(first) else "array"
    if first.startswith(b"{") and first.endswith(b",") and _parses(first[:-1]):
        return "comma"
    opened = first.endswith((b"{", b"[", b",")) and not _parses(first)  # `{`, `{"text": "a",`: continued below
    return "indented" if first.startswith(b"{") and newline and opened else None


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        return False
    return True


def _lines_path(path: str, tag: str = "lines") -> str:
    """The JSON-lines file beside `path` to convert it into: `x.json.gz` -> `x.jsonl.gz`, never `path` itself
    (`x.jsonl` -> `x.{tag}.jsonl`)."""
    folder, name = os.path.split(path)
    compressed = next((suffix for suffix in (".gz", ".zst", ".zstd") if name.lower().endswith(suffix)), "")
    stem = name[:len(name) - len(compressed)]
    stem = next((stem[:-len(suffix)] for suffix in (".jsonl", ".json", ".txt") if stem.lower().endswith(suffix)), stem)
    lines = f"{stem}.jsonl{compressed}"
    return os.path.join(folder, lines if lines != name else f"{stem}.{tag}.jsonl{compressed}")


RECOMPRESS = "decompress it, or recompress it as .jsonl.gz or .jsonl.zst"
MAGIC = {  # the first bytes of a file -> (what it is, the suffix of the names it is read by, or None and the fix)
    b"PAR1": ("a Parquet file", ".parquet", None),
    b"\x28\xb5\x2f\xfd": ("zstd-compressed", ".jsonl.zst", None),
    b"\x1f\x8b": ("gzip-compressed", ".jsonl.gz", None),
    b"BZh": ("bzip2-compressed, which is not read", None, RECOMPRESS),
    b"\xfd7zXZ\x00": ("xz-compressed, which is not read", None, RECOMPRESS),
    b"\x04\x22\x4d\x18": ("lz4-compressed, which is not read", None, RECOMPRESS),
    b"PK\x03\x04": ("a zip archive, which is not read", None, "unzip it and pass the files it holds"),
    b"ARROW1": ("an Arrow (Feather) file, which is not read", None, lambda path: _as_parquet(
        path, "pyarrow.feather.read_table({})")),
    b"\xff\xff\xff\xff": ("an Arrow stream (as datasets' save_to_disk writes), which is not read", None,
                          lambda path: _as_parquet(path, "pyarrow.ipc.open_stream({}).read_all()")),
}
MAGIC_BYTES = 512  # of a file's first bytes, to tell its format (and uncompressed text) by
ZSTD_SKIPPABLE = re.compile(rb"[\x50-\x5f]\x2a\x4d\x18")  # a zstd stream may start with a skippable frame
NAME_SAYS = {"json": "JSON lines", "gzip": "gzip", "zstd": "zstd", "parquet": "Parquet"}  # shard_kind's, in words


def _refuse_misnamed(shard: Shard, head: bytes) -> None:
    """A shard whose first bytes show another format than its name says (JSON lines named .gz, gzip named
    .zst or .parquet, Parquet named .jsonl): named as what it is, with the name to give it; not reported as
    invalid JSON (--skip-invalid), an unreadable gzip or zstd stream, or a file that is not Parquet
    ("download it again")."""
    for magic, (what, suffix, fix) in MAGIC.items():
        if head.startswith(magic):
            if suffix is None:
                raise DataError(f"{shard.path} is {what}", fix(shard.path) if callable(fix) else fix)
            if shard_kind(suffix) == shard.kind:
                return
            _refuse_renamed(shard, f"{what}, though its name says {NAME_SAYS[shard.kind]}", suffix)
    if shard.kind == "zstd" and ZSTD_SKIPPABLE.match(head):
        return
    if shard.kind != "json" and (what := _text_head(head)):
        refuse_lfs_pointer(shard.path)  # a dataset cloned without git-lfs: text too
        _refuse_renamed(shard, f"uncompressed {what}, though its name says {NAME_SAYS[shard.kind]}", ".jsonl")


def _as_parquet(path: str, reads: str) -> str:
    """The fix for an Arrow file at `path` that `reads` (a pyarrow call, {} for the path) reads: named .arrow,
    written as Parquet beside it."""
    arrow = path if path.lower().endswith((".arrow", ".feather")) else None
    stem = os.path.splitext(path)[0] if arrow else _renamed(path, ".parquet").removesuffix(".parquet")
    arrow = arrow or stem + ".arrow"
    code = f"import pyarrow.feather, pyarrow.ipc, pyarrow.parquet; pyarrow.parquet.write_table(" \
           f"{reads.format(repr(arrow))}, {stem + '.parquet'!r})"
    rename = f"mv {shlex.quote(path)} {shlex.quote(arrow)} && " if arrow != path else ""
    return f"write it as Parquet: {rename}python -c \"{code}\""


def _refuse_renamed(shard: Shard, problem: str, suffix: str) -> None:
    renamed = _renamed(shard.path, suffix)
    raise DataError(f"{shard.path} is {problem}",
                    f"name it *{suffix}, e.g. mv {shlex.quote(shard.path)} {shlex.quote(renamed)}")


def _renamed(path: str, suffix: str) -> str:
    """`path` named for the format `suffix` says (.parquet, .jsonl, .jsonl.gz, .jsonl.zst), its own format and
    compression suffixes replaced: `x.jsonl.zst` -> `x.jsonl.gz`, `x.json` -> `x.json.gz`, `x.parquet` ->
    `x.jsonl`."""
    stem = next((path[:-len(old)] for old in (".gz", ".zst", ".zstd", ".parquet") if path.lower().endswith(old)), path)
    json_suffix = next((old for old in (".jsonl", ".json") if stem.lower().endswith(old)), "")
    if suffix == ".parquet":
        return stem[:len(stem) - len(json_suffix)] + suffix
    return stem + suffix[len(".jsonl"):] if json_suffix else stem + suffix


def _text_head(head: bytes) -> str | None:
    """'JSON text' or 'text' where a file's first bytes are uncompressed text (UTF-8, UTF-16 or UTF-32), else None
    (a binary format, a damaged stream)."""
    wide = _wide_encoding(head)
    sample = head[:MAGIC_BYTES]
    try:
        text = sample.decode(wide[0] if wide else "utf-8")
    except UnicodeDecodeError as error:
        if wide or error.start < len(sample) - 3:  # not a UTF-8 character the sample cut
            return None
        text = sample[:error.start].decode("utf-8")
    text = text.lstrip("\ufeff")
    if not text.strip() or any(ord(char) < 32 and char not in "\t\n\r\f" for char in text):
        return None
    return "JSON text" if text.lstrip().startswith(("{", "[")) else "text"


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


def _parquet_schema(path: str):
    """The Arrow schema of a Parquet shard (its footer only); refuses a shard that is not Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as file:
            return file.schema_arrow
    except (pa.ArrowException, ValueError, OSError) as error:
        refuse_lfs_pointer(path)  # a dataset cloned without git-lfs
        _refuse_damaged_parquet(path, error)
        raise DataError(f"{path} is not a Parquet file ({_first_line(error)})",
                        "pass Parquet shards only, or name the file by its format (.jsonl, .jsonl.gz, .jsonl.zst)"
                        ) from None


def _check_parquet_columns(path: str, schema, keys: tuple) -> None:
    """Refuses a Parquet shard that lacks a text column `keys` names: text is string, large_string,
    string_view, or a dictionary of them (_plain_text decodes each batch); a struct's field is named as
    pyarrow's flatten() names it (`doc.text`)."""
    import pyarrow as pa

    for key in keys:
        column = _parquet_column(schema, key)
        if key in schema.names and _struct_field(schema, key) is not None:
            raise DataError(f"{path} has both a column {key!r} and a field {key.rpartition('.')[2]!r} of the struct "
                            f"column {key.rpartition('.')[0]!r}: --json-keys {key} could mean either",
                            "rename one of them in the Parquet files")
        if column is None:
            raise DataError(f"{path} has no column {key!r} (it has {', '.join(_flat_names(schema))})",
                            "pass --json-keys with column names of the Parquet files")
        kind = column[1].type
        text = kind.value_type if pa.types.is_dictionary(kind) else kind  # pandas categoricals are dictionaries
        if not (pa.types.is_string(text) or pa.types.is_large_string(text) or pa.types.is_string_view(text)):
            fields = f" (its fields: {', '.join(_flat_names(kind, f'{key}.'))})" if _is_struct(kind) else ""
            raise DataError(f"{path} column {key!r} holds {kind}, not text{fields}",
                            "pass --json-keys with text columns of the Parquet files")


def _parquet_column(schema, key: str) -> tuple | None:
    """(the names from a top-level column down, its pyarrow field) of the column `key` names: the column
    of that name, else `doc.text` as the field `text` of the struct column `doc` (pyarrow's flatten()
    naming, as a Hugging Face dataset of nested records shows it); None: no such column or field."""
    if key in schema.names:
        return [key], schema.field(key)
    field = _struct_field(schema, key)
    return None if field is None else (key.split("."), field)


def _struct_field(schema, key: str):
    """The field a dotted `key` names down struct columns (`doc.text`: the field `text` of the column `doc`),
    or None (a key without a dot names a column, not a field)."""
    if "." not in key:
        return None
    field, fields = None, schema
    for name in key.split("."):
        index = fields.get_field_index(name) if fields is not None else -1
        if index < 0:
            return None
        field = fields.field(index)
        fields = field.type if _is_struct(field.type) else None
    return field


def _is_struct(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_struct(kind)


def _flat_names(fields, prefix: str = "") -> list:
    """The names of a schema's (or a struct's) columns, a struct's fields as flatten() names them (`doc.text`)."""
    names = []
    for field in fields:
        name = prefix + field.name
        names += _flat_names(field.type, f"{name}.") if _is_struct(field.type) else [name]
    return names


def _refuse_damaged_parquet(path: str, error: Exception) -> None:
    """A .parquet shard pyarrow cannot open that is empty, or starts as Parquet: cut short (its end, the footer,
    is gone: a download or copy that stopped) or with a damaged footer; or that is another format
    (_refuse_misnamed's)."""
    with open(path, "rb") as file:
        head = file.read(MAGIC_BYTES)
        file.seek(max(os.path.getsize(path) - len(b"PAR1"), 0))
        end = file.read()
    if not head:
        raise DataError(f"{path} is empty (0 bytes), not a complete Parquet file",
                        "download or write it again, or leave it out of --input")
    if not head.startswith(b"PAR1"):
        _refuse_misnamed(Shard(path, "parquet"), head)
    elif end != b"PAR1":
        raise DataError(f"{path} is a truncated Parquet file: it starts as one, but its end (the footer) is missing, "
                        "as when a download or copy stops part-way", "download or copy it again, or leave it out of "
                                                                     "--input")
    else:
        raise DataError(f"{path} is a damaged Parquet file: its footer cannot be read ({_first_line(error)})",
                        "download or write it again, or leave it out of --input")


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
            paths = [_parquet_column(file.schema_arrow, key)[0] for key in keys]  # checked: _check_parquet_columns
            for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=list(keys)):
                columns = [_plain_text(_field_column(batch, path)) for path in paths]
                sizes = pc.binary_length(columns[0]).fill_null(0)
                for column in columns[1:]:
                    sizes = pc.add(sizes, pc.binary_length(column).fill_null(0))
                for values, size in zip(zip(*map(_python_text, columns)), sizes.to_pylist()):
                    number += 1
                    yield number, dict(zip(keys, values)), size, stored * number // rows
    except (pa.ArrowException, ValueError, OSError) as error:  # a corrupt page or decompression: OSError
        raise DataError(f"{path} row {number + 1}: the Parquet file cannot be read ({_first_line(error)})",
                        "download or write the shard again, or leave it out of --input") from None


def _field_column(batch, path: list):
    """The column of a record batch that a _parquet_column path names: a struct's field with the struct's nulls
    (pc.struct_field; a row whose struct is null has no text)."""
    import pyarrow.compute as pc

    column = batch.column(path[0])
    return pc.struct_field(column, path[1:]) if len(path) > 1 else column


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
    texts = {}
    for key in keys:
        value = _value_at(record, key)
        if value is _MISSING:
            return MissingKey(f"no key {key!r} (its keys: {', '.join(map(repr, _flat_keys(record))) or 'none'})")
        if problem := _text_problem(key, value):
            return problem
        texts[key] = value
    return texts


class MissingKey(str):
    """record_texts' problem of a record that lacks a key: on a corpus's first record the keys are what to fix."""


_MISSING = object()


def _value_at(record: dict, key: str):
    """The value of `key` in a record: its own key, else a dotted path into nested objects (`doc.text`, as a
    Parquet struct's field is named, so JSON lines and Parquet of one dataset read alike); _MISSING if none."""
    if key in record:
        return record[key]
    value = record
    for name in key.split("."):
        if not isinstance(value, dict) or name not in value:
            return _MISSING
        value = value[name]
    return value


def _flat_keys(record: dict, prefix: str = "") -> list:
    """A record's keys, a nested object's as dotted paths (`doc.text`), as --json-keys names them."""
    keys = []
    for key, value in record.items():
        keys += _flat_keys(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [prefix + key]
    return keys


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
