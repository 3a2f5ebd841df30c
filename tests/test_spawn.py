"""The multi-rank test helper surfaces child failures instead of hanging or passing."""
import os

import pytest
import torch
import torch.distributed as dist

from megatron.parallel.spawn import RankFailure, run_on_ranks


def rank_and_world():
    return dist.get_rank(), dist.get_world_size(), os.environ["MASTER_ADDR"]


def fail_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("boom from rank one")
    dist.barrier()


def hang_on_rank_one():
    if dist.get_rank() == 1:
        import time
        time.sleep(60)


def die_on_rank_one():
    if dist.get_rank() == 1:
        os._exit(3)
    return "survived"


def test_results_in_rank_order():
    assert run_on_ranks(rank_and_world, 3) == [(r, 3, "127.0.0.1") for r in range(3)]


def test_child_traceback_is_surfaced():
    with pytest.raises(RankFailure, match=r"(?s)rank 1 of 2 failed.*ValueError: boom from rank one"):
        run_on_ranks(fail_on_rank_one, 2, timeout=60)


def test_a_rank_running_another_checkouts_code_is_refused(monkeypatch, tmp_path):
    """The ranks import megatron through the forkserver's own sys.path; when that is another tree
    than the caller's (pytest of one checkout run with another's Python), the two sides would run
    different code and a comparison between them would fail for no reason of its own."""
    from megatron.parallel import spawn

    real = spawn.TREE
    monkeypatch.setattr(spawn, "TREE", tmp_path)  # the caller's tree, as the child sees it passed
    with pytest.raises(RankFailure, match=f"this rank imported megatron from {real}, its caller from {tmp_path}"):
        run_on_ranks(rank_and_world, 1, timeout=60)


def test_hanging_rank_times_out():
    with pytest.raises(RankFailure, match=r"ranks \[1\] did not finish within 5s"):
        run_on_ranks(hang_on_rank_one, 2, timeout=5)


def test_dead_rank_is_reported():
    with pytest.raises(RankFailure, match="rank1 exited without a result"):
        run_on_ranks(die_on_rank_one, 2, timeout=60)


def environment_threads_and_output(name: str):
    os.write(1, f"rank {dist.get_rank()} writes here\n".encode())  # one write: the ranks' lines do not interleave
    return os.environ.get(name), torch.get_num_threads()


def test_ranks_take_the_callers_environment_threads_and_output_at_the_call(monkeypatch, capfd):
    """Forked from a server started earlier, a rank still sees the environment and stdout the
    caller has at the call (here: pytest's capture of this test), as a spawned rank would."""
    with capfd.disabled():  # the server (if this is the first call) starts with other stdout and environment
        run_on_ranks(rank_and_world, 2)
    monkeypatch.setenv("SPAWN_TEST_VALUE", "changed after the server started")
    assert run_on_ranks(environment_threads_and_output, 2, "SPAWN_TEST_VALUE", threads_per_rank=2) == [
        ("changed after the server started", 2)] * 2
    assert sorted(capfd.readouterr().out.splitlines()) == ["rank 0 writes here", "rank 1 writes here"]
