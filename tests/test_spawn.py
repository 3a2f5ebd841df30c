"""The multi-rank test helper surfaces child failures instead of hanging or passing."""
import os

import pytest
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


def test_hanging_rank_times_out():
    with pytest.raises(RankFailure, match=r"ranks \[1\] did not finish within 5s"):
        run_on_ranks(hang_on_rank_one, 2, timeout=5)


def test_dead_rank_is_reported():
    with pytest.raises(RankFailure, match="rank1 exited without a result"):
        run_on_ranks(die_on_rank_one, 2, timeout=60)
