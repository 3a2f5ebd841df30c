"""The index maps a run caches next to its data, and the ones older settings left behind.

bert_dataset.py saves `{prefix}_{split}_indexmap_*.npy` and `{prefix}_{split}_packmap_*.npy`
named by every setting that shapes them (samples, sequence length, seed, documents, packing), so
another --train-iters, batch, --split or --seq-length builds new maps and leaves the old ones.
The trainer says where they are at start-up and lists the ones it uses in
`<log-dir>/index_maps.json`; tools/clean_index_maps.py removes the others (or all: any missing
map is rebuilt on the next start). No torch here: the tool stays fast.
"""
import json
from pathlib import Path

SPLITS = ("train", "valid", "test")
KINDS = ("indexmap", "packmap")
USED_FILE = "index_maps.json"  # in the log directory: {"maps": [absolute paths]}


def maps_of(prefix: str) -> list[Path]:
    """The map files of a data prefix (any settings), including `.partial.npy` leftovers of a
    build that was killed; sorted."""
    base = Path(prefix)
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


def describe(prefixes: list[str], used: list[str], log_dir: str) -> str:
    """One line: where the maps live, how many this run uses, how many (and how large) others are
    there, and the command that removes those."""
    used_set = {str(Path(path).resolve()) for path in used}
    others = [path for prefix in prefixes for path in maps_of(prefix) if str(path.resolve()) not in used_set]
    folders = sorted({str(Path(prefix).resolve().parent) for prefix in prefixes})
    line = f"index maps in {', '.join(folders)}: {len(used_set)} used by this run"
    if not others:
        return line + ", no others"
    size = sum(path.stat().st_size for path in others)
    return (f"{line}; {len(others)} others from other settings ({size_text(size)}): "
            f"python tools/clean_index_maps.py {' '.join(prefixes)} --keep-run {log_dir} removes them")


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
