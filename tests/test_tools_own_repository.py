"""Every tool and benchmark runs its own repository's `megatron`, not an installed one (`pip install
-e .` of another checkout sharing the virtual environment): tools/this_repo.py, called first. The
default data lies in the repository too, whatever the folder a run starts from."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path for folder in ("tools", "benchmarks", "azureml") for path in (ROOT / folder).glob("*.py")
                 if path.name != "this_repo.py" and re.search(r"^\s*(from|import) megatron\b", path.read_text(), re.M))


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{path.parent.name}/{path.name}" for path in SCRIPTS])
def test_each_script_puts_its_repository_first_before_importing_megatron(script):
    lines = script.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if re.match(r"\s*(from|import) megatron\b", line))
    assert any(line.startswith("this_repo.put_first()") for line in lines[:first]), f"{script} imports megatron before this_repo.put_first()"


@pytest.mark.parametrize("script", ["tools/plot_run.py", "benchmarks/plan_time.py", "azureml/submit.py"])
def test_a_script_runs_beside_another_installed_megatron(tmp_path, script):
    """Another checkout's `megatron` ahead on the path (here through PYTHONPATH, as an editable
    install of another worktree is): the script still imports the one beside it."""
    (tmp_path / "megatron").mkdir()
    (tmp_path / "megatron" / "__init__.py").write_text("raise SystemExit('the other checkout of megatron')\n")
    done = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_the_default_data_is_the_repositorys_from_any_folder(tmp_path, monkeypatch):
    """--default-data-dir and fill_mask.py's default vocab were relative to the current folder: a run started
    elsewhere built a second default corpus there, and fill_mask.py did not find the first one's vocab."""
    import importlib.util

    from megatron.arguments import build_parser

    monkeypatch.chdir(tmp_path)
    assert Path(build_parser().parse_args([]).default_data_dir) == ROOT / ".cache" / "default_data"
    spec = importlib.util.spec_from_file_location("fill_mask", ROOT / "tools" / "fill_mask.py")
    fill_mask = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fill_mask)
    assert Path(fill_mask.DEFAULT_VOCAB) == ROOT / ".cache" / "default_data" / "vocab.txt"


@pytest.mark.parametrize("tool", ["build_vocab", "plot_run"])
def test_a_tool_runs_as_a_module_from_the_repository_root(tool):
    """`python -m tools.build_vocab` stopped with `ModuleNotFoundError: No module named 'this_repo'`
    (the tools import it from their folder, which only `python tools/X.py` puts on sys.path)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", f"tools.{tool}", "--help"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
