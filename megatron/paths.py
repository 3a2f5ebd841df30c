"""The folders a run writes into (--save, --log-dir, --tensorboard-dir), checked at start-up rather
than when the first write fails while other ranks train; and the atomic write of the small JSON
records kept beside data and checkpoints."""
import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import socket
import sys
from pathlib import Path

from megatron.errors import ConfigError, disk_full

REPOSITORY = Path(__file__).resolve().parents[1]  # pretrain_bert.py, tools/, docs/, ds_configs/
# where the trainer builds its default data (--default-data-dir), in the repository whatever the current folder:
# a run started elsewhere reuses it rather than building a second copy there; in_repository(DEFAULT_DATA_DIR)
DEFAULT_DATA_DIR = ".cache/default_data"


class DefaultPath(str):
    """A path flag's default as argparse hands it back (the same object): told apart from the same path
    typed by the user (`args.log_dir is DEFAULT_LOG_DIR`)."""


DEFAULT_LOG_DIR = DefaultPath("runs/bert")  # --log-dir's default: run_log.free_log_dir picks runs/bert-N when taken


def in_repository(name: str) -> str:
    """A file of this repository (`tools/clean_index_maps.py`, `docs/resuming.md`) as a hint names it: a
    path that works from the user's folder, as the README writes it when that is the repository, else
    absolute (as extend_context.py's launch line names pretrain_bert.py)."""
    try:
        here = Path.cwd()
    except OSError:  # the folder was removed under the process
        here = None
    return name if here == REPOSITORY else str(REPOSITORY / name)


def python_command() -> str:
    """This interpreter as a hint names it: `python` where that is what the shell finds (an activated
    venv), else its path (`.venv/bin/python` from the repository, as the README writes it): a fresh
    Debian has no `python`, and another one lacks this run's packages."""
    if shutil.which("python") == sys.executable:
        return "python"
    executable = Path(sys.executable)
    return in_repository(str(executable.relative_to(REPOSITORY))) if executable.is_relative_to(REPOSITORY) \
        else sys.executable


TEXT_FLAGS = ("--text",)  # values that are no path (fill_mask.py's sentences): left as typed


def expand_home(argv: list) -> list:
    """argv with `~` and `~user` expanded where a path value starts with it, as a shell does for a word
    it sees: bash leaves `--save=~/ck` and a quoted '~/ck' (a job file's) alone, and the run wrote into a
    folder named `~` in the current one (where a later `rm -rf ~` is a disaster). Called by pretrain_bert.py
    and every tool (tools/this_repo.py) before their flags are parsed."""
    expanded = []
    for index, arg in enumerate(argv):
        flag, equals, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if (index and argv[index - 1] in TEXT_FLAGS) or flag in TEXT_FLAGS or not value.startswith("~"):
            expanded.append(arg)
        else:
            expanded.append(f"{flag}={os.path.expanduser(value)}" if equals else os.path.expanduser(value))
    return expanded


def repository_twin(path) -> str | None:
    """This repository's file at a relative `path` missing from the user's folder (the README's
    `ds_configs/ring_sp2.json`, run from another folder), for a hint naming it; None otherwise."""
    path = Path(path)
    twin = REPOSITORY / path
    return str(twin) if not path.is_absolute() and not path.exists() and twin.is_file() else None


def as_written(found: str, given: str) -> str:
    """`found`, an absolute path worked out from the user's `given` one (a folder above it), as a message names
    it: relative to the current folder where `given` was relative (docs/errors.md: only a file of this
    repository is named absolute when the user wrote no absolute path)."""
    if os.path.isabs(given):
        return found
    try:
        return os.path.relpath(found)
    except (OSError, ValueError):  # the current folder was removed under the process
        return found


def file_in_the_way(flag: str, path: str) -> str | None:
    """Why `path` cannot become a folder when the cause is not a permission: a file in its place or
    on its path."""
    folder = os.path.abspath(path)
    while folder and not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if os.path.isdir(folder):
        return None
    where = "is a file" if folder == os.path.abspath(path) else \
        f"lies under {as_written(folder, path)}, which is a file"
    return f"{flag} {path} {where}, not a directory"


def missing_folders(path: str) -> list:
    """The folders `path` needs that do not exist yet, innermost first (to remove them again)."""
    folder, missing = os.path.abspath(path), []
    while not os.path.exists(folder):
        if os.path.islink(folder):  # a link to a folder not made yet: never made here, so never removed here
            link = as_written(folder, path)
            target = os.path.join(os.path.dirname(link), os.readlink(folder))  # an absolute link's own target
            raise ConfigError(f"{link} is a link to {target}, which does not exist (a scratch folder not made yet, "
                              "a file system not mounted)", f"create it (mkdir -p {shlex.quote(target)}), or pass "
                                                            "another folder")
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def remove_empty(folders: list) -> None:
    """Removes `folders` (missing_folders' list, innermost first) where they are still empty: a start that failed
    leaves none of the folders it made."""
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def write_probe(folder: str) -> None:
    """Makes `folder`, writes a file in it and removes the file; an OSError says why it cannot."""
    os.makedirs(folder, exist_ok=True)
    probe = os.path.join(folder, f".write_probe.{socket.gethostname()}.{os.getpid()}")
    try:
        with open(probe, "w") as file:
            file.write("probe")
    finally:  # created even when the write fails (a full disk)
        with contextlib.suppress(OSError):
            os.remove(probe)


def unwritable(what: str, flag: str, error: OSError, fix: str) -> tuple[str, str]:
    """(problem, fix) of a failed start-up write into the folder of `flag`: a full disk named as such,
    with its own fix."""
    problem = f"{what} ({error.strerror or error})"
    if full := disk_full(error):
        return f"{problem}: {full}", f"free space there or pass a {flag} directory on another disk"
    return problem, fix


def folder_problem(flag: str, path: str, fix: str | None = None) -> tuple[str, str] | None:
    """(problem, fix) when the folder of `flag` (a flag, or a field of the DeepSpeed JSON with its `fix`)
    cannot take what the run writes there, found at start-up (training.check_log_dirs) rather than when
    rank 0 first writes there while the other ranks train. A probe file is written and removed, and the
    folders made for it are removed again."""
    fix = fix or f"pass a {flag} directory this user can write"
    if problem := file_in_the_way(flag, path):
        return problem, fix
    try:
        created = missing_folders(path)
    except ConfigError as error:  # a link to a folder that does not exist
        return f"{flag}: {error.problem}", error.fix
    try:
        write_probe(path)
    except OSError as error:
        if error.errno == errno.ENOENT and os.path.isdir(path):  # no file can be made in it: /proc, /sys
            return f"{flag} {path} takes no new files (a virtual file system such as /proc or /sys)", fix
        return unwritable(f"{flag} {path} is not writable", flag, error, fix)
    finally:
        remove_empty(created)
    return None


def refuse_replacing(output: Path, what: str, example: str, overwrite: bool, why: str = "") -> None:
    """A tool's --output file (`what`: 'a vocab', 'a corpus'; `example`: its usual name, 'vocab.txt') that
    would destroy something: a folder, a path named as a dataset's .bin/.idx, or, without --overwrite, any
    existing file (`why`: what it may be that needs it), which tools/build_vocab.py and
    tools/make_sample_corpus.py replaced without a word."""
    if output.is_dir():
        raise ConfigError(f"--output {output} is a directory", f"pass a file path, e.g. --output {output / example}")
    if output.suffix in (".bin", ".idx"):
        suffix = Path(example).suffix
        raise ConfigError(f"--output {output} is named as a dataset's {output.suffix} file, not {what}",
                          f"pass a {suffix} path, e.g. --output {output.with_suffix(suffix)}")
    if output.exists() and not overwrite:
        raise ConfigError(f"--output {output} exists{why}", "pass another --output, or add --overwrite to replace it")


def output_file_problem(flag: str, path: str, fix: str, folder_made: bool = False) -> tuple[str, str] | None:
    """(problem, fix) when the file `path` of `flag` cannot be written, found before the work that makes it (a
    benchmark's --results found after an hour): a folder or a device, pipe or socket in its place (`-o /dev/null`
    wrote /dev/null.png), a folder that does not exist (unless the writer makes it: `folder_made`), or one this
    user cannot write (folder_problem)."""
    if os.path.isdir(path):
        return f"{flag} {path} is a directory, not a file", fix
    if os.path.exists(path) and not os.path.isfile(path):
        return f"{flag} {path} is not a regular file (a device, a pipe or a socket)", fix
    folder = as_written(os.path.dirname(os.path.abspath(path)), path)
    if not folder_made and not os.path.exists(folder) and not file_in_the_way(flag, folder):
        return (f"{flag} {path}: its folder {folder} does not exist",
                f"check the path, or create the folder first (mkdir -p {shlex.quote(folder)})")
    return folder_problem(flag, folder, fix)


def json_text(value: dict) -> str:
    """A small JSON record as it is written beside data and checkpoints."""
    return json.dumps(value, indent=1, ensure_ascii=False) + "\n"


def write_json_atomic(path, value: dict) -> None:
    """The whole record or the old one (write_text_atomic)."""
    write_text_atomic(path, json_text(value))


def write_text_atomic(path, text: str) -> None:
    """The whole text or the old file: written beside `path`, then renamed over it; a failed write (a full
    disk, a stop signal) leaves no partial file and the old one as it was (a write in place truncated it)."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def where_in(path: str, folder: str) -> str | None:
    """'the' when `path` is `folder`, 'inside the' when it lies under it, None elsewhere (both resolved, so
    a relative path or a link to the same place counts): the words of the errors below."""
    resolved, container = Path(path).resolve(), Path(folder).resolve()
    if resolved == container:
        return "the"
    return "inside the" if container in resolved.parents else None


def checkpoint_holding(path: str, folder: str) -> str | None:
    """The `iter_*` checkpoint folder of the checkpoint directory `folder` (also a `.partial` or `.removing`
    one) that `path` is or lies in, by name (None: elsewhere): a save at its iteration, a rollback's save or
    --keep-last removes it, and whatever was written into it."""
    if where_in(path, folder) != "inside the":
        return None
    top = Path(path).resolve().relative_to(Path(folder).resolve()).parts[0]
    return top if re.fullmatch(r"iter_\d+(\.partial|\.removing)?", top) else None


def save_into_weights_folder(save: str, folder: str, flag: str) -> str | None:
    """The problem of a --save that is the Hugging Face folder `flag` names, or lies inside it: the
    checkpoint would be written into the model folder (None: it lies elsewhere)."""
    where = where_in(save, folder)
    if where is None:
        return None
    return f"--save {save} is {where} {flag} folder: the checkpoint would be written into the Hugging Face model folder"
