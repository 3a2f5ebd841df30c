"""Removes the cached index maps of a data prefix: all of them, or those no kept run uses.

    python tools/clean_index_maps.py PREFIX [PREFIX ...] [--data-cache-path DIR] [--keep-run LOG_DIR ...] [--dry-run]

The trainer caches `{PREFIX}-{fingerprint}_{split}_indexmap_*.npy` / `_packmap_*.npy` next to the data
(or, given --data-cache-path, in that folder), one set per combination of settings (samples, sequence
length, seed, split, packing), the fingerprint being of the data's contents, and lists the ones a run
uses in `<log-dir>/index_maps.json`. Next to the data every map of PREFIX counts, also those of older
data at PREFIX (another fingerprint, or none); in the cache only those of the data PREFIX holds now
(another fingerprint may be another corpus of the same name). With --keep-run, the maps listed there
stay; without, every map of PREFIX goes (a run rebuilds what it needs on its next start). A map a live
run is writing now (`*.partial-HOST-PID.npy`) stays, named; one a killed build left goes.
"""
import argparse
import os
import sys
from pathlib import Path

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.data.index_maps import USED_FILE, builder, maps_folder, maps_of, maps_of_prefixes, read_used, size_text
from megatron.data.indexed_dataset import misnamed_dataset, missing_fix
from megatron.errors import ConfigError, OneLineParser, run_tool


def main(argv=None) -> int:
    parser = OneLineParser(prog="clean_index_maps.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefixes", nargs="+", metavar="PREFIX", help="data prefix, as given to --data-path")
    parser.add_argument("--data-cache-path", metavar="DIR",
                        help="the trainer's --data-cache-path: clean the maps of PREFIX kept there")
    parser.add_argument("--keep-run", action="append", default=[], metavar="LOG_DIR",
                        help=f"keep the maps the run logging to LOG_DIR uses (its {USED_FILE}); repeatable")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    args = parser.parse_args(argv)
    kept_runs = []
    for log_dir in args.keep_run:
        log_dir = Path(log_dir).parent if Path(log_dir).name == USED_FILE and Path(log_dir).is_file() else log_dir
        used = read_used(log_dir)
        if not used:
            raise ConfigError(f"--keep-run {log_dir} has no readable {USED_FILE}",
                              "pass the --log-dir of a run that started (it writes the file), or drop --keep-run")
        kept_runs.append(used)
    keep = {path for run in kept_runs for path in run["maps"]}
    for prefix in args.prefixes:
        missing = [f"{prefix}{suffix}" for suffix in (".idx", ".bin") if not Path(f"{prefix}{suffix}").is_file()]
        if len(missing) == 2 and (mistake := misnamed_dataset(prefix, flag="")):  # a folder, a list: as the trainer
            raise ConfigError(*mistake)
        if not Path(prefix).parent.is_dir():
            raise ConfigError(f"{prefix}: folder {Path(prefix).parent} does not exist", "pass the --data-path prefix")
        stem, extension = os.path.splitext(prefix)
        if extension in (".bin", ".idx") and Path(prefix).is_file():
            raise ConfigError(f"{prefix} is a data file, not its prefix", f"pass {stem}, as given to --data-path")
        if args.data_cache_path and missing:
            raise ConfigError(f"{missing[0]} does not exist: the cached maps are named by the data's contents",
                              "pass the --data-path prefix of the data the maps were built from")
        if len(missing) == 2 and not maps_of(prefix, cache_path=None):  # a typo, "": not "0 removed"
            raise ConfigError(f"no data (.bin/.idx) and no index maps at {prefix!r}", missing_fix(
                prefix, flag="", otherwise="pass the prefix as given to --data-path (without .bin)"))
    if args.data_cache_path and not Path(args.data_cache_path).is_dir():
        raise ConfigError(f"--data-cache-path {args.data_cache_path} is not a folder",
                          "pass the trainer's --data-cache-path")
    found = maps_of_prefixes(args.prefixes, cache_path=args.data_cache_path, write_record=not args.dry_run)
    building = {path: who for path in found if (who := builder(path))}
    for path, who in building.items():
        print(f"kept {path}: being built by {who}")
    doomed = [path for path in found if str(path.resolve()) not in keep and path not in building]
    size = 0
    for path in doomed:
        try:
            size += path.stat().st_size
            if not args.dry_run:
                path.unlink()
        except FileNotFoundError:  # removed meanwhile (another clean, a run's own stale-map removal)
            pass
        print(f"{'would remove' if args.dry_run else 'removed'} {path}")
    print(f"{'would remove' if args.dry_run else 'removed'} {len(doomed)} index maps ({size_text(size)}), "
          f"{len(found) - len(doomed)} kept" + kept_elsewhere(kept_runs, args.prefixes, args.data_cache_path))
    return 0


def kept_elsewhere(kept_runs: list, prefixes: list, cache_path: str | None) -> str:
    """A kept run that trained on one of these prefixes (the same path, resolved: another copy of the data
    with the same name is other data) whose maps of it lie in a folder not searched: named with the flag
    that reaches them, not a silent `0 index maps`. Its --data-cache-path is named only as its
    index_maps.json records it (none: its maps lie beside the data); a record written before runs named
    their data matches no prefix."""
    searched = {str(Path(prefix).resolve()): maps_folder(prefix, cache_path).resolve() for prefix in prefixes}
    away = {}  # folder -> the run's --data-cache-path there (None: beside the data)
    for run in kept_runs:
        for prefix in set(run["data"] or ()) & searched.keys():
            folder = Path(run["data_cache_path"] or Path(prefix).parent)
            if folder != searched[prefix] and any(Path(path).parent == folder and Path(path).name.startswith(
                    f"{Path(prefix).name}-") for path in run["maps"]):
                away[folder] = run["data_cache_path"]
    if not away:
        return ""
    folder, run_cache = sorted(away.items())[0]
    fix = (f"{'pass' if cache_path else 'add'} --data-cache-path {folder} (the run's)" if run_cache else
           "drop --data-cache-path (the run kept its maps beside the data)")
    return (f"; the --keep-run maps of these prefixes lie in {', '.join(map(str, sorted(away)))}, not searched: "
            f"{fix} to clean there")


if __name__ == "__main__":
    sys.exit(run_tool("clean_index_maps.py", main))
