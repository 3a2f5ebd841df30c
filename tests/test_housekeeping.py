"""Checkpoint and cache housekeeping: --keep-last pruning on a checkpoint folder tree, the index
map report, and tools/clean_index_maps.py run as a real subprocess."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from megatron import checkpoint, checkpoint_save
from megatron.arguments import build_parser
from megatron.data import index_maps
from megatron.errors import ConfigError
from megatron.flag_checks import check_flags
from megatron.paths import python_command

ROOT = Path(__file__).resolve().parents[1]


def fake_checkpoints(save_dir: Path, iterations, latest) -> None:
    for iteration in iterations:
        folder = save_dir / checkpoint.tag_for(iteration)
        folder.mkdir(parents=True)
        (folder / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (save_dir / checkpoint.LATEST).write_text(checkpoint.tag_for(latest))


def test_prune_keeps_the_newest_and_latest(tmp_path):
    fake_checkpoints(tmp_path, [10, 20, 30, 40, 100], latest=100)
    (tmp_path / "iter_0000200.partial").mkdir()  # a save being written: never touched
    (tmp_path / "iter_0000005.removing").mkdir()  # left by a kill during an earlier removal
    (tmp_path / "notes").mkdir()
    assert checkpoint_save.prune(str(tmp_path), 2) == ["iter_0000010", "iter_0000020", "iter_0000030"]
    assert sorted(os.listdir(tmp_path)) == ["iter_0000040", "iter_0000100", "iter_0000200.partial", "latest", "notes"]


def test_prune_after_a_rollback_counts_only_this_runs_checkpoints(tmp_path):
    """'latest' set back from iter 300 to 100, the run resumed and saved at 150: the abandoned
    run's 200 and 300 neither count against --keep-last 2 nor get removed, and 100 stays."""
    fake_checkpoints(tmp_path, [100, 150, 200, 300], latest=150)
    assert checkpoint_save.prune(str(tmp_path), 2) == []
    assert checkpoint_save.prune(str(tmp_path), 1) == ["iter_0000100"]
    assert sorted(os.listdir(tmp_path)) == ["iter_0000150", "iter_0000200", "iter_0000300", "latest"]


def link(save_dir: Path, iteration: int, parent: int | None) -> None:
    """The run_state.json a save writes, naming the checkpoint its run continued from (checkpoint.PARENT)."""
    state = {"config": {"model": {}}, "iteration": iteration, "consumed_samples": 2 * iteration,
             **({checkpoint.PARENT: checkpoint.tag_for(parent)} if parent else {})}
    (save_dir / checkpoint.tag_for(iteration) / checkpoint.RUN_STATE).write_text(json.dumps(state))


def test_prune_never_counts_a_rollbacks_abandoned_checkpoints_once_latest_passes_them(tmp_path):
    """A run saved 2..15 and 17; `latest` was set back to 10, the rollback saved 12 and 14 over the old ones
    (15 and 17 stay, abandoned), then this run resumed 14 and saves 16 and 18 with --keep-last 2: the
    kept ones are this lineage's (14 and 16, then 16 and 18), never the abandoned 15 and 17, which stay."""
    fake_checkpoints(tmp_path, [2, 4, 6, 8, 10, 12, 14, 15, 16, 17], latest=16)
    for iteration, parent in ((4, 2), (6, 4), (8, 6), (10, 8), (12, 10), (14, 12), (15, 14), (16, 14), (17, 15)):
        link(tmp_path, iteration, parent)
    assert checkpoint_save.prune(str(tmp_path), 2) == [checkpoint.tag_for(i) for i in (2, 4, 6, 8, 10, 12)]
    fake_checkpoints(tmp_path, [18], latest=18)
    link(tmp_path, 18, 16)
    assert checkpoint_save.prune(str(tmp_path), 2) == ["iter_0000014"]
    assert sorted(os.listdir(tmp_path)) == ["iter_0000015", "iter_0000016", "iter_0000017", "iter_0000018", "latest"]


def test_prune_counts_the_checkpoints_below_a_link_it_cannot_follow(tmp_path):
    """Checkpoints saved before runs recorded their parent (2, 4) and those below a parent that was moved away
    (6 -> the missing 5) count as this run's, as before links were recorded."""
    fake_checkpoints(tmp_path, [2, 4, 6, 8, 9], latest=8)
    link(tmp_path, 6, 5)
    link(tmp_path, 8, 6)
    link(tmp_path, 9, 4)  # an abandoned branch above 8's ancestor 6
    assert checkpoint_save.prune(str(tmp_path), 2) == ["iter_0000002", "iter_0000004"]
    assert sorted(os.listdir(tmp_path)) == ["iter_0000006", "iter_0000008", "iter_0000009", "latest"]


def test_prune_never_counts_or_removes_another_runs_checkpoints(tmp_path):
    """A resume of another folder saved 6 and 8 into a --save holding another run's 2 and 4 (another run id;
    saved before start-ups refused that): --keep-last 1 removes this run's 6 only, never the other run's work."""
    fake_checkpoints(tmp_path, [2, 4, 6, 8], latest=8)
    for iteration, parent, run in ((2, None, "another"), (4, 2, "another"), (6, None, "this"), (8, 6, "this")):
        link(tmp_path, iteration, parent)
        path = tmp_path / checkpoint.tag_for(iteration) / checkpoint.RUN_STATE
        state = json.loads(path.read_text())
        path.write_text(json.dumps({**state, checkpoint.ORIGIN: {"from": None, checkpoint.RUN_ID: run}}))
    assert checkpoint_save.prune(str(tmp_path), 1) == ["iter_0000006"]
    assert sorted(os.listdir(tmp_path)) == ["iter_0000002", "iter_0000004", "iter_0000008", "latest"]


def test_keep_last_below_one_is_one_line_error():
    args = build_parser().parse_args(["--keep-last", "0"])
    with pytest.raises(ConfigError, match="--keep-last 0 must be >= 1"):
        check_flags(args)
    assert build_parser().parse_args([]).keep_last is None  # default: keep all


def fake_maps(folder: Path) -> list[Path]:
    names = ["c_train_indexmap_800mns_125msl_0.10ssp_1234s_0-90docs.npy",
             "c_valid_indexmap_80mns_125msl_0.10ssp_1234s_90-99docs.npy",
             "c_train_indexmap_400mns_125msl_0.10ssp_1234s_0-90docs.npy",  # older settings
             "c_train_packmap_400mns_125msl_0.10ssp_1234s_0-90docs_512sl_256w.npy",
             "c_train_indexmap_9mns_1msl.npy.partial.npy",  # a killed build
             "other_train_indexmap_1mns.npy"]  # another prefix
    for name in names:
        (folder / name).write_bytes(b"0" * 2048)
    (folder / "c_text_sentence.bin").write_bytes(b"data")
    return [folder / name for name in names]


def test_describe_counts_other_maps(tmp_path):
    maps = fake_maps(tmp_path)
    line = index_maps.describe([str(tmp_path / "c")], [str(maps[0]), str(maps[1])], "runs/x")
    assert line.startswith(f"index maps in {tmp_path.resolve()}: 2 used by this run; 3 others from other settings, other "
                           f"runs or older data (6.0 KB): {python_command()} tools/clean_index_maps.py")
    # other live runs on the same data: their maps are kept only when their --log-dir is named too
    assert line.endswith("--keep-run runs/x --dry-run lists them, and without --dry-run removes them; add --keep-run "
                         "LOG_DIR for each other run still using this data")
    assert index_maps.describe([str(tmp_path / "other")], [str(maps[5])], "x").endswith("1 used by this run, no others")
    # paths with spaces are quoted: the command works when pasted
    spaced = tmp_path / "sp ace"
    spaced.mkdir()
    fake_maps(spaced)
    line = index_maps.describe([str(spaced / "c")], [], "logs of x")
    assert f"clean_index_maps.py {shlex.quote(str(spaced / 'c'))} --keep-run 'logs of x' --dry-run" in line, line


def test_the_clean_command_names_the_script_by_a_path_that_works_from_the_users_folder(tmp_path, monkeypatch):
    """From the repository it reads as the README writes it; from elsewhere (a run started in its own
    folder) it names the script's absolute path, not a tools/... that does not exist there."""
    maps = fake_maps(tmp_path)
    monkeypatch.chdir(tmp_path)
    line = index_maps.describe([str(tmp_path / "c")], [str(maps[0])], "runs/x")
    interpreter = python_command()  # from here: absolute, unless PATH finds it as `python`
    script = line.split(f": {interpreter} ", 1)[1].split()[0]
    assert script == str(ROOT / "tools" / "clean_index_maps.py") and Path(script).is_file()
    assert Path(interpreter).is_absolute() or interpreter == "python", "the interpreter too works from here"


def clean(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "clean_index_maps.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_clean_tool_goes_on_past_a_map_another_process_removed(tmp_path, monkeypatch, capsys):
    """Two cleans at once: a map the other one removed first is not an error (it ended with `cannot use ... (No
    such file or directory)` after removing part of them)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import clean_index_maps

    maps = fake_maps(tmp_path)
    original = clean_index_maps.maps_of

    def listed_then_removed(*args, **kwargs):
        found = original(*args, **kwargs)
        if found:
            found[0].unlink()  # the other clean's removal, between this one's listing and its own
        return found
    monkeypatch.setattr(clean_index_maps, "maps_of", listed_then_removed)
    assert clean_index_maps.main([str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("removed ")
    assert [path.name for path in maps if path.exists()] == [maps[5].name]  # another prefix's


def test_clean_tool_keeps_a_runs_maps(tmp_path):
    maps = fake_maps(tmp_path)
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    index_maps.write_used(str(log_dir), [str(maps[0]), str(maps[1])], [str(tmp_path / "c")], None)
    dry = clean(tmp_path / "c", "--keep-run", log_dir, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1] == "would remove 3 index maps (6.0 KB), 2 kept"
    given_the_file = clean(tmp_path / "c", "--keep-run", log_dir / index_maps.USED_FILE, "--dry-run")
    assert given_the_file.stdout == dry.stdout, given_the_file.stderr
    assert all(path.exists() for path in maps)
    done = clean(tmp_path / "c", "--keep-run", log_dir)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([maps[0].name, maps[1].name, maps[5].name,
                                                                 "c_text_sentence.bin", "run"])
    everything = clean(tmp_path / "c")
    assert everything.stdout.splitlines()[-1] == "removed 2 index maps (4.0 KB), 0 kept"
    assert (tmp_path / "c_text_sentence.bin").exists() and maps[5].exists()


def test_a_prefix_given_twice_counts_and_removes_each_map_once(tmp_path):
    """Two spellings of one prefix (c and ../<folder>/c) listed, counted and sized each map twice ('removed 10
    index maps' of 5); the trainer's start-up line alike, for a --data-path naming it twice."""
    maps = fake_maps(tmp_path)
    twice = [tmp_path / "c", tmp_path / ".." / tmp_path.name / "c"]
    dry = clean(*twice, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1] == "would remove 5 index maps (10.0 KB), 0 kept"
    assert index_maps.describe(list(map(str, twice)), [str(maps[0])], "x").split(": 1 used by this run; ")[1] \
        .startswith("4 others from other settings, other runs or older data (8.0 KB)")
    done = clean(*twice)
    assert done.stdout.splitlines() == [f"removed {path}" for path in sorted(maps[:5])] + [
        "removed 5 index maps (10.0 KB), 0 kept"]


def test_clean_tool_errors_are_one_line(tmp_path):
    result = clean(tmp_path / "c", "--keep-run", tmp_path / "no_run")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "has no readable index_maps.json" in result.stderr
    result = clean(tmp_path / "missing" / "c")
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_map_files_name_what_the_dataset_reads():
    from megatron.data.bert_dataset import PackedBertDataset, mapping_path, packmap_path

    class Segments:
        mapping_settings = ("p", "train", 0, 9, 100, 125, 0.1, 1234, True)
        map_files = lambda self: [mapping_path(*self.mapping_settings)]  # noqa: E731

    packed = PackedBertDataset.__new__(PackedBertDataset)
    packed.segments, packed.path = Segments(), packmap_path(Segments.mapping_settings, 512, 256)
    assert packed.map_files() == ["p_train_indexmap_100mns_125msl_0.10ssp_1234s_0-9docs_ep.npy",
                                  "p_train_packmap_100mns_125msl_0.10ssp_1234s_0-9docs_ep_512sl_256w.npy"]
    assert json.loads(json.dumps(index_maps.used_maps(None))) == []


def test_hints_name_the_interpreter_that_runs(tmp_path, monkeypatch):
    """A fresh Debian has no `python`, and another one lacks this run's packages: a hint's command
    names this interpreter, `python` only where the shell finds it there (an activated venv)."""
    from megatron import paths

    monkeypatch.setenv("PATH", str(tmp_path))  # no python on it
    monkeypatch.setattr(sys, "executable", str(paths.REPOSITORY / ".venv" / "bin" / "python"))
    monkeypatch.chdir(paths.REPOSITORY)
    assert paths.python_command() == ".venv/bin/python"
    monkeypatch.chdir(tmp_path)
    assert paths.python_command() == str(paths.REPOSITORY / ".venv" / "bin" / "python")
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    assert paths.python_command() == "python"  # what PATH finds is this interpreter
    monkeypatch.setattr(sys, "executable", "/opt/torch/bin/python3")  # PATH's python is another one
    assert paths.python_command() == "/opt/torch/bin/python3"
