"""Every tool and benchmark runs its own repository's `megatron`, not an installed one (`pip install
-e .` of another checkout sharing the virtual environment): tools/this_repo.py, called first."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path for folder in ("tools", "benchmarks") for path in (ROOT / folder).glob("*.py")
                 if path.name != "this_repo.py" and re.search(r"^\s*(from|import) megatron\b", path.read_text(), re.M))


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{path.parent.name}/{path.name}" for path in SCRIPTS])
def test_each_script_puts_its_repository_first_before_importing_megatron(script):
    lines = script.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if re.match(r"\s*(from|import) megatron\b", line))
    assert any(line.startswith("this_repo.put_first()") for line in lines[:first]), f"{script} imports megatron before this_repo.put_first()"


@pytest.mark.parametrize("script", ["tools/plot_run.py", "benchmarks/plan_time.py"])
def test_a_script_runs_beside_another_installed_megatron(tmp_path, script):
    """Another checkout's `megatron` ahead on the path (here through PYTHONPATH, as an editable
    install of another worktree is): the script still imports the one beside it."""
    (tmp_path / "megatron").mkdir()
    (tmp_path / "megatron" / "__init__.py").write_text("raise SystemExit('the other checkout of megatron')\n")
    done = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
