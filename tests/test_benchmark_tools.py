"""The measuring parts of benchmarks/: the longest-sequence search, the soak's growth test and its
launch, the ring exchange hooks of the scaling benchmark (which must hit ring.py's real exchange), and the
packed-vs-unpacked steps and equal-time race of the packing benchmark."""
import contextlib
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from longest_sequence import longest_fitting  # noqa: E402
import packing  # noqa: E402
import soak  # noqa: E402
from soak import rss_trend  # noqa: E402
from sp_scaling import time_steps  # noqa: E402

from megatron.data.default_dataset import prepare_default_dataset  # noqa: E402
from megatron.errors import ConfigError, Interrupted  # noqa: E402
from megatron.locks import running  # noqa: E402
from megatron.parallel.spawn import run_on_ranks  # noqa: E402


@pytest.mark.parametrize("cap", [70.0, 96.0, 250.0])
def test_longest_fitting_finds_the_measured_boundary(cap):
    """A peak that is flat (optimizer-bound) at short lengths, then linear: the search returns
    the longest fitting multiple of the step, having measured it and the length above it."""
    calls = []

    def peak(seq):
        return max(60.0, 20.0 + 0.0271 * seq)

    def measure(seq):
        calls.append(seq)
        return peak(seq), 0.0

    seq, measured = longest_fitting(measure, (1024, 2048), cap, step=512)
    expected = max(s for s in range(512, 20000, 512) if peak(s) <= cap)
    assert seq == expected
    assert {seq, seq + 512} <= set(measured)
    assert len(set(calls)) == len(calls) <= 10 + 2  # no length measured twice; a handful of steps


def test_longest_fitting_refuses_a_cap_below_the_shortest_length(monkeypatch):
    """In one line naming the variant and SP, from the rank that measured it (it was that rank's traceback inside
    the RankFailure's)."""
    import longest_sequence

    with pytest.raises(ConfigError, match="raise --cap-mib to 101 or more"):
        longest_fitting(lambda seq: (100.0 + seq / 1024, 0.0), (1024, 2048), 50.5, step=512)
    monkeypatch.setattr(longest_sequence, "run_on_ranks", lambda *args, **kwargs: [
        {"refused": ("even s=512 needs 58 MiB, above the 57.5 MiB cap", "raise --cap-mib to 58 or more")}])
    with pytest.raises(ConfigError) as refused:
        longest_sequence.search(["ring"], 57.5)
    assert str(refused.value) == "ring at SP=1: even s=512 needs 58 MiB, above the 57.5 MiB cap; raise --cap-mib to " \
                                 "58 or more"


def test_rss_trend_tells_a_leak_from_noise():
    g = torch.Generator().manual_seed(0)
    steps = list(range(200, 2001, 20))
    noise = (torch.randn(len(steps), generator=g) * 0.8).tolist()
    flat = rss_trend(steps, [400.0 + n for n in noise], 1800)
    leaking = rss_trend(steps, [400.0 + 0.004 * s + n for s, n in zip(steps, noise)], 1800)  # 4 MiB / 1000 steps
    assert not flat["grows"] and abs(flat["slope_mib_per_1k"]) < flat["ci_mib_per_1k"] + 0.5
    assert leaking["grows"] and leaking["slope_mib_per_1k"] == pytest.approx(4.0, abs=1.0)


def test_a_stopped_soak_stops_the_launcher_and_its_ranks(tmp_path, monkeypatch):
    """SIGTERM to soak.py (raised in its loop by run_benchmark's handler) stops the deepspeed launcher it
    started and the ranks under it: a plain Popen left them training. A stand-in launcher starts a rank."""
    pids = tmp_path / "pids"
    launcher = tmp_path / "deepspeed"
    launcher.write_text(f"""#!{sys.executable}
import os, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{rank.pid}}")
print("iteration 1/10", flush=True)
time.sleep(120)
""")
    launcher.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # soak starts the deepspeed beside it

    def stopped(pid):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(soak, "rank_processes", stopped)
    try:
        with pytest.raises(Interrupted):
            soak.soak(10, 1, tmp_path, {})
        assert [pid for pid in map(int, pids.read_text().split()) if running(pid)] == []
    finally:
        for pid in map(int, pids.read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_main_job_takes_a_finished_run_as_done_and_a_failed_one_as_failed(tmp_path, monkeypatch):
    """A candidate that trained all its iterations (exit 0) while the other still started was reported as 'a
    run ended before training'; one that exits before it trained, or fails later, stops the comparison."""
    import main_job

    train = '{"kind": "train", "iteration": 2}\n'
    for name in main_job.CANDIDATES:
        (tmp_path / name).mkdir()
    (tmp_path / "classic" / "metrics.jsonl").write_text(train)
    runs = {"classic": SimpleNamespace(poll=lambda: 0), "modern": SimpleNamespace(poll=lambda: None)}
    waits = []

    def sleep(seconds):  # the modern run starts training while main_job waits
        waits.append(seconds)
        (tmp_path / "modern" / "metrics.jsonl").write_text(train)
        runs["modern"].poll = lambda: 0  # and finishes

    monkeypatch.setattr(main_job.time, "sleep", sleep)
    main_job.train_side_by_side(runs, tmp_path, 600.0)
    assert waits == [2]  # both finished: no waiting out the 600 s
    (tmp_path / "modern" / "metrics.jsonl").unlink()
    runs["modern"].poll = lambda: 1
    with pytest.raises(SystemExit, match=rf"main_job.py: error: the modern run ended with exit code 1 early; see "
                                         rf"{tmp_path / 'modern'}.log"):
        main_job.train_side_by_side(runs, tmp_path, 600.0)


def test_ring_exchange_is_recorded_and_replaced_by_a_local_copy():
    """Two ranks, 4 ring layers: one step sends 3P - 2 = 4 ring messages per layer (forward K/V,
    backward K/V, two dK/dV hops); both modes ran and the replay of those messages took time."""
    per_rank = run_on_ranks(time_steps, 2, "ring", 2, [256], 1, timeout=120)
    for rank in per_rank:
        row = rank[256]
        assert row["messages"] == 4 * 4
        assert len(row["comm"]) == len(row["local"]) == 1
        assert row["comm_alone"] > 0


def test_packing_benchmark_times_both_kinds_of_sample_and_races_them_from_one_start(tmp_path):
    """In this process (SP=1, a small corpus): both kinds of sample get the same timed steps, the
    packed ones nearly full of text; the race starts both models from the same weights (the same
    loss at 0 s) and evaluates each at every mark until both have trained the time."""
    data = str(tmp_path)
    prepare_default_dataset(data, workers=1, max_bytes=300_000, packages=(), vocab_size=2000)
    seq, steps = 256, 2
    timed = packing.time_steps(data, 1, [128], [seq], [steps])[128, seq]
    assert [len(timed[mode]["seconds"]) for mode in ("packed", "unpacked")] == [steps, steps]
    assert timed["packed"]["real"] >= 0.9 * steps * seq >= timed["unpacked"]["real"] * 0.9

    seconds, evaluations = 0.2, 2
    log = packing.race(data, 1, 128, 128, seconds, evaluations, eval_samples=1, train_samples=32)
    assert log["packed"]["eval"][0] == log["unpacked"]["eval"][0] == (0.0, log["packed"]["eval"][0][1])
    for mode in ("packed", "unpacked"):
        times = [t for t, _ in log[mode]["eval"]]
        assert times == sorted(times) and times[-1] >= seconds and 2 <= len(times) <= evaluations + 1
        assert log[mode]["steps"] == len(log[mode]["train"]) >= 1
