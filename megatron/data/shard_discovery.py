"""Which files of `--input` are the corpus's shards: a file, a folder's or a glob's shard files, or several
of them in the order given. Kept apart from reading them (corpus_files.py): this is path logic only, and
the mistakes it refuses are ones of a dataset's layout, named before any shard is opened: several splits
read as one corpus, a download that has not finished, a numbered shard missing, a link to a file that is
gone, a save_to_disk (Arrow) folder, a shard named twice or held in two formats.
"""
import glob
import os
import re
import shlex
import stat
from pathlib import Path

from megatron.data.index_maps import FINGERPRINT_RECORD
from megatron.data.tokenizer_identity import DATA_IDENTITY
from megatron.errors import DataError

FOLDER_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz", ".json.zst", ".jsonl.zst", ".json.zstd",
                   ".jsonl.zstd", ".parquet")  # what a folder's shards may be (a glob's too, where some match)
FORMATS_HELP = "loose JSON, .jsonl.gz, .jsonl.zst or .parquet"
COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd", ".bz2", ".xz", ".lz4", ".zip")  # a folder notes those it leaves out
METADATA = ("dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json")  # a Hugging Face
# dataset's description beside its shards (snapshot_download, save_to_disk): JSON, not records
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


def shard_paths(spec: str) -> tuple[list[str], list[str]]:
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
        refuse_several_splits(f"input folder {spec} holds", spec, found)
        _refuse_missing_shards(spec, found)
        return found, [name for name in files if name not in found and name.lower().endswith(COMPRESSED_SUFFIXES)]
    if glob.has_magic(spec):
        matched = sorted(glob.glob(spec, recursive=True))
        _refuse_unfinished(spec, [Path(name) for suffix in UNFINISHED for name in glob.glob(spec + suffix)])
        _refuse_broken_links(spec, [Path(name) for name in matched])
        found = [name for name in matched if Path(name).is_file() and not _derived(name)]
        _refuse_matched_folders(spec, [name for name in matched if Path(name).is_dir()], found)
        if not found:
            raise DataError(f"--input {spec} matches no files", "check the pattern (quoted, so the shell leaves "
                                                                  "it to the tool) and the folder")
        shards = [name for name in found if name.lower().endswith(FOLDER_SUFFIXES)] or found
        if len(shards) > 1:
            refuse_several_splits(f"--input {shlex.quote(spec)} matches", common_folder(shards), shards)
        return shards, [name for name in found if name not in shards]
    if spec == "-" or path.exists():  # what exists and is neither a file nor a folder: a pipe, a terminal
        raise DataError(f"--input {spec} is {_not_a_file(spec)}, which is not read: each shard is read twice (its "
                        "head is checked before any worker starts, then its records are read)",
                        "write it to a file and pass that, or pass the file itself (.jsonl.gz and .jsonl.zst are read "
                        "compressed)")
    raise DataError(f"input file {spec} does not exist",
                    f"pass --input with a {FORMATS_HELP} file, or a folder or glob of them")


def _refuse_matched_folders(spec: str, folders: list, files: list) -> None:
    """A glob that matches folders and no shard file (`'ds/*'` over `ds/en/`, `ds/de/` and a README): a glob
    reads the files it matches, so it would read the README, or nothing."""
    if not folders or any(name.lower().endswith(FOLDER_SUFFIXES) for name in files):
        return
    shown = ", ".join(folders[:3]) + (f" and {len(folders) - 3} more" if len(folders) > 3 else "")
    others = f" and no shard file (only {', '.join(files[:3])})" if files else ""
    inside = [str(path) for folder in folders for path in sorted(Path(folder).rglob("*"))
              if path.name.lower().endswith(FOLDER_SUFFIXES) and path.is_file()]
    pattern = glob_of(inside) if inside else None
    raise DataError(f"--input {shlex.quote(spec)} matches the folder{'s' * (len(folders) > 1)} {shown}{others}: a "
                    "glob reads the files it matches, not what folders hold",
                    f"pass the folder itself (--input {common_folder(folders) if len(folders) > 1 else folders[0]})"
                    + (f" or a glob of its shards (--input {shlex.quote(pattern)})" if pattern else ""))


def _not_a_file(spec: str) -> str:
    """What an --input that exists but is no file or folder is: standard input (`-`), a pipe (`<(zcat x.gz)`,
    /dev/stdin under `cat x |`), a terminal (/dev/stdin at a prompt)."""
    if spec == "-":
        return "standard input"
    mode = os.stat(spec).st_mode
    if stat.S_ISFIFO(mode):
        return "a pipe (as <(...) and a piped /dev/stdin are)"
    return "a terminal or device" if stat.S_ISCHR(mode) else "not a regular file"


def glob_of(paths: list) -> str | None:
    """A glob that matches `paths` and nothing else (`snap/data/*.parquet`, `snap/**/*.jsonl`), or None."""
    suffixes = set(map(shard_suffix, paths))
    if len(suffixes) != 1 or None in suffixes:
        return None
    folder = common_folder(paths)
    deep = any(os.path.dirname(os.path.normpath(path)) != os.path.normpath(folder) for path in paths)
    pattern = os.path.join(folder, "**" if deep else "", f"*{suffixes.pop()}")
    matched = {os.path.realpath(name) for name in glob.glob(pattern, recursive=True)}
    return pattern if matched == {os.path.realpath(path) for path in paths} else None


def refuse_repeated_shards(paths: list) -> None:
    """A shard that several --input values name (a folder and a file in it, a file given twice), or one shard in
    two formats: read twice, its documents would weigh double."""
    seen = set()
    for path in paths:
        if (real := os.path.realpath(path)) in seen:
            raise DataError(f"--input names {path} twice (a path given twice, or a folder and a file in it)",
                            "pass each shard once")
        seen.add(real)
    _refuse_copies_in_two_formats(paths)


def shard_suffix(path: str) -> str | None:
    """The shard suffix a file name ends with (the longest: `.jsonl.gz`, not `.gz`), or None."""
    return next((suffix for suffix in sorted(FOLDER_SUFFIXES, key=len, reverse=True)
                 if path.lower().endswith(suffix)), None)


def _stem(path: str) -> tuple:
    """(the folder, the name without its format: `wiki` of `wiki.jsonl.gz`, `wiki.json`, `wiki.parquet`)."""
    name = os.path.basename(path)[:len(os.path.basename(path)) - len(shard_suffix(path))].lower()
    return os.path.realpath(os.path.dirname(path) or "."), name.removesuffix(".jsonl").removesuffix(".json")


def _refuse_copies_in_two_formats(paths: list) -> None:
    """One shard in two formats in one folder (`wiki.jsonl` and `wiki.jsonl.gz`, as `gzip -k` leaves them;
    `wiki.json` and `wiki.parquet`): both read, every document would count twice, and a split by document would
    put the copy of a held-out document in training."""
    shards = [path for path in paths if shard_suffix(path)]
    first_of = {}  # stem -> the first shard of that stem
    for path in shards:
        if (first := first_of.setdefault(_stem(path), path)) is path:
            continue
        stems = set(map(_stem, shards))
        patterns = []  # a glob of the shards of one of the two formats, where those are every stem once
        for suffix in (shard_suffix(path), shard_suffix(first)):
            of_format = [shard for shard in shards if shard_suffix(shard) == suffix]
            if set(map(_stem, of_format)) == stems and (pattern := glob_of(of_format)):
                patterns.append(pattern)
        formats = sorted((shard_suffix(first), shard_suffix(path)), key=len)
        compressed = " (as gzip -k or zstd -k leaves it)" if formats[1].startswith(formats[0]) else ""
        raise DataError(f"--input holds {first} and {path}, one shard in two formats{compressed}: both read, every "
                        "document would count twice",
                        "remove one of them" + (f", or pass a quoted glob of one format (--input "
                                                f"{shlex.quote(patterns[0])})" if patterns else ""))


def refuse_several_splits(where: str, root: str, shards: list) -> None:
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


def common_folder(paths: list) -> str:
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
