"""Same config and seed -> the same losses bit for bit on CPU (2 ranks, SP=2 ring, dropout on);
another seed -> other losses. --deterministic (the GPU settings) leaves CPU results unchanged."""
import contextlib
import io
import json

from megatron.data.default_dataset import prepare_default_dataset
from megatron.parallel.spawn import run_on_ranks
from megatron.training import main

STEPS = 20
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", "--attention", "ring", "--sequence-parallel-size", "2",
        "--attention-dropout", "0", "--hidden-dropout", "0.1", "--micro-batch-size", "2", "--lr", "1e-3",
        "--train-iters", str(STEPS), "--split", "90,5,5", "--log-interval", "1", "--eval-interval", "10",
        "--eval-iters", "1"]


def main_and_stdout(argv: list) -> tuple:
    """main's exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def losses(tmp_path, data, name: str, *extra) -> list:
    """Every logged loss of one run (train, validation, test) as exact floats."""
    log_dir = tmp_path / name
    argv = [*TINY, "--data-path", data.data_prefix, "--vocab-file", str(data.vocab_file), "--log-dir", str(log_dir),
            *extra]
    ranks = run_on_ranks(main_and_stdout, 2, argv, timeout=300)
    assert [code for code, _ in ranks] == [0, 0]
    # bitwise against itself, but not against the single process: dropout draws its masks per rank, said once
    assert [out.count("note: dropout (hidden 0.1, attention 0) draws its masks per layout: this sequence-parallel 2 "
                      "run matches the single-process run statistically") for _, out in ranks] == [1, 0]
    records = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["kind"], r["iteration"], r["loss"], r.get("mlm_loss"), r.get("sop_loss"), r.get("grad_norm"))
            for r in records if r["kind"] != "start"]  # a run's start record holds no loss


def test_same_seed_same_losses_bit_for_bit(tmp_path):
    data = prepare_default_dataset(tmp_path / "data", max_bytes=300_000, vocab_size=2000)
    first = losses(tmp_path, data, "first")
    kinds = [kind for kind, *_ in first]
    assert kinds.count("train") == STEPS and {"validation", "test"} <= set(kinds)
    assert losses(tmp_path, data, "again", "--deterministic") == first  # exact float equality
    other = losses(tmp_path, data, "other_seed", "--seed", "4321")
    assert [loss for _, _, loss, *_ in other] != [loss for _, _, loss, *_ in first]


def test_each_pipeline_and_sequence_coordinate_draws_its_own_dropout_stream(monkeypatch):
    """Megatron's seed + 100 * pipeline rank, counted over pipeline x sequence coordinates: every model-parallel
    rank its own seed (sequence ranks hold other tokens or heads of the same samples), data-parallel ranks
    (other samples) one seed as in Megatron, and the first coordinate the run's seed unchanged."""
    from megatron import determinism
    from megatron.parallel import state

    seeds = {}
    for pipe in range(2):
        for seq in range(3):
            for data in range(2):
                monkeypatch.setattr(state, "get_pipe_parallel_rank", lambda: pipe)
                monkeypatch.setattr(state, "get_sequence_parallel_rank", lambda: seq)
                monkeypatch.setattr(state, "get_sequence_parallel_world_size", lambda: 3)
                seeds[pipe, seq, data] = determinism.dropout_seed(1234)
    assert seeds[0, 0, 0] == 1234
    assert len({seeds[pipe, seq, 0] for pipe in range(2) for seq in range(3)}) == 6
    assert all(seeds[pipe, seq, 0] == seeds[pipe, seq, 1] for pipe in range(2) for seq in range(3))
