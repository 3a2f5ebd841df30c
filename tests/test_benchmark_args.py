"""The benchmarks' command lines: an ordinary mistake stops a script before it measures anything,
with one `<script>: error: <problem>; <fix>` line and exit code 2 (no traceback minutes into a
run, no RESULTS.md section written)."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from megatron.errors import run_tool  # noqa: E402


def refused(capsys, monkeypatch, script: str, argv: list, parse: str = "parse_args") -> str:
    """The one error line of a benchmark's argument parsing (it must exit 2), without argparse's usage
    block, as the tools'."""
    monkeypatch.setattr(sys, "argv", [f"{script}.py"])  # argparse names the script from argv[0]
    with pytest.raises(SystemExit) as stopped:
        getattr(importlib.import_module(script), parse)(argv)
    assert stopped.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"; see {script}.py --help")
    return line.removesuffix(f"; see {script}.py --help")


@pytest.mark.parametrize("script, argv", [
    ("attention_memory", ["--seq-lengths", "1024", "0"]),
    ("attention_memory", ["--bert-seq-lengths", "-4"]),
    ("sp_scaling", ["--steps", "0"]),
    ("sp4_scaling", ["--steps", "0"]),
    ("train_step", ["--repeats", "0"]),
    ("comm_model", ["--seq-length", "0"]),
    ("modern", ["--seq-lengths", "0"]),
    ("preprocess", ["--repeats", "0"]),
    ("longest_sequence", ["--cap-mib", "0"]),
    ("main_job", ["--seconds", "-1"]),
    ("soak", ["--sample-every", "0"]),
    ("soak", ["--steps", "0"]),
    ("plan_time", ["--repeats", "0"]),
    ("train_step", ["--peak-tflops", "nan"]),
    ("train_step", ["--peak-tflops", "0"]),
])
def test_counts_lengths_and_times_below_one_are_refused_by_the_parser(capsys, monkeypatch, script, argv):
    flag, value = argv[0], argv[-1]
    above = "a number above 0" if flag in ("--cap-mib", "--seconds", "--peak-tflops") else "1 or more"
    assert refused(capsys, monkeypatch, script, argv) == \
        f"{script}.py: error: argument {flag}: {value} must be above 0; give {above}"


@pytest.mark.parametrize("script, argv, message", [
    # a length the fixed Linformer k (256) or BigBird blocks (64, x SP) cannot take
    ("attention_memory", ["--seq-lengths", "64"], "--seq-lengths 64 does not suit linformer at SP=1: linformer_k "
     "256 exceeds seq_length 64; give lengths every variant accepts (the nearest is 512)"),
    ("attention_memory", ["--bert-seq-lengths", "1000"], "--bert-seq-lengths 1000 does not suit bigbird at SP=1: "
     "seq_length 1000 is not divisible by bigbird block size 64"),
    ("sp_scaling", ["--seq-lengths", "64"], "--seq-lengths 64 does not suit linformer at SP=1"),
    ("train_step", ["--seq-lengths", "64"], "(the nearest is 448) or leave out that contestant"),
    ("train_step", ["--contestants", "ours", "dense"], "argument --contestants: invalid choice: 'dense'"),
    ("plan_time", ["--seq", "64"], "--seq 64 is shorter than the packed samples' segment length 1024"),
    ("plan_time", ["--tree", "/nonexistent"], "--tree /nonexistent is not a source tree of this project"),
    ("soak", ["--steps", "20"], "--steps 20 with --sample-every 20 gives 1 RSS samples in the second half"),
    # the model config's own check, which came as its traceback after the imports
    ("train_step", ["--attention-dropout", "2"], "argument --attention-dropout: 2 is outside [0, 1); give a number "
     "from 0 up to below 1"),
    ("train_step", ["--attention-dropout", "nan"], "argument --attention-dropout: nan is outside [0, 1)"),
    # documented as counts and times, taken as given below 0
    ("train_step", ["--warmup", "-1"], "argument --warmup: -1 is below 0; give 0 or more"),
    ("modern", ["--warmup", "-2"], "argument --warmup: -2 is below 0; give 0 or more"),
    ("modern", ["--max-step-seconds", "-5"], "argument --max-step-seconds: -5 must be above 0; give a number above 0"),
    # a step of one sample, recorded as "10 tokens per step"
    ("train_step", ["--tokens-per-step", "10", "--seq-lengths", "128"], "--tokens-per-step 10 is below --seq-lengths "
     "128: a step holds at least one sample (batch = tokens-per-step / seq); give --tokens-per-step 128 or more"),
])
def test_settings_a_benchmark_cannot_run_are_refused_before_it_measures(capsys, monkeypatch, script, argv, message):
    assert message in refused(capsys, monkeypatch, script, argv)


@pytest.mark.parametrize("argv, message", [
    (["--seq", "130", "--sizes", "4"], "--seq 130 is not a multiple of --sizes 4: the simulated ranks hold equal "
     "chunks; give a --seq that suits every size (the nearest is 192)"),
    (["--seq", "100"], "--seq 100 does not suit BigBird at P=1: seq_length 100 is not divisible by bigbird block "
     "size 16 x sequence-parallel size 1"),
    (["--seq", "64", "--sizes", "1"], "--seq 64 does not suit BigBird at P=1: bigbird needs at least 7 blocks"),
    (["--device", "bogus"], "argument --device: invalid choice: 'bogus'"),
])
def test_gpu_kernels_refuses_a_device_or_length_it_cannot_run(capsys, monkeypatch, argv, message):
    """A RuntimeError or IndexError from inside the simulated ranks, or torch's for an unknown device, was the
    answer."""
    assert message in refused(capsys, monkeypatch, "gpu_kernels", argv, parse="main")


def test_gpu_kernels_on_cuda_without_it_is_one_line(capsys, monkeypatch):
    gpu_kernels = importlib.import_module("gpu_kernels")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert run_tool("gpu_kernels.py", lambda: gpu_kernels.main(["--device", "cuda", "--seq", "128"])) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("gpu_kernels.py: error: torch ") and "sees no CUDA GPU here" in line


def test_longest_sequence_refuses_a_cap_below_what_the_optimizer_step_alone_holds(capsys, monkeypatch):
    """--cap-mib 0.5 measured for 40 s, then came as a rank's nested traceback naming a '0 MiB' cap."""
    assert refused(capsys, monkeypatch, "longest_sequence", ["--cap-mib", "0.5", "--variants", "ring"]) == (
        "longest_sequence.py: error: --cap-mib 0.5 is below the 56 MiB that the parameters, gradients and AdamW "
        "moments of ring's model take at s=512 (16 bytes a parameter), before any activation; give a --cap-mib of "
        "57 or more")


@pytest.mark.parametrize("script, argv", [
    ("sp_scaling", ["--steps", "0"]),  # attention_memory imported first, as most model benchmarks
    ("modern", ["--no-such-flag"]),  # results, then train_step (then attention_memory)
])
def test_a_benchmark_that_loads_deepspeed_prints_only_the_error_line(tmp_path, script, argv):
    """A real process (in this one DeepSpeed is long imported): DeepSpeed's accelerator warning, logged to
    stdout at its first import, used to come before argparse's line (and before --help)."""
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), *argv], capture_output=True, text=True,
                          timeout=120, env={**env, "CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{script}.py: error: ") and line.endswith(f"; see {script}.py --help")


@pytest.mark.parametrize("script, argv", [
    ("attention_memory", []), ("sp_scaling", []), ("train_step", []), ("soak", []), ("plan_time", []),
    ("attention_memory", ["--seq-lengths", "512", "--bert-seq-lengths", "512"]),
    ("train_step", ["--seq-lengths", "64", "--contestants", "ours", "ring"]),
    ("train_step", ["--warmup", "0"]), ("modern", ["--warmup", "0"]),
])
def test_default_and_suitable_settings_pass(script, argv):
    importlib.import_module(script).parse_args(argv)


def test_attention_memory_reports_a_single_length():
    """One length (the natural small trial run) has no growth to report, only the SP ratios."""
    import attention_memory

    results = {f"{variant} SP={size}": [(512, 8.0 / size, 0.5)] for variant, size in attention_memory.PLANS["bert"]}
    text = attention_memory.report(results, [512])
    assert "- ring: at s=512 peak SP=1/SP=2 = 2.00, SP=1/SP=4 = 4.00 (ideal 2 and 4)." in text
    assert "grows" not in text


def test_plan_time_shows_the_measuring_process_error_in_one_line(tmp_path):
    """A tree whose code cannot be measured: the child's exception line, not the script it ran."""
    import plan_time

    (tmp_path / "megatron").mkdir()
    (tmp_path / "megatron" / "__init__.py").write_text("raise ImportError('a broken tree')")
    with pytest.raises(plan_time.ConfigError) as failed:
        plan_time.measure(tmp_path, 1024, 1, 1)
    assert str(failed.value) == (f"measuring {tmp_path} failed: ImportError: a broken tree; fix that tree, "
                                 "or leave it out of --tree")


def test_results_cli_writes_nothing_for_help_or_a_missing_file(capsys, monkeypatch, tmp_path):
    import results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    with pytest.raises(SystemExit) as stopped:
        results.main(["--help", "somefile"])
    assert stopped.value.code == 0 and capsys.readouterr().out.startswith("usage: results.py [-h] heading file")
    with pytest.raises(SystemExit) as stopped:
        results.main([])
    assert stopped.value.code == 2
    assert run_tool("results.py", lambda: results.main(["X", str(tmp_path / "missing.md")])) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"results.py: error: cannot use {tmp_path / 'missing.md'} (No such file or directory)")
    assert not results.RESULTS.exists()


def test_results_file_is_replaced_whole_or_left_as_it_was(monkeypatch, tmp_path):
    """A write that fails midway (a full disk) leaves RESULTS.md as it was: written in place, it was truncated to
    the part that fit (16 of 26 sections lost)."""
    import errno

    import results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    before = "# Benchmark results\n\n## One\n\nkept\n\n## Two\n\nkept too\n"
    results.RESULTS.write_text(before)
    written = Path.write_text

    def full_disk(path, text, *args, **kwargs):
        written(path, text[:10], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError):
        results.replace_section("Three", "new")
    monkeypatch.setattr(Path, "write_text", written)
    assert results.RESULTS.read_text() == before and sorted(tmp_path.iterdir()) == [results.RESULTS]


def test_two_results_writers_at_once_keep_both_sections(monkeypatch, tmp_path, capsys):
    """A writer waits while another holds RESULTS.md's folder, then reads what that one wrote (each used to
    write the file as it had read it: the section of the first to finish was lost)."""
    import threading
    import time

    import results
    from megatron.locks import folder_locked

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    results.RESULTS.write_text("# Benchmark results\n")
    second = threading.Thread(target=results.replace_section, args=("Second", "body"))
    with folder_locked(tmp_path, "unused: nothing holds it yet"):  # the first writer, between its read and write
        second.start()
        time.sleep(1.0)
        results.RESULTS.write_text("# Benchmark results\n\n## First\n\nbody\n")
    second.join(timeout=30)
    text = results.RESULTS.read_text()
    assert "## First\n" in text and "## Second\n" in text, text
    assert capsys.readouterr().err == f"waiting for another writer of {results.RESULTS} to finish\n"


@pytest.mark.parametrize("heading, body, problem", [
    ("", "text", "the section title '' is empty, spans lines or has blanks at its ends; give a title of one line"),
    ("Two\nlines", "text", "the section title 'Two\\nlines' is empty, spans lines"),
    ("## Doubled", "text", "the section title '## Doubled' starts with #: it would be written as '## ## Doubled'; "
     "give the title without the #s ('Doubled')"),
    ("Nested", "line one\n## Sub heading\nafter", "the section's text has a line '## Sub heading', a heading of a "
     "section's own level: the section would end there; make it a subheading (### ...) or bold text"),
])
def test_results_cli_refuses_a_section_that_would_break_the_file(capsys, monkeypatch, tmp_path, heading, body,
                                                                  problem):
    import results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    results.RESULTS.write_text("# Benchmark results\n\n## Nested\n\nold\n")
    (tmp_path / "body.md").write_text(body)
    assert run_tool("results.py", lambda: results.main([heading, str(tmp_path / "body.md")])) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"results.py: error: {problem}"), line
    assert results.RESULTS.read_text() == "# Benchmark results\n\n## Nested\n\nold\n"


def test_results_cli_names_a_file_that_is_not_utf8(capsys, monkeypatch, tmp_path):
    import results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    (tmp_path / "binary.md").write_bytes(b"\xff\xfe\x00bin")
    assert run_tool("results.py", lambda: results.main(["X", str(tmp_path / "binary.md")])) == 2
    assert capsys.readouterr().err == (f"results.py: error: {tmp_path / 'binary.md'} is not UTF-8 text (byte 0xff at "
                                       "offset 0); pass a Markdown file saved as UTF-8\n")
    assert not results.RESULTS.exists()


ENTRY_POINTS = sorted(path.stem for path in BENCHMARKS.glob("*.py") if '__name__ == "__main__"' in path.read_text())


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_every_benchmark_runs_its_main_through_run_benchmark(script):
    """One entry point for all: a stop or a mistake is one line, not a traceback (only plan_time.py and
    results.py went through run_tool; Ctrl-C in the others printed tracebacks of every frame)."""
    assert (BENCHMARKS / f"{script}.py").read_text().endswith('if __name__ == "__main__":\n    run_benchmark(main)\n')


def test_a_benchmark_stopped_by_a_signal_ends_in_one_line(capsys, monkeypatch):
    """SIGTERM (a scheduler, `timeout`) raised in the measuring code: its clean-ups run (the finally), one line,
    exit 128 + the signal."""
    import signal
    import time

    import results

    monkeypatch.setattr(sys, "argv", ["comm_model.py"])
    cleaned = []

    def measuring():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        finally:
            cleaned.append(True)

    with pytest.raises(SystemExit) as stopped:
        results.run_benchmark(measuring)
    assert stopped.value.code == 128 + signal.SIGTERM and cleaned == [True]
    assert capsys.readouterr().err == ("comm_model.py: error: interrupted by SIGTERM, partial output removed; rerun "
                                       "the same command to start over\n")


# --- what a run records: only with --write -------------------------------------------------------

RECORDING = sorted(path.stem for path in BENCHMARKS.glob("*.py")
                   if path.stem != "results" and "write_section(" in path.read_text())


def parse(script: str, argv: list, monkeypatch):
    """Runs a benchmark's argument parsing alone (parse_args, or main where it parses first)."""
    module = importlib.import_module(script)
    if hasattr(module, "parse_args"):
        return module.parse_args(argv)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])  # packing.py's main reads sys.argv
    return module.main() if script == "packing" else module.main(argv)


@pytest.mark.parametrize("script", RECORDING)
def test_every_benchmark_that_writes_results_takes_write(capsys, monkeypatch, script):
    """Each benchmark that writes a RESULTS.md section offers --write (the shared BenchmarkParser)."""
    import results

    monkeypatch.setattr(results, "WRITE", False)
    with pytest.raises(SystemExit) as stopped:
        parse(script, ["--help"], monkeypatch)
    assert stopped.value.code == 0 and "--write" in capsys.readouterr().out


def test_a_run_without_write_prints_its_section_and_leaves_results_and_plots_alone(capsys, monkeypatch, tmp_path):
    import results

    monkeypatch.setattr(results, "WRITE", False)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    results.RESULTS.write_text("# Benchmark results\n\n## Communication model: ring, ulysses, hybrid\n\npublished\n")
    args = importlib.import_module("comm_model").parse_args(["--seq-length", "3"])  # a toy trial
    assert not args.write
    saved = []
    figure = type("Figure", (), {"savefig": lambda self, path, dpi: saved.append(path)})()
    results.write_section("Communication model: ring, ulysses, hybrid", "| s=3 | toy |")
    results.save_plot(figure, tmp_path / "plot.png")
    results.save_text(tmp_path / "samples.log", "toy")
    assert "published" in results.RESULTS.read_text() and "toy" not in results.RESULTS.read_text()
    assert saved == [] and not (tmp_path / "samples.log").exists()
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["## Communication model: ring, ulysses, hybrid", "", "| s=3 | toy |"]
    assert out[-1] == f"not recorded: rerun with --write to write this section (and any plot) into {results.RESULTS}"
    # with --write the same calls record it
    assert importlib.import_module("comm_model").parse_args(["--write"]).write and results.WRITE
    results.write_section("Communication model: ring, ulysses, hybrid", "| s=1000 | measured |")
    results.save_plot(figure, tmp_path / "plot.png")
    assert "| s=1000 | measured |" in results.RESULTS.read_text() and "published" not in results.RESULTS.read_text()
    assert saved == [tmp_path / "plot.png"]


@pytest.mark.parametrize("parse", ["parse_args", "parse_known_args"])
def test_write_is_set_by_every_parse(monkeypatch, parse):
    """results.WRITE follows --write whichever argparse entry a benchmark calls (parse_known_args
    left it False: a run given --write recorded nothing)."""
    import results

    monkeypatch.setattr(results, "WRITE", False)
    getattr(results.BenchmarkParser(prog="bench.py"), parse)(["--write"])
    assert results.WRITE
    getattr(results.BenchmarkParser(prog="bench.py"), parse)([])
    assert not results.WRITE


def test_make_bench_targets_record_their_sections():
    """`make bench*` keeps recording: every benchmark it runs that writes a section is given --write."""
    makefile = (BENCHMARKS.parent / "Makefile").read_text()
    commands = [line.split() for line in makefile.splitlines() if line.startswith("\t$(PYTHON) benchmarks/")]
    recorded = [words for words in commands if Path(words[1]).stem in RECORDING and "--profile" not in words]
    assert len(recorded) >= 8, commands
    for words in recorded:
        assert "--write" in words, f"Makefile: {' '.join(words)} records nothing without --write"


def test_main_job_rewrites_its_table_and_keeps_the_hand_kept_measurements(monkeypatch, tmp_path, capsys):
    """main_job.py --write replaces its generated section; the dated list of the README's main-job
    figures, kept by hand, is in a section of its own and survives."""
    import results

    monkeypatch.setattr(results, "WRITE", True)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    results.RESULTS.write_text((BENCHMARKS / "RESULTS.md").read_text())
    results.write_section("Main job: classic or modern layers", "a new table")
    text = results.RESULTS.read_text()
    assert "a new table" in text and "Unigram cross-entropy of the corpus: 6.25" not in text
    assert "The README's main-job figures, where each was measured" in text
    assert "2026-11-27 (commit dd9b7e1" in text and "The modern layers win clearly" in text


@pytest.mark.parametrize("flags, problem", [
    (["--results", "{tmp}/nodir/R.md", "--write"], "--results {tmp}/nodir/R.md: its folder {tmp}/nodir does not exist; "
     "check the path, or create the folder first (mkdir -p {tmp}/nodir)"),
    (["--results", "{tmp}", "--write"], "--results {tmp} is a directory, not a file; pass --results a Markdown file in "
     "a folder this user can write (the plot goes beside it)"),
    (["--data-dir", "{tmp}/afile"], "--data-dir {tmp}/afile is a file, not a directory; pass a --data-dir folder"),
])
def test_packing_checks_its_paths_before_it_measures(capsys, monkeypatch, tmp_path, flags, problem):
    """A --results that cannot be written was found after the whole run (a traceback, or the plot written beside a
    folder given for it); a file given as --data-dir was a traceback."""
    packing = importlib.import_module("packing")
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(packing, "data_shares", lambda *args: pytest.fail("measured"))
    argv = ["packing.py", *(flag.format(tmp=tmp_path) for flag in flags)]
    monkeypatch.setattr(sys, "argv", argv)
    assert run_tool("packing.py", packing.main) == 2
    assert capsys.readouterr().err.startswith(f"packing.py: error: {problem.format(tmp=tmp_path)}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile"]


def test_main_job_replaces_only_its_own_runs_in_out(tmp_path):
    """--out X removed X/classic and X/modern, whatever they held; now only runs it wrote there itself (its mark),
    and a file given as --out is named as such (it was a traceback)."""
    main_job = importlib.import_module("main_job")
    theirs = tmp_path / "theirs"
    (theirs / "modern").mkdir(parents=True)
    (theirs / "modern" / "keep.txt").write_text("precious")
    with pytest.raises(main_job.ConfigError) as refused:
        main_job.check_out(theirs)
    assert str(refused.value) == (f"--out {theirs} holds modern, which main_job.py did not write there (its runs are "
                                  "replaced by its next run); pass --out a new folder, or one of its earlier runs")
    assert (theirs / "modern" / "keep.txt").read_text() == "precious" and not (theirs / main_job.MARK).exists()
    ours = tmp_path / "new" / "out"
    main_job.check_out(ours)  # made, and marked as its own
    (ours / "classic").mkdir()
    (ours / "classic" / "metrics.jsonl").write_text("{}\n")
    (ours / "classic.log").write_text("an earlier run")
    main_job.check_out(ours)
    assert sorted(path.name for path in ours.iterdir()) == [main_job.MARK, "classic.log"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(main_job.ConfigError, match=f"--out {tmp_path / 'afile'} is a file, not a directory"):
        main_job.check_out(tmp_path / "afile")


@pytest.mark.parametrize("write", [False, True])
def test_sp_scaling_profiles_go_under_benchmarks_with_write_only(monkeypatch, write):
    """The automatic profile (ring below its efficiency target) writes the committed
    benchmarks/profiles/ tables only with --write; a trial's go to a temporary folder."""
    import results
    sp_scaling = importlib.import_module("sp_scaling")
    monkeypatch.setattr(results, "WRITE", write)
    folders = []
    monkeypatch.setattr(sp_scaling, "run_on_ranks", lambda fn, size, *args, **kwargs: folders.append(args[3]) or [])
    sp_scaling.profile_ring(64)
    assert len(folders) == 2 and len(set(folders)) == 1
    assert (Path(folders[0]) == sp_scaling.PROFILES) == write


@pytest.mark.parametrize("write", [False, True])
def test_train_step_profiles_go_under_benchmarks_with_write_only(monkeypatch, tmp_path, write):
    """train_step.py --profile wrote into the committed benchmarks/profiles/ without --write; now a trial's go to a
    temporary folder, as sp_scaling.py's do."""
    import results
    train_step = importlib.import_module("train_step")
    monkeypatch.setattr(results, "WRITE", write)
    monkeypatch.setattr(train_step, "PROFILES", tmp_path / "profiles")
    for contestant in ("Ours", "HuggingFace"):  # the tables' contents are torch's
        monkeypatch.setattr(train_step, contestant, lambda config, state: (lambda batch: None))
    written = train_step.profile("small", 64, 64, 0.0)
    assert len(written) == 2 and len({path.parent for path in written}) == 1
    assert (written[0].parent == tmp_path / "profiles") == write
