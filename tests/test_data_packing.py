"""Packed samples (--pack-samples), data side: the C++ packer against a Python reference and its
invariants, the fill it reaches, packed items equal to the unpacked segments they hold, the
per-token layout, the cached pack map, the real-token statistics, and the flags through the
config and pretrain (the one-line errors: tests/test_bad_inputs.py, rows flag_pack_*)."""
import contextlib
import io

import numpy as np
import pytest

from megatron.config import resolve
from megatron.data import bert_dataset, helpers
from megatron.data.bert_dataset import (BertDataset, PackedBertDataset, build_train_valid_test_datasets,
                                        packed_dataset, token_stats)
from megatron.data.indexed_dataset import make_builder, make_dataset
from megatron.errors import ConfigError
from megatron.parallel.spawn import run_on_ranks
from test_data_bert import sentence, write_corpus, write_vocab
from test_data_helpers import Draws

FIELDS = ("tokens", "token_types", "segment_ids", "position_ids", "labels", "loss_mask", "sop_labels")


def reference_pack(lengths, capacity, seed, window):
    """pack_segments from its specification: best fit (least room that holds the segment; equal
    rooms: the one that got its room first) over at most `window` open samples, the fullest closed
    beyond that, closed samples shuffled by Fisher-Yates on the MT19937 stream of `seed`."""
    samples, closed, open_, stamp = [], [], [], 0  # open_: [room, stamp, sample]
    for s, length in enumerate(lengths):
        fits = [entry for entry in open_ if entry[0] >= length]
        if fits:
            best = min(fits, key=lambda entry: (entry[0], entry[1]))
            open_.remove(best)
            room, sample = best[0] - length, best[2]
        else:
            samples.append([])
            room, sample = capacity - length, len(samples) - 1
        samples[sample].append(s)
        if room == 0:
            closed.append(sample)
            continue
        open_.append([room, stamp, sample])
        stamp += 1
        if len(open_) > window:
            fullest = min(open_, key=lambda entry: (entry[0], entry[1]))
            open_.remove(fullest)
            closed.append(fullest[2])
    closed += [entry[2] for entry in sorted(open_, key=lambda entry: (entry[0], entry[1]))]
    draw = Draws(seed)
    for i in range(len(closed) - 1, 0, -1):
        j = draw() % (i + 1)
        closed[i], closed[j] = closed[j], closed[i]
    order = [samples[c] for c in closed]
    return np.cumsum([0] + [len(o) for o in order]), np.array(sum(order, []), dtype=np.int64)


def corpus_like_lengths(count, seed, longest=512):
    """Segment lengths shaped like the default corpus at 512 (measured: a third are full, median
    ~260, a tail of short ones): documents of ~500 tokens cut at the longest segment."""
    rng = np.random.default_rng(seed)
    kind = rng.random(count)
    return np.where(kind < 0.33, longest, np.where(kind < 0.9, rng.integers(20, longest, count),
                                                   rng.integers(5, 60, count))).astype(np.int64)


@pytest.mark.parametrize("capacity,window", [(64, 1), (64, 3), (100, 8), (512, 16)])
def test_packer_matches_the_python_reference(capacity, window):
    lengths = np.random.default_rng(capacity + window).integers(1, min(capacity, 64) + 1, 400)
    offsets, indices = helpers.pack_segments(lengths, capacity, 7, window)
    expected_offsets, expected_indices = reference_pack(lengths.tolist(), capacity, 7, window)
    assert np.array_equal(offsets, expected_offsets) and np.array_equal(indices, expected_indices)


def test_packer_invariants_and_determinism():
    lengths = corpus_like_lengths(3000, seed=1)
    offsets, indices = helpers.pack_segments(lengths, 4096, 3, 64)
    assert offsets[0] == 0 and offsets[-1] == len(lengths) and (np.diff(offsets) >= 1).all()
    assert np.array_equal(np.sort(indices), np.arange(len(lengths)))  # every segment once
    totals = np.add.reduceat(lengths[indices], offsets[:-1])
    assert totals.max() <= 4096
    again = helpers.pack_segments(lengths, 4096, 3, 64)
    other = helpers.pack_segments(lengths, 4096, 4, 64)
    assert np.array_equal(again[0], offsets) and np.array_equal(again[1], indices)
    assert not np.array_equal(other[1], indices)
    with pytest.raises(ValueError, match="capacity"):
        helpers.pack_segments(np.array([10, 600]), 512, 0, 8)


@pytest.mark.parametrize("seq_length", [4096, 16384])
def test_fill_reaches_the_target_on_corpus_like_lengths(seq_length):
    lengths = corpus_like_lengths(200 * seq_length // 256, seed=seq_length)
    offsets, _ = helpers.pack_segments(lengths, seq_length, 0, bert_dataset.PACK_WINDOW)
    share = lengths.sum() / ((len(offsets) - 1) * seq_length)
    assert share >= 0.95, share


def test_span_tokens_sums_the_sentences():
    sizes = np.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=np.int32)
    mapping = np.array([[0, 2, 9], [2, 5, 9], [7, 8, 1], [4, 4, 1]], dtype=np.int64)
    assert helpers.span_tokens(mapping, sizes).tolist() == [4, 10, 6, 0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("packing")
    return write_corpus(directory / "corpus"), write_vocab(directory)


def packed(data, seq_length=256, max_segment_length=64, num_samples=60, doc_range=(0, 300),
           **options) -> PackedBertDataset:
    prefix, tokenizer = data
    return packed_dataset("train", make_dataset(prefix), prefix, doc_range, num_samples, seq_length,
                          max_segment_length, tokenizer, **options)


@pytest.mark.parametrize("options", [{}, {"whole_word_masking": True}, {"binary_head": False}])
def test_packed_segments_equal_the_unpacked_samples(data, options):
    """Segment k of packed item i is item j of the unpacked dataset over the same mapping
    (j = its segment index): same tokens, masking, labels, types, sentence order."""
    dataset = packed(data, **options)
    checked = 0
    for i in range(0, len(dataset), 7):
        item = dataset[i]
        for k, j in enumerate(dataset.segment_indices(i), start=1):
            alone = dataset.segments[int(j)]
            length = int((alone["segment_ids"] > 0).sum())
            where = np.flatnonzero(item["segment_ids"] == k)
            assert len(where) == length and where[-1] - where[0] == length - 1
            for key in FIELDS:
                expected = alone[key][:length] * (k if key == "segment_ids" else 1)
                assert np.array_equal(item[key][where], expected), key
            checked += 1
    assert checked > 20


def test_packed_layout(data):
    dataset = packed(data)
    pad = dataset.segments.ids.pad
    segments = 0
    for i in range(len(dataset)):
        item = dataset[i]
        assert all(item[key].shape == (256,) for key in FIELDS) and item["loss_mask"].dtype == bool
        ids = item["segment_ids"]
        real = int((ids > 0).sum())
        assert (ids[real:] == 0).all() and (item["tokens"][real:] == pad).all()
        for key in ("position_ids", "token_types", "sop_labels", "loss_mask"):
            assert not item[key][real:].any(), key
        starts = np.flatnonzero(np.diff(ids[:real], prepend=0))  # where the segment id changes
        assert ids[starts].tolist() == list(range(1, len(starts) + 1))
        assert len(starts) == len(dataset.segment_indices(i))
        for start, end in zip(starts, [*starts[1:], real]):
            assert np.array_equal(item["position_ids"][start:end], np.arange(end - start))
            assert item["tokens"][start] == dataset.segments.ids.cls and end - start <= 64
            assert len(set(item["sop_labels"][start:end].tolist())) == 1
            assert item["token_types"][start] == 0
        segments += len(starts)
    assert segments / len(dataset) > 3  # segments of <= 64 tokens in samples of 256


def test_packed_items_depend_only_on_their_index(data):
    """Resumable: an item is a function of its index (the sampler indexes from consumed samples)."""
    first, second = packed(data), packed(data)
    late = [second[i] for i in (40, 3)]
    for i, item in zip((40, 3), late):
        assert all(np.array_equal(first[i][key], item[key]) for key in FIELDS)
    other_seed = packed(data, seed=99)
    assert not np.array_equal(other_seed[3]["tokens"], first[3]["tokens"])


def test_packing_for_more_samples_starts_with_the_packing_for_fewer(data):
    """Packed one epoch at a time: a resume that asks for more samples (a longer --train-iters, a
    larger batch: other maps) reads the same samples up to where it stopped, then the unread ones."""
    fewer, more = packed(data, num_samples=60), packed(data, num_samples=900)
    epochs = more.segments.mapping[:, 3]
    assert epochs[-1] > fewer.segments.mapping[-1, 3] and len(more) > len(fewer)  # more epochs
    assert np.array_equal(more.segments.mapping[:len(fewer.segments)], fewer.segments.mapping)
    assert np.array_equal(more.offsets[:len(fewer) + 1], fewer.offsets)
    assert np.array_equal(more.indices[:len(fewer.indices)], fewer.indices)
    for i in (0, len(fewer) - 1):
        assert all(np.array_equal(more[i][key], fewer[i][key]) for key in FIELDS)
    for i in range(len(more)):  # a sample never mixes epochs
        assert len(set(epochs[more.segment_indices(i)].tolist())) == 1


def test_pack_map_is_cached_next_to_the_data_and_reused(data, tmp_path, monkeypatch):
    prefix = write_corpus(tmp_path / "c", num_docs=60)
    first = packed((prefix, data[1]), num_samples=20, doc_range=(0, 60))
    mns = first.segments.mapping_settings[4]  # the segment mapping's max_num_samples, sized for 20 samples
    name = f"c_train_packmap_{mns}mns_61msl_0.10ssp_1234s_0-60docs_ep_256sl_{bert_dataset.PACK_WINDOW}w.npy"
    assert [p.name for p in tmp_path.glob("c_train_packmap_*")] == [name]
    assert (tmp_path / name.replace("packmap", "indexmap").replace(f"_256sl_{bert_dataset.PACK_WINDOW}w", "")).is_file()
    assert not list(tmp_path.glob("*partial*"))

    def must_not_pack(*args, **kwargs):
        raise AssertionError("the cached pack map should have been loaded")

    monkeypatch.setattr(bert_dataset.helpers, "pack_segments", must_not_pack)
    second = packed((prefix, data[1]), num_samples=20, doc_range=(0, 60))
    assert np.array_equal(first.offsets, second.offsets) and np.array_equal(first.indices, second.indices)
    with pytest.raises(AssertionError, match="cached pack map"):
        packed((prefix, data[1]), num_samples=20, doc_range=(0, 60), seq_length=128)  # another file


def pack_on_rank(prefix, vocab_file):
    """One rank of the distributed build: (did this rank pack, offsets, indices)."""
    from megatron.data.tokenizer import BertWordPiece

    calls = []
    pack_segments = bert_dataset.helpers.pack_segments
    bert_dataset.helpers = type("Counting", (), {
        "pack_segments": staticmethod(lambda *a, **k: calls.append(1) or pack_segments(*a, **k)),
        "build_mapping": staticmethod(helpers.build_mapping), "span_tokens": staticmethod(helpers.span_tokens)})
    dataset = packed((prefix, BertWordPiece(vocab_file)), num_samples=30, doc_range=(0, 40))
    return bool(calls), np.array(dataset.offsets), np.array(dataset.indices)


def test_one_rank_packs_while_the_other_waits(data, tmp_path):
    prefix = write_corpus(tmp_path / "c", num_docs=40)
    (packed0, *maps0), (packed1, *maps1) = run_on_ranks(pack_on_rank, 2, prefix, data[1].file, timeout=120)
    assert (packed0, packed1) == (True, False)
    assert all(np.array_equal(a, b) for a, b in zip(maps0, maps1)) and len(maps0[0]) - 1 >= 30


def test_enough_packed_samples_and_their_statistics(data, monkeypatch):
    """The segment estimate's margin fills the samples at once: a segment mapping grown again is a
    second index-map build (minutes on a large corpus)."""
    prefix, tokenizer = data
    packings = []

    class CountedPacking(PackedBertDataset):
        def __init__(self, segments, *rest):
            packings.append(len(segments))
            super().__init__(segments, *rest)

    monkeypatch.setattr(bert_dataset, "PackedBertDataset", CountedPacking)
    train, valid, _ = build_train_valid_test_datasets([prefix], "mmap", "90,10,0", (500, 40, 0), 512, tokenizer,
                                                      pack_samples=True, max_segment_length=64)
    plain, _, _ = build_train_valid_test_datasets([prefix], "mmap", "90,10,0", (500, 40, 0), 64, tokenizer)
    assert isinstance(train, PackedBertDataset) and len(train) >= 500 and len(valid) >= 40
    assert len(packings) == 2, packings  # train and validation, each packed once
    stats = token_stats(train)
    items = [train[i] for i in range(0, len(train), 10)]
    measured_share = np.mean([(item["segment_ids"] > 0).mean() for item in items])
    measured_segments = np.mean([item["segment_ids"].max() for item in items])
    assert abs(stats.real_token_share - measured_share) < 0.01
    assert abs(stats.segments_per_sample - measured_segments) < 0.1 * measured_segments
    assert stats.real_token_share >= 0.95 > token_stats(plain).real_token_share
    line = stats.describe("train")
    assert line.startswith(f"train data: {stats.epoch_samples} packed samples of 512 tokens")
    assert "real-token share" in line
    assert isinstance(plain, BertDataset) and token_stats(plain).segments_per_sample == 1.0
    lengths = [int((plain[i]["segment_ids"] > 0).sum()) for i in range(50)]
    assert token_stats(plain, max_samples=50).real_token_share == pytest.approx(np.mean(lengths) / 64)
    first = token_stats(train, max_samples=20)
    assert first.samples == len(train) and first.real_token_share == pytest.approx(
        np.mean([(train[i]["segment_ids"] > 0).mean() for i in range(20)]))


def test_a_split_that_ends_with_an_empty_document_packs(data, tmp_path):
    """An empty document (a builder's end_document with no sentence) at the end of a split sizes the
    segment mapping like the same split without it (its tokens start past the last sentence)."""
    rng = np.random.default_rng(0)
    with make_builder(tmp_path / "tail", "mmap", 205) as builder:
        for _ in range(40):
            builder.add_document([sentence(rng, 20) for _ in range(3)])
        builder.end_document()
    prefix = str(tmp_path / "tail")
    estimate = bert_dataset.estimated_segments(make_dataset(prefix), (0, 41), 30, 256, 64, True)
    assert estimate == bert_dataset.estimated_segments(make_dataset(prefix), (0, 40), 30, 256, 64, True)
    assert len(packed((prefix, data[1]), num_samples=30, doc_range=(0, 41))) >= 30


def test_blended_packed_datasets(data, tmp_path):
    other = write_corpus(tmp_path / "other", num_docs=100, seed=1)
    train, _, _ = build_train_valid_test_datasets(["0.7", data[0], "0.3", other], "mmap", "1", (200, 0, 0), 256,
                                                  data[1], pack_samples=True, max_segment_length=64)
    assert len(train) == 200 and all(isinstance(d, PackedBertDataset) for d in train.datasets)
    where = int(np.flatnonzero(train.dataset_index == 1)[3])
    expected = train.datasets[1][int(train.dataset_sample_index[where])]
    assert all(np.array_equal(train[where][key], expected[key]) for key in FIELDS)
    parts = [token_stats(d) for d in train.datasets]
    stats = token_stats(train)
    assert stats.packed and min(p.real_token_share for p in parts) <= stats.real_token_share
    assert stats.real_token_share <= max(p.real_token_share for p in parts)


def test_packing_settings_resolve_from_flags_and_json():
    base = dict(num_layers=1, hidden_size=32, num_attention_heads=2, seq_length=1024, max_position_embeddings=128)
    config = resolve({**base, "pack_samples": True}, {}, 1)
    assert config.pack_samples and config.model.max_segment_length == 128  # seq may exceed the positions
    config = resolve(base | {"seq_length": 64}, {"sequence_parallel": {"pack_samples": True}}, 1)
    assert config.pack_samples and config.model.max_segment_length == 64
    config = resolve(base, {"sequence_parallel": {"pack_samples": True, "max_segment_length": 100}}, 1)
    assert config.model.max_segment_length == 100 and config.to_dict()["pack_samples"] is True
    from megatron.arguments import build_parser, config_flags

    off = config_flags(build_parser().parse_args(["--no-pack-samples"]))["pack_samples"]
    config = resolve(base | {"seq_length": 64, "pack_samples": off}, {"sequence_parallel": {"pack_samples": True}}, 1)
    assert off is False and not config.pack_samples  # the flag wins over the JSON
    with pytest.raises(ConfigError, match="seq_length 1024 exceeds max_position_embeddings 128"):
        resolve(base, {}, 1)
    with pytest.raises(ConfigError, match='sequence_parallel.pack_samples = "yes" is not a boolean'):
        resolve(base, {"sequence_parallel": {"pack_samples": "yes"}}, 1)
    linformer = {**base, "attention": "linformer", "linformer_k": 16}
    with pytest.raises(ConfigError, match=r"linformer.*\(--pack-samples: .*drop --pack-samples$"):
        resolve({**linformer, "pack_samples": True}, {}, 1)
    # packing the JSON set is named by its key, not by a flag the user never gave
    with pytest.raises(ConfigError, match=r"linformer.*\(sequence_parallel.pack_samples: .*drop "
                                          r"sequence_parallel.pack_samples$"):
        resolve(linformer, {"sequence_parallel": {"pack_samples": True}}, 1)


def test_ds_config_tool_knows_the_packing_keys(tmp_path, capsys):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import ds_config

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "sequence_parallel": {"attention": "dense"}}))
    small = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "4096"]
    assert ds_config.main(["set", str(path), "sequence_parallel.pack_samples=true", *small]) == 0
    assert json.loads(path.read_text())["sequence_parallel"]["pack_samples"] is True
    assert ds_config.main(["validate", str(path), "--world-size", "1", *small]) == 0
    assert "packed samples (segments of up to 512 tokens)" in capsys.readouterr().out
    assert ds_config.main(["validate", str(path), "--world-size", "1", *small, "--max-segment-length", "8192"]) == 2
    assert "max_segment_length 8192 exceeds seq_length 4096" in capsys.readouterr().err


class DatasetsBuilt(Exception):
    """Stops pretrain once its datasets exist, before the engine is built."""


def pretrain_datasets(argv: list) -> tuple:
    """(dataset class name, length, sample length, what rank 0 printed) of the train set pretrain builds."""
    import megatron.run_data as run_data
    import megatron.training as training
    from megatron.arguments import build_parser

    built = {}
    build = run_data.build_train_valid_test_datasets

    def recording(*args, **kwargs):
        built["sets"] = build(*args, **kwargs)
        return built["sets"]

    def stop(*args, **kwargs):
        raise DatasetsBuilt

    run_data.build_train_valid_test_datasets, training.build_engine = recording, stop
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(DatasetsBuilt):
        training.pretrain(build_parser().parse_args(argv))
    train = built["sets"][0]
    return type(train).__name__, len(train), len(train[0]["tokens"]), printed.getvalue()


def test_pretrain_packs_with_the_flag(tmp_path):
    """The flag reaches the datasets through pretrain, whose sequence may then exceed the position
    table (segments of at most --max-position-embeddings), and the statistics line is printed."""
    prefix, vocab = write_corpus(tmp_path / "corpus", num_docs=120), write_vocab(tmp_path)
    argv = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "256",
            "--max-position-embeddings", "64", "--micro-batch-size", "2", "--train-iters", "3", "--eval-iters", "1",
            "--split", "80,10,10", "--data-path", prefix, "--vocab-file", str(vocab.file), "--pack-samples"]
    kind, length, seq, printed = run_on_ranks(pretrain_datasets, 1, argv, timeout=120)[0]
    assert (kind, seq) == ("PackedBertDataset", 256) and length >= 6
    assert f"train data: {length} packed samples of 256 tokens," in printed
    assert "valid data:" in printed and "test data:" in printed
