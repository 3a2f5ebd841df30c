"""The index maps a run caches next to its data (or in --data-cache-path), and the ones older
settings or older data left behind.

bert_dataset.py saves `{maps}_{split}_indexmap_*.npy` and `{maps}_{split}_packmap_*.npy`
named by every setting that shapes them (samples, sequence length, seed, documents, packing), so
another --train-iters, batch, --split or --seq-length builds new maps and leaves the old ones.
`{maps}` is `{folder}/{name}-{fingerprint}`: the folder is the data's own, or --data-cache-path
(data on a read-only mount keeps its maps in a writable folder), and the fingerprint is of the
data's contents, not its path (which a job's mount changes): later jobs on the same data reuse
the maps, and data preprocessed again into the same prefix, or another corpus of the same name in
a shared cache, gets maps of its own. Next to the data, maps of another fingerprint, or of none
(named before fingerprints), are of older data: preprocessing removes them when it overwrites
the prefix, and the start-up line counts them with the maps of other settings.
The trainer says where they are at start-up and lists the ones it uses in
`<log-dir>/index_maps.json`; tools/clean_index_maps.py removes the others (or all: any missing
map is rebuilt on the next start). No torch here: the tool stays fast.
"""
import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import socket
import time
from pathlib import Path

from megatron import locks
from megatron.parallel import jit_locks
from megatron.paths import in_repository, python_command

SPLITS = ("train", "valid", "test")
KINDS = ("indexmap", "packmap")
# in the log directory: {"maps": [absolute paths], "data": [the data prefixes, resolved], "data_cache_path": its
# folder resolved, or null}; a record written before runs named their data holds "maps" alone
USED_FILE = "index_maps.json"
MAP_NAME = rf"_({'|'.join(SPLITS)})_({'|'.join(KINDS)})_.*\.npy"  # after the maps prefix's name

FINGERPRINT_RECORD = ".fingerprint.json"  # beside the .bin/.idx: the digest and the stamps it is of
COPIES_KEPT = 256  # stamp sets one record keeps: one path's copies on several nodes (about 200 bytes each)
BIN_WHOLE_BYTES = 16 << 20  # a .bin up to this size is hashed whole; a larger one by its size and samples:
BIN_BLOCKS, BIN_BLOCK_BYTES = 256, 64 << 10  # 16 MiB read, evenly spread, first and last bytes included


def fingerprint(prefix: str, *, cache_path: str | None, write_record: bool = True) -> str:
    """10 hex digits of the data's contents: the whole `.idx` (every document boundary and sentence
    size, all that a map is built from), the `.bin`'s size and its bytes (whole up to 16 MiB, else
    256 evenly spread blocks of 64 KiB). The same for a copy of the data wherever it is mounted,
    different for other text in the same prefix: other sizes change the `.idx`, other tokens of the
    same sizes the `.bin` (a large `.bin` changed only between the sampled blocks keeps its
    fingerprint; preprocessing removes the maps next to the data it overwrites anyway).

    Hashing a sentence-level `.idx` reads about 40% of the data (40 GB of a 100 GB corpus), so the
    digest is kept in `{prefix}.fingerprint.json`, stamped with both files' size, mtime, ctime and
    inode: preprocessing writes it, every later start on unchanged files reads it instead, and files
    written since (another stamp) are hashed again and recorded. With a `cache_path` (--data-cache-path:
    the data is only read; a caller without one says None) a training start keeps its record there,
    named by the data's path, and writes nothing beside the data. Where the folder cannot be written,
    or with `write_record` False (a dry run), every process hashes once (and once only: unchanged files
    are cached)."""
    stamps = file_stamps(prefix)
    records = [fingerprint_path(prefix)] + ([fingerprint_path(prefix, cache_path)] if cache_path else [])
    digest = next(filter(None, (_recorded_digest(record, stamps) for record in records)), None)
    if digest is None:
        digest = _contents_digest(f"{prefix}.idx", f"{prefix}.bin", *map(tuple, stamps))
        if write_record:
            _record_digest(records[-1], stamps, digest)
    return digest


def fingerprint_path(prefix: str, cache_path: str | None = None) -> Path:
    """The record beside the data, or in the cache folder (named by the data's absolute path: two
    corpora of one name in other folders keep a record each)."""
    if not cache_path:
        return Path(f"{prefix}{FINGERPRINT_RECORD}")
    where = hashlib.sha1(os.path.realpath(prefix).encode()).hexdigest()[:8]
    return Path(cache_path) / f"{Path(prefix).name}-{where}{FINGERPRINT_RECORD}"


def file_stamps(prefix: str) -> list[list[int]]:
    """(size, mtime, ctime, inode) of the `.idx` and the `.bin`: a file rewritten, in place or renamed
    over, changes at least one (ctime cannot be set back by a copy that keeps the mtime)."""
    stats = [os.stat(f"{prefix}{suffix}") for suffix in (".idx", ".bin")]
    return [[st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] for st in stats]


def _recorded_digest(record: Path, stamps: list) -> str | None:
    """The digest recorded for files of these stamps, else None."""
    return next((copy["fingerprint"] for copy in _recorded_copies(record) if copy.get("stamps") == stamps), None)


def _recorded_copies(record: Path) -> list[dict]:
    """The {"fingerprint", "stamps"} of each copy a record holds, oldest first; [] for none or a damaged
    one. A record of one copy (as written before records held several) is that copy."""
    try:
        recorded = json.loads(record.read_text())
        copies = recorded.get("copies", [recorded])
        return [copy for copy in copies if isinstance(copy["fingerprint"], str)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def _record_digest(record: Path, stamps: list, digest: str) -> None:
    """Adds the copy to the record, keeping the last COPIES_KEPT others: nodes whose own copies of one
    path (other inodes, ctimes) share a cache folder each find theirs, instead of hashing again on every
    start and replacing each other's. Written whole (a temporary file renamed: ranks starting together
    each write the same; two nodes writing at once may drop the other's new copy, hashed again on its
    next start). A folder that cannot be written (a read-only mount) only costs the next start a hash."""
    copies = [copy for copy in _recorded_copies(record) if copy.get("stamps") != stamps][1 - COPIES_KEPT:]
    partial = record.with_name(f"{record.name}.partial-{socket.gethostname()}-{os.getpid()}")  # nodes share folders
    try:
        record.parent.mkdir(parents=True, exist_ok=True)  # a cache folder no map was saved in yet
        partial.write_text(json.dumps({"copies": [*copies, {"fingerprint": digest, "stamps": stamps}]}) + "\n")
        os.replace(partial, record)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)


@functools.lru_cache(maxsize=64)
def _contents_digest(idx_path: str, bin_path: str, *cache_key) -> str:
    # cache_key (both files' stamps) is unused in the body on purpose: it is part of the lru_cache
    # key, so a changed file is digested again
    return _hash_contents(idx_path, bin_path)


def _hash_contents(idx_path: str, bin_path: str) -> str:
    digest = hashlib.sha1()
    with open(idx_path, "rb") as file:
        digest.update(hashlib.file_digest(file, "sha1").digest())
    sampled_contents(digest, bin_path)
    return digest.hexdigest()[:10]


def sampled_contents(digest, path) -> None:
    """Adds file `path`'s size and bytes to `digest`: whole up to BIN_WHOLE_BYTES, else BIN_BLOCKS evenly spread
    blocks (the first and last bytes included), so a large file costs 16 MiB of reading. What the data's
    fingerprint reads of a `.bin`; same_settings compares the nodes' checkpoints and weights files by it too."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        digest.update(str(size).encode())
        if size <= BIN_WHOLE_BYTES:
            digest.update(hashlib.file_digest(file, "sha1").digest())
        else:
            for block in range(BIN_BLOCKS):
                file.seek(block * (size - BIN_BLOCK_BYTES) // (BIN_BLOCKS - 1))
                digest.update(file.read(BIN_BLOCK_BYTES))


def maps_prefix(prefix: str, *, cache_path: str | None) -> str:
    """The prefix a data prefix's map files are named from: `{folder}/{name}-{fingerprint}`, the
    folder being the data's own or the cache folder."""
    return str(maps_folder(prefix, cache_path) / f"{Path(prefix).name}-{fingerprint(prefix, cache_path=cache_path)}")


def maps_folder(prefix: str, cache_path: str | None = None) -> Path:
    """Where the maps of a data prefix live: the cache folder, else the data's own."""
    return Path(cache_path) if cache_path else Path(prefix).parent


def maps_of(prefix: str, *, cache_path: str | None, write_record: bool = True) -> list[Path]:
    """The map files of a data prefix (any settings), including `.partial` leftovers of a build
    that was killed; sorted. In a cache folder those of the data's fingerprint (another
    fingerprint may be another corpus of the same name; `write_record` as in fingerprint); next to
    the data, those of any fingerprint or none (older data of this prefix)."""
    name = re.escape(Path(prefix).name)
    pattern = (rf"{name}-{fingerprint(prefix, cache_path=cache_path, write_record=write_record)}" if cache_path
               else rf"{name}(-[0-9a-f]{{10}})?")
    return _maps_matching(maps_folder(prefix, cache_path), pattern + MAP_NAME)


def maps_of_prefixes(prefixes: list, *, cache_path: str | None, write_record: bool = True) -> list[Path]:
    """maps_of of each prefix, each map once: a prefix given twice (two spellings of it, `a/b` and
    `a/../a/b`, or a folder and a link to it) was counted, sized and removed twice."""
    found = {}
    for prefix in prefixes:
        for path in maps_of(prefix, cache_path=cache_path, write_record=write_record):
            found.setdefault(path.resolve(), path)
    return list(found.values())


_PARTIAL = re.compile(r"\.partial-(?P<host>.+)-(?P<pid>\d+)\.npy")  # bert_dataset._save_built's staging name


def builder(path: Path) -> str | None:
    """"pid N on this host (H)" or "pid N on host H" of the start-up writing the partial map `path` now; None for
    a finished map, or a partial its build left when killed: on this host one no process holds open (the build
    holds it open until it is renamed; a process of another user, whose files cannot be seen, by its pid), on
    another host one untouched for locks.LOCK_STALE_S. Removing a live build's file stops that run."""
    match = _PARTIAL.search(path.name)
    if match is None:
        return None
    host, pid = match["host"], int(match["pid"])
    try:
        status = path.stat()
    except OSError:
        return None
    if host == socket.gethostname():
        if os.access(f"/proc/{pid}/fd", os.R_OK):
            live = (status.st_dev, status.st_ino) in jit_locks.held_open()
        else:  # no /proc, or another user's process: its pid tells
            live = locks.running(pid)
        return f"pid {pid} on this host ({host})" if live else None
    return locks.live_elsewhere(host, pid, time.time() - status.st_mtime)


def remove_stale(prefix: str) -> list[Path]:
    """Removes the maps next to the data that were built from other data of this prefix (another
    fingerprint, or none): preprocessing calls it after overwriting the prefix. Returns them."""
    current = re.compile(rf"{re.escape(Path(prefix).name)}-{fingerprint(prefix, cache_path=None)}{MAP_NAME}")
    stale = [path for path in maps_of(prefix, cache_path=None) if not current.fullmatch(path.name)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _maps_matching(folder: Path, pattern: str) -> list[Path]:
    if not folder.is_dir():
        return []
    name = re.compile(pattern)
    return sorted(folder / entry.name for entry in os.scandir(folder) if name.fullmatch(entry.name) and entry.is_file())


def used_maps(dataset) -> list[str]:
    """Absolute paths of the map files a dataset (BertDataset, PackedBertDataset, a blend, or None)
    reads."""
    if dataset is None:
        return []
    if hasattr(dataset, "datasets"):  # BlendableDataset
        return sorted({path for part in dataset.datasets for path in used_maps(part)})
    return [str(Path(path).resolve()) for path in dataset.map_files()]


def size_text(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def describe(prefixes: list[str], used: list[str], log_dir: str, cache_path: str | None = None) -> str:
    """One line: where the maps live, how many this run uses, how many (and how large) others are
    there, and the command that removes those. Others may be other live runs' on the same data: the
    command keeps their --log-dir too only when named, so the line says so and lists first (--dry-run)."""
    used_set = {str(Path(path).resolve()) for path in used}
    others = [path for path in maps_of_prefixes(prefixes, cache_path=cache_path)
              if str(path.resolve()) not in used_set and not builder(path)]
    folders = sorted({str(maps_folder(prefix, cache_path).resolve()) for prefix in prefixes})
    line = f"index maps in {', '.join(folders)}: {len(used_set)} used by this run"
    if not others:
        return line + ", no others"
    size = sum(path.stat().st_size for path in others)
    cache = f" --data-cache-path {shlex.quote(str(cache_path))}" if cache_path else ""
    return (f"{line}; {len(others)} others from other settings, other runs or older data ({size_text(size)}): "
            f"{python_command()} {in_repository('tools/clean_index_maps.py')} "
            f"{' '.join(shlex.quote(str(prefix)) for prefix in prefixes)}{cache} "
            f"--keep-run {shlex.quote(str(log_dir))} "
            "--dry-run lists them, and without --dry-run removes them; add --keep-run LOG_DIR for each other run "
            "still using this data")


def write_used(log_dir: str, used: list[str], prefixes: list[str], cache_path: str | None) -> Path:
    """The maps a run uses, with the data `prefixes` they are of and its --data-cache-path (`cache_path`),
    so that tools/clean_index_maps.py tells this run's data from another copy of the same name."""
    path = Path(log_dir) / USED_FILE
    path.write_text(json.dumps({"maps": sorted(set(used)), "data": [str(Path(prefix).resolve()) for prefix in prefixes],
                                "data_cache_path": str(Path(cache_path).resolve()) if cache_path else None},
                               indent=1) + "\n")
    return path


def read_used(log_dir: str) -> dict | None:
    """A run's index_maps.json in `log_dir` as {"maps": set of resolved paths, "data": its data prefixes (None in
    a record written before runs named their data), "data_cache_path"}; None when it has none, or lists no map."""
    path = Path(log_dir) / USED_FILE
    try:
        record = json.loads(path.read_text())
        maps = {str(Path(p).resolve()) for p in record["maps"]}
        data, cache_path = record.get("data"), record.get("data_cache_path")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not maps or not (data is None or isinstance(data, list) and all(isinstance(prefix, str) for prefix in data)):
        return None
    return {"maps": maps, "data": data, "data_cache_path": cache_path if isinstance(cache_path, str) else None}
