"""Index maps know the data they were built from: their names carry a fingerprint of the `.idx`
and `.bin` next to the data as in a cache folder, preprocessing into a prefix removes the maps of
the data it replaces, and a run on the new data builds its own maps (the same as in a fresh
folder) instead of reusing the old ones (which gave too few samples, or a traceback when the new
documents were shorter)."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from megatron.data import bert_dataset, index_maps
from megatron.data.bert_dataset import build_train_valid_test_datasets
from megatron.data.preprocess import PreprocessOptions, preprocess
from megatron.data.tokenizer import build_tokenizer
from megatron.data.vocab_builder import train_vocab, write_vocab
from megatron.errors import ConfigError, DataError
from test_corpus_formats import write_shard
from test_preprocess import article
from test_tokenizer import load_tool

DOCS = 120


def short_article(i: int) -> dict:
    """Other text, the same number of documents, two short sentences each."""
    return {"text": f"Short note {i} on the harbor.\nIt was rebuilt in {1950 + i}."}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """(long corpus, short corpus, vocab, tokenizer): the same document count, other text."""
    folder = tmp_path_factory.mktemp("corpora")
    long = write_shard(folder / "long.json", [article(i) for i in range(DOCS)])
    short = write_shard(folder / "short.json", [short_article(i) for i in range(DOCS)])
    (folder / "both.json").write_bytes(long.read_bytes() + short.read_bytes())
    write_vocab(train_vocab(folder / "both.json", lower_case=True, vocab_size=400), folder / "vocab.txt")
    return long, short, folder / "vocab.txt", build_tokenizer("BertWordPieceLowerCase", folder / "vocab.txt")


def preprocessed(corpus, output_prefix, vocab) -> str:
    report = preprocess(PreprocessOptions(input=str(corpus), output_prefix=str(output_prefix), vocab_file=str(vocab),
                                          split_sentences=True, log_interval=0))
    return report.outputs["text"]


def train_set(prefix, tokenizer, cache_path=None):
    return build_train_valid_test_datasets([prefix], "mmap", "1", (300, 0, 0), 48, tokenizer, cache_path=cache_path,
                                           seed=3)[0]


@pytest.fixture
def builds(monkeypatch) -> list:
    """Records every index map built (not loaded)."""
    built, build_mapping = [], bert_dataset.helpers.build_mapping

    def counting(*args, **kwargs):
        built.append(args[3])
        return build_mapping(*args, **kwargs)

    monkeypatch.setattr(bert_dataset.helpers, "build_mapping", counting)
    return built


def test_preprocessing_again_removes_the_old_maps_and_the_next_run_builds_new_ones(corpora, tmp_path, builds, capsys):
    long, short, vocab, tokenizer = corpora
    prefix = preprocessed(long, tmp_path / "data" / "wiki", vocab)
    old = train_set(prefix, tokenizer)
    old_maps = old.map_files()
    old_fingerprint = index_maps.fingerprint(prefix, cache_path=None)
    assert [path.rsplit("/", 1)[1].split("_train_")[0] for path in old_maps] == [f"wiki_text_sentence-{old_fingerprint}"]
    assert len(builds) == 1

    # the same document count, other (shorter) text, into the same prefix, through the tool
    main = load_tool("preprocess_data").main
    main(["--input", str(short), "--vocab-file", str(vocab), "--output-prefix", str(tmp_path / "data" / "wiki"),
          "--split-sentences", "--log-interval", "0"])
    assert capsys.readouterr().out.splitlines()[-1] == "removed 1 index maps of the data these outputs replaced"
    assert not any(os.path.exists(path) for path in old_maps)
    assert index_maps.fingerprint(prefix, cache_path=None) != old_fingerprint

    new = train_set(prefix, tokenizer)
    assert len(builds) == 2 and new.map_files() != old_maps
    fresh = train_set(preprocessed(short, tmp_path / "fresh" / "wiki", vocab), tokenizer)
    assert np.array_equal(new.mapping, fresh.mapping) and len(new) != len(old)
    for index in (0, len(new) // 2, len(new) - 1):  # every sample readable, as in a fresh folder
        assert np.array_equal(new[index]["tokens"], fresh[index]["tokens"])
    line = index_maps.describe([prefix], index_maps.used_maps(new), "runs/x")
    assert line == f"index maps in {(tmp_path / 'data').resolve()}: 1 used by this run, no others"

    # preprocessing the same text again keeps the maps: they still describe the data
    assert preprocess(PreprocessOptions(input=str(short), output_prefix=str(tmp_path / "data" / "wiki"),
                                        vocab_file=str(vocab), split_sentences=True, log_interval=0)).removed_maps == []
    train_set(prefix, tokenizer)
    assert len(builds) == 3  # the fresh folder's build; the data folder's map was reused


def test_a_cache_folder_gets_maps_of_the_new_data(corpora, tmp_path, builds):
    long, short, vocab, tokenizer = corpora
    cache = tmp_path / "cache"
    prefix = preprocessed(long, tmp_path / "data" / "wiki", vocab)
    old = train_set(prefix, tokenizer, str(cache))
    prefix = preprocessed(short, tmp_path / "data" / "wiki", vocab)
    new = train_set(prefix, tokenizer, str(cache))
    assert len(builds) == 2 and len(new) != len(old)
    assert all(path.startswith(str(cache)) for path in old.map_files() + new.map_files())
    assert (index_maps.maps_of(prefix, cache_path=str(cache))
            == [cache / path.rsplit("/", 1)[1] for path in new.map_files()])


def test_the_fingerprint_sees_other_tokens_of_the_same_sizes(corpora, tmp_path, monkeypatch):
    """A `.bin` with other tokens at the same sizes leaves the `.idx` as it was: the `.bin` counts,
    hashed whole when small, by size and evenly spread blocks when large."""
    long, _, vocab, _ = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)

    def fingerprint():
        index_maps._contents_digest.cache_clear()  # as a new process would
        return index_maps.fingerprint(prefix, cache_path=None)

    monkeypatch.setattr(index_maps, "BIN_BLOCK_BYTES", 64)
    for whole_bytes in (index_maps.BIN_WHOLE_BYTES, 1024):  # the .bin is ~10 KB
        monkeypatch.setattr(index_maps, "BIN_WHOLE_BYTES", whole_bytes)
        before = fingerprint()
        tokens = np.memmap(f"{prefix}.bin", dtype=np.uint16, mode="r+")
        tokens[:8] = np.roll(tokens[:8], 1)  # in the first block, sampled in both modes
        tokens.flush()
        del tokens
        later(f"{prefix}.bin")
        assert fingerprint() != before, whole_bytes
    before = fingerprint()
    index = np.memmap(f"{prefix}.idx", dtype=np.uint8, mode="r+")
    index[-1] ^= 1  # the last document boundary
    index.flush()
    del index
    later(f"{prefix}.idx")
    assert fingerprint() != before


def later(path) -> None:
    """Moves a file's mtime a second on, as a write after the last start leaves it (a write within the
    clock's tick, a few ms, may leave the same mtime)."""
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_the_fingerprint_is_recorded_beside_the_data_and_hashed_again_only_when_the_files_change(
        corpora, tmp_path, monkeypatch):
    """Hashing a sentence-level `.idx` reads ~40% of the data on every rank at every start: preprocessing
    records the digest with the files' stamps, and a start on the same files reads the record."""
    long, short, vocab, _ = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)
    record = index_maps.fingerprint_path(prefix)
    assert record.is_file()
    hashed, hash_contents = [], index_maps._hash_contents
    monkeypatch.setattr(index_maps, "_hash_contents", lambda *paths: hashed.append(paths) or hash_contents(*paths))

    def fingerprint():
        index_maps._contents_digest.cache_clear()  # as a new process would
        return index_maps.fingerprint(prefix, cache_path=None)

    before = fingerprint()
    assert hashed == [] and fingerprint() == before and hashed == []
    index = np.memmap(f"{prefix}.idx", dtype=np.uint8, mode="r+")
    index[-1] ^= 1  # the same size, other bytes, a later mtime
    index.flush()
    del index
    later(f"{prefix}.idx")
    after = fingerprint()
    assert len(hashed) == 1 and after != before
    assert fingerprint() == after and len(hashed) == 1  # the record was replaced
    record.write_text("{not json")  # a damaged record is hashed again, not trusted
    assert fingerprint() == after and len(hashed) == 2
    # a copy of other bytes of the same size, with the old mtime (cp -p, rsync -t), put in its place:
    # the inode (and the change time) tell
    stamp, copy = os.stat(f"{prefix}.idx"), tmp_path / "copy.idx"
    contents = bytearray(Path(f"{prefix}.idx").read_bytes())
    contents[-1] ^= 1  # the bytes of `before` again
    copy.write_bytes(contents)
    os.utime(copy, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.replace(copy, f"{prefix}.idx")
    assert fingerprint() == before and len(hashed) == 3
    # a folder holding its own preprocessed data (and the records) is preprocessed again as a corpus
    shutil.copy(short, tmp_path / "short.json")
    again = preprocess(PreprocessOptions(input=str(tmp_path), output_prefix=str(tmp_path / "again"),
                                         vocab_file=str(vocab), split_sentences=True, log_interval=0))
    assert again.documents == DOCS


def test_data_in_a_folder_that_cannot_be_written_is_hashed_once_per_process(corpora, tmp_path, monkeypatch):
    long, _, vocab, _ = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)
    expected = index_maps.fingerprint(prefix, cache_path=None)
    index_maps.fingerprint_path(prefix).unlink()
    index_maps._contents_digest.cache_clear()

    def unwritable(path, *args, **kwargs):
        raise PermissionError(13, "Read-only file system", str(path))

    monkeypatch.setattr(index_maps.Path, "write_text", unwritable)  # as on a read-only mount (tests run as root)
    hashed, hash_contents = [], index_maps._hash_contents
    monkeypatch.setattr(index_maps, "_hash_contents", lambda *paths: hashed.append(paths) or hash_contents(*paths))
    assert [index_maps.fingerprint(prefix, cache_path=None) for _ in range(3)] == [expected] * 3
    assert len(hashed) == 1 and not index_maps.fingerprint_path(prefix).exists()


def test_with_a_cache_folder_the_record_is_kept_there_not_beside_the_data(corpora, tmp_path, monkeypatch):
    """--data-cache-path says the data is only read: data without a record (a copy, or made before
    records) gets its record in the cache folder, which the next start reads; nothing beside the data."""
    long, _, vocab, _ = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)
    expected = index_maps.fingerprint(prefix, cache_path=None)
    index_maps.fingerprint_path(prefix).unlink()
    cache = tmp_path / "cache"
    cache.mkdir()
    hashed, hash_contents = [], index_maps._hash_contents
    monkeypatch.setattr(index_maps, "_hash_contents", lambda *paths: hashed.append(paths) or hash_contents(*paths))
    for _ in range(2):
        index_maps._contents_digest.cache_clear()  # as a new process would
        assert index_maps.fingerprint(prefix, cache_path=str(cache)) == expected
    assert len(hashed) == 1 and not index_maps.fingerprint_path(prefix).exists()
    assert [path.name for path in cache.iterdir()] == [index_maps.fingerprint_path(prefix, str(cache)).name]


def test_copies_on_several_nodes_share_one_cache_record_each_hashed_once(corpora, tmp_path, monkeypatch):
    """Nodes with their own copy of the data at one path (other inodes) and one shared cache folder: each
    finds its copy in the record instead of replacing the others' and hashing on every start. The
    folder is made for the record on the first start; the record keeps the last COPIES_KEPT copies."""
    long, _, vocab, _ = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)
    expected = index_maps.fingerprint(prefix, cache_path=None)
    index_maps.fingerprint_path(prefix).unlink()  # copies without a record beside them
    cache = tmp_path / "shared" / "cache"  # not made yet
    hashed, hash_contents, stamps = [], index_maps._hash_contents, index_maps.file_stamps
    monkeypatch.setattr(index_maps, "_hash_contents", lambda *paths: hashed.append(paths) or hash_contents(*paths))

    def start_on_node(node: int) -> str:
        monkeypatch.setattr(index_maps, "file_stamps", lambda path: [[*stamp[:3], stamp[3] + node]
                                                                     for stamp in stamps(path)])
        index_maps._contents_digest.cache_clear()  # a new process
        return index_maps.fingerprint(prefix, cache_path=str(cache))

    assert [start_on_node(node) for node in (0, 1, 0, 1, 0)] == [expected] * 5
    assert len(hashed) == 2 and not index_maps.fingerprint_path(prefix).exists()
    for node in range(2, index_maps.COPIES_KEPT + 1):  # one copy more than a record keeps
        start_on_node(node)
    copies = json.loads(index_maps.fingerprint_path(prefix, str(cache)).read_text())["copies"]
    assert len(copies) == index_maps.COPIES_KEPT and len(hashed) == index_maps.COPIES_KEPT + 1
    start_on_node(1)
    assert len(hashed) == index_maps.COPIES_KEPT + 1
    start_on_node(0)  # the oldest, dropped
    assert len(hashed) == index_maps.COPIES_KEPT + 2


def test_a_building_line_comes_out_before_its_end(tmp_path, monkeypatch):
    """The notice's thread may have begun its line when the build ends: the end's line waits for it."""
    lines, printing = [], threading.Event()

    def slow_print(line, flush=False):
        if line.startswith("building"):
            printing.set()
            time.sleep(0.3)  # a slow terminal
        lines.append(line.split()[0])

    monkeypatch.setattr(bert_dataset, "print", slow_print, raising=False)
    monkeypatch.setattr(bert_dataset, "BUILD_NOTICE_S", 0.0)
    bert_dataset._save_built(str(tmp_path / "map.npy"), lambda: printing.wait(10) and np.zeros(3), "a map")
    assert lines == ["building", "built"]


def test_the_building_rank_says_which_map_it_builds_and_how_long_it_took(corpora, tmp_path, capsys, monkeypatch):
    """A map of 256M samples takes a minute or more, while every rank waits: the one building it says so,
    once the build outlasts BUILD_NOTICE_S (a small map, built at once, says nothing)."""
    long, _, vocab, tokenizer = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)
    capsys.readouterr()
    train_set(prefix, tokenizer)
    assert capsys.readouterr().out == ""  # built well within the default 5 s
    for path in tmp_path.glob("wiki*_indexmap_*.npy"):
        path.unlink()
    build_mapping = bert_dataset.helpers.build_mapping
    monkeypatch.setattr(bert_dataset.helpers, "build_mapping",
                        lambda *args, **kwargs: time.sleep(0.5) or build_mapping(*args, **kwargs))
    monkeypatch.setattr(bert_dataset, "BUILD_NOTICE_S", 0.1)
    train_set(prefix, tokenizer)
    building, built = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"building train index map \(\d+ samples over 120 documents\) \.\.\.", building), building
    assert re.fullmatch(rf"built {re.escape(building[9:-4])} in \d+\.\d s \(\d+\.\d KB\)", built), built
    train_set(prefix, tokenizer)
    assert capsys.readouterr().out == ""  # reused: nothing built


def test_a_damaged_map_is_one_line_and_deleting_it_rebuilds_it(corpora, tmp_path):
    long, _, vocab, tokenizer = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)
    built = train_set(prefix, tokenizer)
    path, expected = built.map_files()[0], np.array(built.mapping)
    del built  # its memory map of the file
    with open(path, "r+b") as file:
        file.truncate(100)
    with pytest.raises(DataError, match=f"index map {path} cannot be read .*; delete it: the next start builds it "
                                        "again") as error:
        train_set(prefix, tokenizer)
    assert "\n" not in str(error.value)
    os.remove(path)
    assert np.array_equal(train_set(prefix, tokenizer).mapping, expected)


def test_maps_of_data_replaced_by_a_copy_are_counted_and_cleaned(corpora, tmp_path, capsys):
    """Data copied over the prefix (not preprocessed there) leaves the old maps: the start-up line
    counts them with the others and tools/clean_index_maps.py removes them, keeping the run's."""
    long, short, vocab, tokenizer = corpora
    prefix = preprocessed(long, tmp_path / "data" / "wiki", vocab)
    old = train_set(prefix, tokenizer).map_files()
    other = preprocessed(short, tmp_path / "other" / "wiki", vocab)
    for suffix in (".bin", ".idx"):
        shutil.copy(other + suffix, prefix + suffix)
    used = index_maps.used_maps(train_set(prefix, tokenizer))
    line = index_maps.describe([prefix], used, str(tmp_path / "log"))
    assert line.startswith(f"index maps in {(tmp_path / 'data').resolve()}: 1 used by this run; 1 others from other "
                           "settings, other runs or older data"), line
    (tmp_path / "log").mkdir()
    index_maps.write_used(str(tmp_path / "log"), used, [prefix], None)
    size = index_maps.size_text(os.path.getsize(old[0]))
    capsys.readouterr()  # the maps' build lines
    load_tool("clean_index_maps").main([prefix, "--keep-run", str(tmp_path / "log")])
    assert capsys.readouterr().out.splitlines() == [f"removed {old[0]}", f"removed 1 index maps ({size}), 1 kept"]
    assert index_maps.maps_of(prefix, cache_path=None) == [Path(path) for path in used]


def test_clean_names_the_cache_folder_of_a_kept_run(corpora, tmp_path, capsys):
    """A run with --data-cache-path, cleaned without it: `would remove 0 index maps (0 B), 0 kept` and nothing
    said of the maps the kept run lists in its cache folder."""
    long, _, vocab, tokenizer = corpora
    prefix = preprocessed(long, tmp_path / "data" / "wiki", vocab)
    cache = tmp_path / "newcache" / "sub"
    used = index_maps.used_maps(train_set(prefix, tokenizer, cache_path=str(cache)))
    (tmp_path / "log").mkdir()
    index_maps.write_used(str(tmp_path / "log"), used, [prefix], str(cache))
    capsys.readouterr()  # the maps' build lines
    load_tool("clean_index_maps").main([prefix, "--keep-run", str(tmp_path / "log"), "--dry-run"])
    assert capsys.readouterr().out.splitlines() == [
        f"would remove 0 index maps (0 B), 0 kept; the --keep-run maps of these prefixes lie in {cache.resolve()}, "
        f"not searched: add --data-cache-path {cache.resolve()} (the run's) to clean there"]
    load_tool("clean_index_maps").main([prefix, "--keep-run", str(tmp_path / "log"), "--dry-run",
                                        "--data-cache-path", str(cache)])
    assert capsys.readouterr().out.splitlines()[-1] == f"would remove 0 index maps (0 B), {len(used)} kept"


def test_clean_names_a_kept_runs_folder_only_for_its_own_data(corpora, tmp_path, capsys):
    """The hint matched the kept run's maps by the prefix's name alone and took any other folder for a
    --data-cache-path: a run on another copy of the data (same name, no cache) was said to have its maps
    in that copy's folder '(the run's)', and following the hint cleaned that copy's maps. It now matches
    the data by its resolved path and names only the cache path the run's index_maps.json records; a run
    without one, cleaned with --data-cache-path, has its maps beside the data."""
    long, _, vocab, tokenizer = corpora
    prefix = preprocessed(long, tmp_path / "data" / "wiki", vocab)
    copy = tmp_path / "copy" / Path(prefix).name  # the same name
    copy.parent.mkdir()
    for suffix in (".bin", ".idx"):
        shutil.copy(prefix + suffix, f"{copy}{suffix}")
    for log, data in (("copy_run", str(copy)), ("own_run", prefix)):
        (tmp_path / log).mkdir()
        index_maps.write_used(str(tmp_path / log), index_maps.used_maps(train_set(data, tokenizer)), [data], None)
    (tmp_path / "cache").mkdir()
    own = index_maps.maps_of(prefix, cache_path=None)
    capsys.readouterr()  # the maps' build lines
    load_tool("clean_index_maps").main([prefix, "--keep-run", str(tmp_path / "copy_run"), "--dry-run"])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"would remove {len(own)} index maps ({index_maps.size_text(sum(path.stat().st_size for path in own))}), "
        "0 kept")
    load_tool("clean_index_maps").main([prefix, "--keep-run", str(tmp_path / "own_run"), "--dry-run",
                                        "--data-cache-path", str(tmp_path / "cache")])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"would remove 0 index maps (0 B), 0 kept; the --keep-run maps of these prefixes lie in "
        f"{(tmp_path / 'data').resolve()}, not searched: drop --data-cache-path (the run kept its maps beside the "
        "data) to clean there")


def test_clean_refuses_a_prefix_with_neither_data_nor_maps(corpora, tmp_path):
    """A typo, a folder, "" or the .bin itself would otherwise be "0 index maps removed"."""
    prefix = preprocessed(corpora[0], tmp_path / "wiki", corpora[2])
    clean = load_tool("clean_index_maps").main
    with pytest.raises(ConfigError, match=f"{prefix}.bin is a data file, not its prefix; pass {prefix}, as given"):
        clean([f"{prefix}.bin", "--dry-run"])
    for wrong in (str(tmp_path / "wikki"), ""):
        with pytest.raises(ConfigError, match=f"no data .* and no index maps at '{wrong}'; pass the prefix as given"):
            clean([wrong, "--dry-run"])
    # the folder, preprocess_data.py's --output-prefix, a comma list or a glob: named as the trainer names them,
    # with the prefix to pass
    other = preprocessed(corpora[1], tmp_path / "news", corpora[2])
    wiki = tmp_path / "wiki"
    named = {str(tmp_path): f"{tmp_path} is a folder, not a dataset prefix; pass the prefix of the dataset it holds "
                            f"(the .bin/.idx path without its suffix): {other} (or {prefix})",
             str(wiki): f"no data (.bin/.idx) and no index maps at '{wiki}'; pass the dataset preprocess_data.py "
                        f"wrote for --output-prefix {wiki}: {prefix}",
             f"{prefix},{other}": f"{prefix},{other} is a comma list, read as one path; pass the prefixes as separate "
                                  f"arguments: {prefix} {other}",
             f"{tmp_path}/*_text_sentence": f"{tmp_path}/*_text_sentence is a glob, which is not expanded; pass the "
                                            f"prefixes as separate arguments: {other} {prefix}"}
    for wrong, message in named.items():
        with pytest.raises(ConfigError) as raised:
            clean([wrong, "--dry-run"])
        assert str(raised.value) == message


def test_clean_keeps_the_map_a_live_run_builds_and_a_removed_partial_is_named(corpora, tmp_path, capsys, monkeypatch):
    """clean_index_maps.py, run while a start-up writes a map (for minutes, on a large corpus), removed that
    partial file and counted it as a map; the run then died saying the folder could not be written (pass
    --data-cache-path), which is not the fix. Now the partial a live build holds open stays, named; a killed
    build's goes (also one named by a pid that runs again, for another process); another host's stays while
    it is fresh; and a partial removed all the same (by an older clean) is named as such."""
    long, _, vocab, tokenizer = corpora
    prefix = preprocessed(long, tmp_path / "wiki", vocab)
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    host = socket.gethostname()
    dead = Path(f"{prefix}_train_indexmap_9mns.npy.partial-{host}-{ended.pid}.npy")
    reused = Path(f"{prefix}_train_indexmap_8mns.npy.partial-{host}-{os.getpid()}.npy")  # not open: a killed build's
    fresh = Path(f"{prefix}_train_indexmap_7mns.npy.partial-node-9-77.npy")
    stale = Path(f"{prefix}_train_indexmap_6mns.npy.partial-node-9-78.npy")
    for path in (dead, reused, fresh, stale):
        path.write_bytes(b"left by a build")
    os.utime(stale, (time.time() - 3600,) * 2)
    save, cleaned = np.save, []

    def save_then_clean(file, array, **kwargs):  # while the build holds its file open
        save(file, array, **kwargs)
        load_tool("clean_index_maps").main([prefix])
        cleaned.append(capsys.readouterr().out.splitlines())

    monkeypatch.setattr(bert_dataset.np, "save", save_then_clean)
    built = train_set(prefix, tokenizer)
    live = f"{built.map_files()[0]}.partial-{host}-{os.getpid()}.npy"
    assert sorted(cleaned[0][:-1]) == sorted([f"kept {fresh}: being built by pid 77 on host node-9",
                                              f"kept {live}: being built by pid {os.getpid()} on this host ({host})",
                                              f"removed {stale}", f"removed {reused}", f"removed {dead}"])
    assert cleaned[0][-1] == "removed 3 index maps (45 B), 2 kept"
    assert os.path.isfile(built.map_files()[0])
    assert index_maps.describe([prefix], index_maps.used_maps(built), str(tmp_path / "log")).endswith(", no others")

    os.remove(built.map_files()[0])

    def save_then_remove(file, array, **kwargs):
        save(file, array, **kwargs)
        os.remove(file.name)  # as a clean of an older version did

    monkeypatch.setattr(bert_dataset.np, "save", save_then_remove)
    with pytest.raises(DataError, match=rf"^index map {Path(built.map_files()[0]).name}: its partial file \S+ was "
                                        r"removed from .* while it was built \(by clean_index_maps.py, or a "
                                        r"preprocess_data.py of this data meanwhile\); rerun: the next start builds"):
        train_set(prefix, tokenizer)
