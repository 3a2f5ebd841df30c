"""--data-cache-path: index maps of data on a read-only folder go to a writable cache, named by
the data's contents (reused from another mount path, apart for another corpus of the same name);
each node builds into a cache of its own; a folder no rank can write is one line on every rank;
the start-up report and tools/clean_index_maps.py look in the cache."""
import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from megatron.data import bert_dataset, index_maps
from megatron.data.bert_dataset import build_train_valid_test_datasets
from megatron.errors import DataError
from megatron.parallel.spawn import run_on_ranks
from megatron.paths import python_command
from test_data_bert import write_corpus, write_vocab
from test_housekeeping import clean

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` made unwritable for real: mode 0555 for a normal user; root ignores modes, so for
    root the immutable attribute (chattr +i), as a read-only mount refuses writes."""
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    immutable = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    try:
        probe = folder / ".probe"
        try:
            probe.write_text("x")
            probe.unlink()
            pytest.skip("cannot make a read-only folder here (root without chattr +i)")
        except OSError:
            pass
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(mode)


def datasets(prefix, tokenizer, cache_path=None):
    return build_train_valid_test_datasets([str(prefix)], "mmap", "90,10,0", (120, 20, 0), 64, tokenizer,
                                           cache_path=cache_path, pack_samples=True, max_segment_length=32)


def test_read_only_data_keeps_its_maps_in_the_cache(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    prefix, tokenizer = write_corpus(data / "corpus", num_docs=60), write_vocab(data)
    reference = tmp_path / "writable"
    shutil.copytree(data, reference)
    expected = datasets(reference / "corpus", tokenizer)[0]
    before = sorted(os.listdir(data))
    with read_only(data):
        with pytest.raises(DataError) as error:
            datasets(prefix, tokenizer)
        message = str(error.value)
        assert "\n" not in message and f"cannot be written to {data}" in message and "--data-cache-path DIR" in message
        assert sorted(os.listdir(data)) == before  # no map, no .partial left behind

        cache = tmp_path / "cache" / "maps"  # created on first use
        train = datasets(prefix, tokenizer, str(cache))[0]
        assert sorted(os.listdir(data)) == before
    fingerprint = index_maps.fingerprint(prefix, cache_path=None)
    assert index_maps.fingerprint_path(prefix, str(cache)).is_file()  # made with the folder: not hashed again
    names = sorted(path.name for path in cache.iterdir() if not path.name.endswith(index_maps.FINGERPRINT_RECORD))
    assert len(names) == 4 and all(name.startswith(f"corpus-{fingerprint}_") for name in names), names
    assert {"train", "valid"} == {name.split("_")[1] for name in names}
    assert [Path(path).parent for path in train.map_files()] == [cache, cache]
    for index in (0, 7, len(train) - 1):  # the same samples as maps built next to the data
        assert all(np.array_equal(train[index][key], expected[index][key]) for key in expected[index])

    # the same data mounted elsewhere (another job) reuses the maps; another corpus of the same name does not
    moved = tmp_path / "mounted_elsewhere"
    shutil.copytree(data, moved)
    monkeypatch.setattr(bert_dataset.helpers, "build_mapping", pytest.fail)
    assert np.array_equal(datasets(moved / "corpus", tokenizer, str(cache))[0].indices, train.indices)
    (tmp_path / "other").mkdir()
    other = write_corpus(tmp_path / "other" / "corpus", num_docs=60, seed=5)
    assert index_maps.fingerprint(other, cache_path=None) != fingerprint
    assert index_maps.maps_prefix(other, cache_path=str(cache)) != index_maps.maps_prefix(prefix, cache_path=str(cache))


def test_report_and_clean_tool_look_in_the_cache(tmp_path):
    prefix, tokenizer = write_corpus(tmp_path / "corpus", num_docs=60), write_vocab(tmp_path)
    cache = tmp_path / "cache"
    used = [path for dataset in datasets(prefix, tokenizer, str(cache))[:2] for path in dataset.map_files()]
    old = build_train_valid_test_datasets([prefix], "mmap", "90,10,0", (60, 0, 0), 48, tokenizer,
                                          cache_path=str(cache))[0].map_files()  # other settings
    line = index_maps.describe([prefix], used, "runs/x", str(cache))
    assert line.startswith(f"index maps in {cache.resolve()}: 4 used by this run; 1 others"), line
    assert (f"{python_command()} tools/clean_index_maps.py {prefix} --data-cache-path {cache} --keep-run runs/x --dry-run lists "
            "them") in line, line
    log = tmp_path / "log"
    log.mkdir()
    index_maps.write_used(str(log), used, [prefix], str(cache))
    records = [index_maps.fingerprint_path(prefix), index_maps.fingerprint_path(prefix, str(cache))]
    for record in records:
        record.unlink(missing_ok=True)  # data without a record: its fingerprint is hashed
    result = clean(prefix, "--data-cache-path", cache, "--keep-run", log, "--dry-run")
    assert result.returncode == 0 and result.stdout.splitlines()[-1].startswith("would remove 1 index maps ("), result
    assert not any(record.exists() for record in records)  # a dry run writes nothing
    result = clean(prefix, "--data-cache-path", cache, "--keep-run", log)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"removed {old[0]}" and lines[1].startswith("removed 1 index maps (") and \
        lines[1].endswith("), 4 kept") and len(lines) == 2, result.stdout
    kept = [str(path) for path in cache.iterdir() if not path.name.endswith(index_maps.FINGERPRINT_RECORD)]
    assert sorted(kept) == sorted(used)  # and the data's fingerprint record (a cache folder keeps it)
    result = clean(prefix, "--data-cache-path", tmp_path / "nowhere")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "is not a folder" in result.stderr


def build_as_a_node(prefix, vocab_file, caches, failing_build=False):
    """Each rank plays a node (LOCAL_RANK 0) whose cache folder is caches[rank]: (did this rank
    build the map, the mapping, or the error it raised as 'Type: message')."""
    from megatron.data.tokenizer import BertWordPiece
    from megatron.data.bert_dataset import BertDataset
    from megatron.data.indexed_dataset import make_dataset

    os.environ["LOCAL_RANK"] = "0"
    rank = __import__("torch").distributed.get_rank()
    calls = []
    build = bert_dataset.helpers.build_mapping
    def counting(*args, **kwargs):
        calls.append(1)
        if failing_build:
            raise ValueError("bad sizes")
        return build(*args, **kwargs)

    bert_dataset.helpers = type("Counting", (), {"build_mapping": staticmethod(counting)})
    maps = index_maps.maps_prefix(prefix, cache_path=caches[rank])
    try:
        train = BertDataset("train", make_dataset(prefix), maps, (0, 40), 64, 64, BertWordPiece(vocab_file))
    except (DataError, ValueError) as error:
        return bool(calls), f"{type(error).__name__}: {error}"
    return bool(calls), np.array(train.mapping)


def test_each_node_builds_into_its_own_cache_and_an_unwritable_one_stops_all(tmp_path):
    prefix = write_corpus(tmp_path / "c", num_docs=40)
    vocab = write_vocab(tmp_path).file
    (tmp_path / "a_file").write_text("")
    caches = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    (built0, map0), (built1, map1) = run_on_ranks(build_as_a_node, 2, prefix, vocab, caches, timeout=120)
    assert (built0, built1) == (True, True) and np.array_equal(map0, map1)  # node 1 could not see node 0's file
    shared = [str(tmp_path / "shared")] * 2
    (built0, map0), (built1, map1) = run_on_ranks(build_as_a_node, 2, prefix, vocab, shared, timeout=120)
    assert (built0, built1) == (True, False) and np.array_equal(map0, map1)
    broken = [str(tmp_path / "node0b"), str(tmp_path / "a_file" / "cache")]  # rank 1's cannot be created
    (built0, error0), (built1, error1) = run_on_ranks(build_as_a_node, 2, prefix, vocab, broken, timeout=120)
    assert (built0, built1) == (True, False) and error0 == error1, (error0, error1)
    assert f"cannot be written to {tmp_path / 'a_file' / 'cache'}" in error0 and "--data-cache-path DIR" in error0
    # a build that fails otherwise (a bug, a corrupt .idx): its own error on the builder, one line on the rest
    fresh = [str(tmp_path / "fresh")] * 2
    (built0, error0), (built1, error1) = run_on_ranks(build_as_a_node, 2, prefix, vocab, fresh, True, timeout=120)
    assert error0 == "ValueError: bad sizes" and error1.startswith("DataError: building index map "), error1
    assert "failed (ValueError: bad sizes)" in error1
    left = [path.name for path in (tmp_path / "fresh").iterdir()]
    assert left == [index_maps.fingerprint_path(prefix, fresh[0]).name]  # the data's record only: no map, no .partial
