"""The index maps a run caches next to its data (or in --data-cache-path), and the ones older
settings left behind.

bert_dataset.py saves `{maps}_{split}_indexmap_*.npy` and `{maps}_{split}_packmap_*.npy`
named by every setting that shapes them (samples, sequence length, seed, documents, packing), so
another --train-iters, batch, --split or --seq-length builds new maps and leaves the old ones.
`{maps}` is the data prefix itself, or with --data-cache-path `{cache}/{name}-{fingerprint}`: data
on a read-only mount keeps its maps in a writable folder, and the fingerprint (of the `.idx`
file's contents, not its path, which a job's mount changes) keeps two corpora of the same name
apart while later jobs on the same data reuse the maps.
The trainer says where they are at start-up and lists the ones it uses in
`<log-dir>/index_maps.json`; tools/clean_index_maps.py removes the others (or all: any missing
map is rebuilt on the next start). No torch here: the tool stays fast.
"""
import hashlib
import json
import os
from pathlib import Path

SPLITS = ("train", "valid", "test")
KINDS = ("indexmap", "packmap")
USED_FILE = "index_maps.json"  # in the log directory: {"maps": [absolute paths]}


FINGERPRINT_BYTES = 1 << 20  # of the .idx read from each end: its header and the last sentences' sizes


def fingerprint(prefix: str) -> str:
    """10 hex digits of the `.idx` file's size and its first and last MiB: the same for a copy of
    the data wherever it is mounted, different for another corpus of the same name."""
    path = Path(f"{prefix}.idx")
    digest = hashlib.sha1()
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        digest.update(str(size).encode())
        digest.update(file.read(FINGERPRINT_BYTES))
        file.seek(max(0, size - FINGERPRINT_BYTES))
        digest.update(file.read(FINGERPRINT_BYTES))
    return digest.hexdigest()[:10]


def maps_prefix(prefix: str, cache_path: str | None = None) -> str:
    """The prefix a data prefix's map files are named from: itself (next to the data) or, with a
    cache folder, `{cache_path}/{name}-{fingerprint}`."""
    if not cache_path:
        return prefix
    return str(Path(cache_path) / f"{Path(prefix).name}-{fingerprint(prefix)}")


def maps_of(prefix: str, cache_path: str | None = None) -> list[Path]:
    """The map files of a data prefix (any settings), including `.partial` leftovers of a build
    that was killed; sorted."""
    return _maps_named(Path(maps_prefix(prefix, cache_path)))


def _maps_named(base: Path) -> list[Path]:
    """The map files named from `base` (a maps_prefix)."""
    found = set()
    for split in SPLITS:
        for kind in KINDS:
            found.update(base.parent.glob(f"{base.name}_{split}_{kind}_*.npy"))
    return sorted(path for path in found if path.is_file())


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
    there, and the command that removes those."""
    used_set = {str(Path(path).resolve()) for path in used}
    bases = [Path(maps_prefix(prefix, cache_path)) for prefix in prefixes]  # one fingerprint read each
    others = [path for base in bases for path in _maps_named(base) if str(path.resolve()) not in used_set]
    folders = sorted({str(base.resolve().parent) for base in bases})
    line = f"index maps in {', '.join(folders)}: {len(used_set)} used by this run"
    if not others:
        return line + ", no others"
    size = sum(path.stat().st_size for path in others)
    cache = f" --data-cache-path {cache_path}" if cache_path else ""
    return (f"{line}; {len(others)} others from other settings ({size_text(size)}): "
            f"python tools/clean_index_maps.py {' '.join(prefixes)}{cache} --keep-run {log_dir} removes them")


def write_used(log_dir: str, used: list[str]) -> Path:
    path = Path(log_dir) / USED_FILE
    path.write_text(json.dumps({"maps": sorted(set(used))}, indent=1) + "\n")
    return path


def read_used(log_dir: str) -> set[str]:
    """The maps a run in `log_dir` used (its index_maps.json); empty when it has none."""
    path = Path(log_dir) / USED_FILE
    try:
        return {str(Path(p).resolve()) for p in json.loads(path.read_text())["maps"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()
