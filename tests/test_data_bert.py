"""BERT samples: layout, masking statistics, whole-word masking, splits, cached index maps
(built by one rank), blending, the data-parallel sampler and the sequence-parallel slice."""
import contextlib
import multiprocessing
import json
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from megatron.data import bert_dataset, samplers
from megatron.data.bert_dataset import BertDataset, build_train_valid_test_datasets, split_boundaries
from megatron.data.bert_sample import SpecialIds, build_segment, mask_tokens, truncate_segments
from megatron.data.indexed_dataset import make_builder, make_dataset
from megatron.data.samplers import PretrainingSampler, collate_bert
from megatron.data.tokenizer import BertWordPiece
from megatron.errors import CHILD_IGNORED, ConfigError, DataError
from megatron.parallel import state
from megatron.parallel.spawn import run_on_ranks
from megatron.run_data import batch_reader

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(150)] + [f"##p{i}" for i in range(50)]  # ids 5..154 words, 155..204 pieces


def write_vocab(directory):
    path = directory / "vocab.txt"
    path.write_text("\n".join(SPECIAL + WORDS) + "\n")
    return BertWordPiece(path)


def sentence(rng, length):
    """Words of 1-3 pieces: a word id, then continuation (##) ids."""
    tokens = []
    while len(tokens) < length:
        tokens += [int(rng.integers(5, 155))] + rng.integers(155, 205, rng.integers(0, 3)).tolist()
    return tokens[:length]


def write_corpus(prefix, num_docs=300, seed=0, sentences_per_doc=(2, 8), lengths=(5, 40)):
    rng = np.random.default_rng(seed)
    with make_builder(prefix, "mmap", 205) as builder:
        for _ in range(num_docs):
            count = rng.integers(*sentences_per_doc, endpoint=True)
            builder.add_document([sentence(rng, rng.integers(*lengths)) for _ in range(count)])
    return str(prefix)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    return write_corpus(directory / "corpus"), write_vocab(directory)


def dataset(data, name="train", num_samples=2000, seq_length=64, doc_range=(0, 300), **options):
    prefix, tokenizer = data
    return BertDataset(name, make_dataset(prefix), prefix, doc_range, num_samples, seq_length, tokenizer, **options)


def original_tokens(sample):
    return np.where(sample["loss_mask"], sample["labels"], sample["tokens"])


def test_sample_layout_segments_and_padding(data):
    train = dataset(data)
    indexed = make_dataset(data[0])
    checked = 0
    for i in range(300):
        sample = train[i]
        length = int((sample["segment_ids"] > 0).sum())
        assert (sample["segment_ids"][:length] == 1).all() and (sample["segment_ids"][length:] == 0).all()
        assert np.array_equal(sample["position_ids"], np.where(np.arange(64) < length, np.arange(64), 0))
        swapped = sample["sop_labels"][0]
        assert (sample["sop_labels"][:length] == swapped).all() and (sample["sop_labels"][length:] == 0).all()
        assert not sample["token_types"][length:].any()
        tokens, types = original_tokens(sample)[:length], sample["token_types"][:length]
        seps = np.flatnonzero(tokens == 3)
        assert tokens[0] == 2 and len(seps) == 2 and seps[1] == length - 1
        assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
        assert (sample["tokens"][length:] == 0).all() and not sample["loss_mask"][length:].any()
        first, end, target, _ = train.mapping[i]
        text = np.concatenate([indexed[s] for s in range(first, end)])
        if len(text) <= min(target, 61):  # not truncated: the segments are the span, in or out of order
            a, b = tokens[1:seps[0]], tokens[seps[0] + 1:-1]
            assert np.array_equal(np.concatenate([b, a] if swapped else [a, b]), text)
            checked += 1
        else:
            assert length - 3 <= min(target, 61)
    assert checked > 50


def test_masking_statistics(data):
    train = dataset(data, num_samples=3000, seq_length=128)
    predicted = maskable = masked = kept = swapped = 0
    for i in range(3000):
        sample = train[i]
        length = int((sample["segment_ids"] > 0).sum())
        specials = np.isin(original_tokens(sample), [2, 3])
        assert not (sample["loss_mask"] & specials).any()
        maskable += length - 3
        loss = sample["loss_mask"]
        predicted += loss.sum()
        masked += (sample["tokens"][loss] == 4).sum()
        kept += (sample["tokens"][loss] == sample["labels"][loss]).sum()
        swapped += int(sample["sop_labels"][0])
        assert (sample["tokens"][~loss] != 4).all()
    assert abs(predicted / maskable - 0.15) < 0.005
    assert abs(masked / predicted - 0.8) < 0.02
    assert abs(kept / predicted - 0.1 - 0.1 / 200) < 0.015  # a random token equals the original 1 time in 200
    assert abs(1 - (masked + kept) / predicted - 0.1) < 0.015  # random replacements
    assert abs(swapped / 3000 - 0.5) < 0.04


def test_whole_word_masking_masks_words_entirely(data):
    train = dataset(data, whole_word_masking=True)
    for i in range(300):
        sample = train[i]
        tokens, loss = original_tokens(sample), sample["loss_mask"]
        continuation = (tokens >= 155) & (np.roll(tokens, 1) >= 5)  # after a piece, not after [CLS]/[SEP]
        # a continuation piece is predicted exactly when the piece before it is
        assert np.array_equal(loss[1:][continuation[1:]], loss[:-1][continuation[1:]])
        assert loss.sum() > 0


def split_words(sample) -> int:
    """Continuation pieces whose prediction differs from the piece before them: words masked in part."""
    tokens, loss = original_tokens(sample), sample["loss_mask"]
    continuation = (tokens >= 155) & (np.roll(tokens, 1) >= 5)
    return int((continuation[1:] & (loss[1:] != loss[:-1])).sum())


def test_without_whole_word_masking_words_are_masked_in_part(data):
    """The control of the test above: the same samples (same seed) mask some words only in part
    without the option, and none with it."""
    plain, whole = dataset(data), dataset(data, whole_word_masking=True)
    assert sum(split_words(plain[i]) for i in range(300)) > 0
    assert sum(split_words(whole[i]) for i in range(300)) == 0


def test_samples_are_deterministic_per_seed(data):
    a, b, c = dataset(data, seed=5), dataset(data, seed=5), dataset(data, seed=6)
    for key, value in a[17].items():
        assert np.array_equal(value, b[17][key])
    assert not np.array_equal(a[17]["tokens"], c[17]["tokens"])


def test_short_seq_prob_draws_that_share_of_samples_shorter(data, tmp_path):
    """--short-seq-prob (Megatron's, default 0.1): 0 fills every sample as far as its document allows, a
    larger share cuts more of them short; each value has its own index map (run_data.sample_options passes
    the flag)."""
    from megatron.run_data import sample_options

    prefix = write_corpus(tmp_path / "long", num_docs=60, sentences_per_doc=(10, 12), lengths=(8, 12))
    lengths = {}
    for share in (0.0, 0.5):
        samples = dataset((prefix, data[1]), num_samples=300, doc_range=(0, 60), short_seq_prob=share)
        lengths[share] = np.mean([int(samples[i]["segment_ids"].sum()) for i in range(len(samples))])  # real tokens
    assert lengths[0.5] < 0.9 * lengths[0.0], lengths
    assert {re.search(r"_([\d.]+ssp)_", path.name).group(1) for path in tmp_path.glob("long_train_indexmap_*.npy")} \
        == {"0.00ssp", "0.50ssp"}
    args = SimpleNamespace(mask_prob=0.15, short_seq_prob=0.25, seed=1, whole_word_masking=False)
    config = SimpleNamespace(model=SimpleNamespace(add_binary_head=True, max_segment_length=None), pack_samples=False)
    assert sample_options(args, config)["short_seq_prob"] == 0.25


def reference_mask_tokens(tokens, maskable, ids, random_ids, masked_lm_prob, rng, word_starts=None):
    """The spec mask_tokens must match draw for draw: units (a position, or with word_starts a word:
    a start and the pieces after it without a gap) taken in one random order while they fit the
    budget, then each masked position in order draws its fate (and a random token when replaced)."""
    units = []
    for p in np.flatnonzero(maskable):
        if word_starts is not None and units and not word_starts[p] and units[-1][-1] == p - 1:
            units[-1].append(p)
        else:
            units.append([p])
    budget = max(1, int(round(int(maskable.sum()) * masked_lm_prob)))
    chosen = []
    for u in rng.permutation(len(units)):
        if len(chosen) + len(units[u]) <= budget:
            chosen.extend(units[u])
        if len(chosen) == budget:
            break
    inputs, labels, loss_mask = tokens.copy(), np.full_like(tokens, ids.pad), np.zeros(len(tokens), dtype=bool)
    for p in sorted(chosen):
        draw = rng.random_sample()
        if draw < 0.8:
            inputs[p] = ids.mask
        elif draw >= 0.9:
            inputs[p] = random_ids[rng.randint(len(random_ids))]
        labels[p], loss_mask[p] = tokens[p], True
    return inputs, labels, loss_mask


@pytest.mark.parametrize("whole_words", [False, True])
def test_mask_tokens_matches_the_reference_draw_for_draw(whole_words):
    """Random lengths, special positions, word starts and mask rates: the same arrays as the
    reference, and the generator left in the same state (the next draw is the same)."""
    ids, random_ids = SpecialIds(cls=2, sep=3, mask=4, pad=0), np.arange(5, 205)
    cases = np.random.default_rng(11)
    for case in range(400):
        n = int(cases.integers(0, 300))
        tokens = cases.integers(5, 205, n)
        maskable = cases.random(n) > 0.05
        word_starts = cases.random(n) < 0.4 if whole_words else None
        prob = float(cases.choice([0.01, 0.15, 0.3, 0.5, 1.0]))
        got_rng, want_rng = np.random.RandomState(case), np.random.RandomState(case)
        got = mask_tokens(tokens, maskable, ids, random_ids, prob, got_rng, word_starts)
        want = reference_mask_tokens(tokens, maskable, ids, random_ids, prob, want_rng, word_starts)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w), case
        assert got_rng.random_sample() == want_rng.random_sample()


@pytest.mark.parametrize("whole_words", [False, True])
def test_a_segment_is_the_one_a_fresh_random_state_of_its_index_builds(data, whole_words):
    """The dataset reseeds one RandomState: in any order, segment i is what RandomState(seed + i) makes."""
    train = dataset(data, seed=77, whole_word_masking=whole_words)
    for idx in np.random.default_rng(3).permutation(len(train))[:200]:
        first, end, target = (int(v) for v in train.mapping[idx, :3])
        sentences = [train.indexed[i].astype(np.int64) for i in range(first, end)]
        want = build_segment(sentences, target, train.seq_length, train.ids, train.random_ids, train.masked_lm_prob,
                             np.random.RandomState(77 + int(idx)), train.binary_head, train.words)
        for key, value in train.segment(int(idx)).items():
            assert np.array_equal(value, want[key]), (idx, key)


def test_truncation_trims_b_when_the_segments_are_equal():
    """Megatron's truncate_seq_pair: the longer segment loses a token, B on a tie."""
    a, b = np.arange(10), np.arange(10, 20)
    for seed in range(5):
        kept_a, kept_b = truncate_segments(a, b, 19, np.random.RandomState(seed))
        assert np.array_equal(kept_a, a) and len(kept_b) == 9
    kept_a, kept_b = truncate_segments(a, b[:7], 14, np.random.RandomState(0))
    assert (len(kept_a), len(kept_b)) == (7, 7)


def test_split_boundaries():
    assert split_boundaries("949,50,1", 1000) == [0, 949, 999, 1000]
    assert split_boundaries("98/2", 10) == [0, 10, 10, 10]
    assert split_boundaries("1", 7) == [0, 7, 7, 7]
    for bad in ("a,b", "1,2,3,4", "0,0,0", "-1,2"):
        with pytest.raises(ConfigError, match="--split"):
            split_boundaries(bad, 10)


def test_splits_use_disjoint_documents(data):
    prefix, tokenizer = data
    train, valid, test = build_train_valid_test_datasets([prefix], "mmap", "80,15,5", (500, 80, 20), 64, tokenizer)
    doc_idx = make_dataset(prefix).doc_idx
    ranges = [(doc_idx[a], doc_idx[b]) for a, b in [(0, 240), (240, 285), (285, 300)]]
    for split, (lo, hi) in zip((train, valid, test), ranges):
        assert split.mapping[:, 0].min() >= lo and split.mapping[:, 1].max() <= hi
        assert len(split) >= [500, 80, 20][[train, valid, test].index(split)]


def test_index_map_is_cached_next_to_the_data_and_reused(data, monkeypatch, tmp_path):
    prefix = write_corpus(tmp_path / "c", num_docs=50)
    first = dataset((prefix, data[1]), num_samples=100, doc_range=(0, 50))
    cached = list(tmp_path.glob("c_train_indexmap_100mns_61msl_0.10ssp_1234s_0-50docs_ep.npy"))
    assert len(cached) == 1 and len(list(tmp_path.glob("*partial*"))) == 0

    def must_not_build(*args, **kwargs):
        raise AssertionError("the cached index map should have been loaded")

    monkeypatch.setattr(bert_dataset.helpers, "build_mapping", must_not_build)
    second = dataset((prefix, data[1]), num_samples=100, doc_range=(0, 50))
    assert np.array_equal(first.mapping, second.mapping)


def build_on_rank(prefix, vocab_file):
    """One rank of the distributed index-map build: returns (did this rank build, the mapping)."""
    calls = []
    build = bert_dataset.helpers.build_mapping
    bert_dataset.helpers = type("Counting", (), {"build_mapping": staticmethod(
        lambda *a, **k: calls.append(1) or build(*a, **k))})
    train = BertDataset("train", make_dataset(prefix), prefix, (0, 40), 64, 64, BertWordPiece(vocab_file))
    return bool(calls), np.array(train.mapping)


def test_one_rank_builds_the_index_map_while_the_other_waits(data, tmp_path):
    prefix = write_corpus(tmp_path / "c", num_docs=40)
    (built0, mapping0), (built1, mapping1) = run_on_ranks(build_on_rank, 2, prefix, data[1].file, timeout=120)
    assert (built0, built1) == (True, False)
    assert np.array_equal(mapping0, mapping1) and len(mapping0) >= 64


def test_documents_without_sentence_pairs_are_a_clear_error(data, tmp_path):
    """Named by the --data-path prefix, not by the prefix of its index maps in --data-cache-path."""
    prefix = write_corpus(tmp_path / "docs", num_docs=20, sentences_per_doc=(1, 1))
    maps = str(tmp_path / "cache" / "docs-0123456789")
    with pytest.raises(DataError, match=f"^{re.escape(prefix)}: the train split yields no BERT samples.*--split-"):
        BertDataset("train", make_dataset(prefix), maps, (0, 20), 10, 64, data[1])
    assert len(dataset((prefix, data[1]), num_samples=10, doc_range=(0, 20), binary_head=False)) >= 10


def skip_corpus(prefix, rng) -> str:
    """Documents of 3 sentences, of one sentence (every 3rd), and with one 600-token sentence (every 5th);
    an empty document among them."""
    with make_builder(prefix, "mmap", 205) as builder:
        for doc in range(60):
            count = 1 if doc % 3 == 0 else 3
            sentences = [sentence(rng, 600 if doc % 5 == 0 and i == count - 1 else 20) for i in range(count)]
            builder.add_document(sentences if doc != 7 else [])
    return str(prefix)


def test_documents_the_sampler_skips_are_counted_and_warned_about(data, tmp_path, capsys):
    """A corpus whose sentences were not split (one sentence, or one over 512 tokens) is mostly never
    trained on: the share is counted as helpers.cpp's build_mapping skips documents (checked against
    the mapping it builds) and said at start-up, packed or not; without the sentence-order head one
    sentence is a sample."""
    prefix = skip_corpus(tmp_path / "skip", np.random.default_rng(0))
    indexed = make_dataset(prefix)
    skipped = bert_dataset.skipped_documents(indexed, 2, 512)
    sizes, docs = indexed.sizes, indexed.doc_idx
    kept, few, long, left_out = set(), [], [], {}  # brute force, document by document
    for doc in range(60):
        lengths = sizes[docs[doc]:docs[doc + 1]]
        if len(lengths) == 1:
            few.append(int(lengths.sum()))
        elif len(lengths) and lengths.max() > 512:
            long.append(int(lengths.sum()))
        elif len(lengths):
            kept.add(doc)
        if len(lengths) and doc not in kept:
            left_out[doc] = int(lengths.sum())
    assert (len(few), len(long)) == (20, 8)  # docs 0, 3, ... 57; 5, 10, 20, 25, 35, 40, 50, 55
    assert (skipped.few_sentences, skipped.long_sentence) == ((20, sum(few)), (8, sum(long)))
    assert skipped.largest == max(left_out.items(), key=lambda item: (item[1], -item[0])) and skipped.sentence_level
    assert skipped.tokens == int(sizes.sum())
    mapping = dataset((prefix, data[1]), num_samples=500, doc_range=(0, 60)).mapping
    assert set(np.searchsorted(docs, mapping[:, 0], side="right") - 1) == kept
    for packed, binary_head in ((False, True), (True, True), (False, False)):
        build_train_valid_test_datasets([prefix], "mmap", "1", (50, 0, 0), 64, data[1], pack_samples=packed,
                                        max_segment_length=32 if packed else None, binary_head=binary_head)
        err = capsys.readouterr().err
        reasons = rf"{'20 documents have one sentence; ' if binary_head else ''}{8 if binary_head else 12} documents"
        # split into sentences already: splitting again would not help; what does is named
        head = "--bert-no-binary-head trains on documents of one sentence; " if binary_head else ""
        assert re.fullmatch(rf"warning: at least \d+% of the {skipped.tokens} tokens of {re.escape(prefix)} lie in "
                            rf"documents the BERT sampler skips{', packed or not' if packed else ''} \({reasons} "
                            r"hold a sentence over 512 tokens; the largest: document \d+, \d+ tokens\): "
                            rf"{head}a sentence over 512 tokens is text the splitter could not cut \(code, tables, "
                            r"lists\): cut it into shorter sentences before preprocessing, or raise --seq-length "
                            r"above it\n",
                            err), err
        assert ("one sentence" in err) == binary_head  # without the head, 4 of them are long
    build_train_valid_test_datasets([data[0]], "mmap", "1", (50, 0, 0), 64, data[1])  # 2-8 sentences, short
    assert capsys.readouterr().err == ""
    # not split into sentences (a document is one "sentence"): --split-sentences is the fix
    unsplit = bert_dataset.skipped_documents(make_dataset(write_corpus(tmp_path / "unsplit", num_docs=20,
                                                                       sentences_per_doc=(1, 1))), 2, 512)
    document, tokens = unsplit.largest
    assert not unsplit.sentence_level and tokens > 0
    assert bert_dataset.skipped_warning("P", unsplit, 512, False).endswith(
        f"(20 documents have one sentence; the largest: document {document}, {tokens} tokens): check the sentence "
        "splitting (preprocess with --split-sentences and the corpus's --lang)")


def test_a_long_document_of_short_sentences_holds_no_long_sentence():
    """The skip rule reads each document's longest sentence, not its token count: a 600-token document
    of two 300-token sentences is kept (real corpora hold many documents over 512 tokens)."""
    indexed = SimpleNamespace(sizes=np.array([300, 300, 20, 600, 5], dtype=np.int32), doc_idx=np.array([0, 2, 4, 5]))
    _, tokens, longest = bert_dataset.document_tokens(indexed, indexed.doc_idx)
    assert tokens.tolist() == [600, 620, 5] and longest.tolist() == [300, 600, 5]
    skipped = bert_dataset.skipped_documents(indexed, 2, 512)
    assert (skipped.few_sentences, skipped.long_sentence) == ((1, 5), (1, 620))


def test_the_skipped_warning_names_only_the_reasons_that_hold():
    """A reason no document has is no reason ("0 documents hold a sentence over 512 tokens")."""
    warning = bert_dataset.skipped_warning("p", bert_dataset.SkippedDocuments(100, (5, 50), (0, 0)), 512, False)
    assert warning.startswith("at least 50% of the 100 tokens of p lie"), warning
    assert "(5 documents have one sentence; the largest: " in warning, warning
    warning = bert_dataset.skipped_warning("p", bert_dataset.SkippedDocuments(100, (0, 0), (2, 30)), 512, False)
    assert "(2 documents hold a sentence over 512 tokens; the largest: " in warning, warning
    warning = bert_dataset.skipped_warning("p", bert_dataset.SkippedDocuments(100, (1, 10), (1, 30)), 512, False)
    assert "(1 document has one sentence; 1 document holds a sentence over 512 tokens; " in warning, warning


def test_only_the_printing_rank_counts_the_skipped_documents(monkeypatch, tmp_path):
    """The census reads every sentence's size of a prefix: the other ranks, which print nothing, skip it."""
    monkeypatch.setattr(bert_dataset.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(bert_dataset.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(bert_dataset, "skipped_documents", lambda *args: pytest.fail("counted on rank 1"))
    bert_dataset._warn_skipped(str(tmp_path / "p"), None, 64, True, False)


def test_blending_follows_the_weights(data, tmp_path):
    other = write_corpus(tmp_path / "other", num_docs=100, seed=1)
    train, _, _ = build_train_valid_test_datasets(["0.7", data[0], "0.3", other], "mmap", "1", (1000, 0, 0), 64, data[1])
    assert len(train) == 1000
    counts = np.bincount(train.dataset_index, minlength=2)
    assert counts.tolist() == [700, 300]
    where = int(np.flatnonzero(train.dataset_index == 1)[5])
    expected = train.datasets[1][int(train.dataset_sample_index[where])]
    assert np.array_equal(train[where]["tokens"], expected["tokens"])
    with pytest.raises(ConfigError, match="weight/prefix pairs"):
        build_train_valid_test_datasets(["0.7", data[0], "0.3"], "mmap", "1", (10, 0, 0), 64, data[1])
    with pytest.raises(ConfigError, match=f"names {data[0]} twice; pass each prefix once"):  # a typo for another
        build_train_valid_test_datasets(["0.7", data[0], "0.3", f"{data[0]}/"], "mmap", "1", (10, 0, 0), 64, data[1])


def test_sampler_splits_global_batches_and_resumes_exactly():
    ranks = [list(PretrainingSampler(100, 0, 4, rank, 3)) for rank in range(3)]
    assert ranks[0][0] == [0, 1, 2, 3] and ranks[2][0] == [8, 9, 10, 11]
    assert all(len(r) == 8 for r in ranks)  # 8 global batches of 12; the last 4 samples dropped
    assert sorted(sum(sum(ranks, []), [])) == list(range(96))
    resumed = list(PretrainingSampler(100, 36, 4, 1, 3))
    assert resumed == ranks[1][3:]
    assert len(PretrainingSampler(100, 36, 4, 1, 3)) == 5
    # micro_batches caps what the workers build ahead: not the whole split past the run's last step
    capped = PretrainingSampler(100, 10, 2, 1, 3, micro_batches=4)
    assert len(capped) == len(list(capped)) == 4 and len(PretrainingSampler(100, 10, 2, 1, 3)) == 15
    with pytest.raises(ConfigError, match="consumed samples 101"):
        PretrainingSampler(100, 101, 4, 0, 1)


class NoStop:
    """stop.agree without peers: the steps read are counted, no stop is ever agreed."""
    agreed = 0

    def __init__(self):
        self.steps = 0

    def agree(self, step, vocab_size):
        self.steps += 1


def read_steps(train, num_workers: int, start: int, count: int, take: int | None = None) -> list:
    """`take` (default all) of the `count` steps batch_reader reads from sample `start`, as data rank 1
    of 2 (3 samples a micro-batch, 2 micro-batches a step), each field of each micro-batch as a tensor."""
    config = SimpleNamespace(micro_batch_size=3, gradient_accumulation_steps=2, model=SimpleNamespace(vocab_size=205))
    stop = NoStop()
    with contextlib.closing(batch_reader(config, stop, num_workers)(train, start, count)) as steps:
        taken = [[tuple(batch.tensors().values()) for batch in step] for _, step in zip(range(take or count), steps)]
    assert stop.steps == len(taken)
    return taken


def assert_same_steps(a: list, b: list) -> None:
    assert len(a) == len(b)
    for step_a, step_b in zip(a, b):
        for batch_a, batch_b in zip(step_a, step_b, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(batch_a, batch_b, strict=True))


@pytest.mark.parametrize("packed", [False, True])
def test_data_workers_read_the_same_steps_and_end_with_the_reader(data, monkeypatch, packed):
    """--num-workers 2 and 0 give the steps the sampler's indices collate to, from the start and from a
    resume's consumed count; torch's global generator (dropout's) is left as it was; closing the
    reader, read to its end or left after two steps, leaves no worker process behind."""
    monkeypatch.setattr(state, "get_data_parallel_rank", lambda: 1)
    monkeypatch.setattr(state, "get_data_parallel_world_size", lambda: 2)
    train = dataset(data) if not packed else bert_dataset.PackedBertDataset(dataset(data, seq_length=40), 96)
    indices = iter(PretrainingSampler(len(train), 0, 3, 1, 2))
    direct = [[tuple(collate_bert([train[i] for i in next(indices)]).tensors().values()) for _ in range(2)]
              for _ in range(6)]
    torch_state = torch.random.get_rng_state()
    in_process, in_workers = read_steps(train, 0, 0, 6), read_steps(train, 2, 0, 6)
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    assert_same_steps(in_process, direct)
    assert_same_steps(in_workers, direct)
    assert_same_steps(read_steps(train, 2, 2 * 12, 4), direct[2:])  # 2 steps of 12 samples consumed
    assert multiprocessing.active_children() == []
    assert_same_steps(read_steps(train, 2, 0, 6, take=2), direct[:2])
    assert multiprocessing.active_children() == []


class FailingItem(torch.utils.data.Dataset):
    """`train`'s items, but item `bad` raises `error`."""

    def __init__(self, train, bad: int, error: Exception):
        self.train, self.bad, self.error = train, bad, error

    def __len__(self):
        return len(self.train)

    def __getitem__(self, idx):
        if idx == self.bad:
            raise self.error
        return self.train[idx]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_item_stops_the_reader_as_itself_and_ends_its_workers(data, monkeypatch, num_workers):
    """A DataError in a worker reaches the rank as that DataError (its one line), not torch's RuntimeError
    of two tracebacks, and an OSError with its filename, as with 0 workers; any error ends the workers
    while its traceback (which holds the loader) is still alive: else the rank's exit waits on workers
    that ignore SIGTERM, for ever."""
    monkeypatch.setattr(state, "get_data_parallel_rank", lambda: 1)
    monkeypatch.setattr(state, "get_data_parallel_world_size", lambda: 2)
    bad = list(PretrainingSampler(len(dataset(data)), 0, 3, 1, 2))[5][1]  # in the third step
    missing = FileNotFoundError(2, "No such file or directory", "/data/wiki_text_sentence.bin")  # a lazy read
    for error in (DataError("a corrupt record", "preprocess again"), missing, ValueError("a bug")):
        with pytest.raises(type(error)) as raised:
            read_steps(FailingItem(dataset(data), bad, error), num_workers, 0, 6)
        if isinstance(error, DataError):
            assert type(raised.value) is DataError and str(raised.value) == "a corrupt record; preprocess again"
        if isinstance(error, OSError):  # its filename makes it the rank's one line (training.one_line_problem)
            assert type(raised.value) is FileNotFoundError and raised.value.filename == error.filename
        assert multiprocessing.active_children() == [], error


class HangingItem(FailingItem):
    """`train`'s items, but item `bad` creates file `started` and then hangs (a stuck network read)."""

    def __init__(self, train, bad: int, started: Path):
        super().__init__(train, bad, None)
        self.started = started

    def __getitem__(self, idx):
        if idx == self.bad:
            self.started.write_text("")
            time.sleep(600)
        return super().__getitem__(idx)


@pytest.mark.timeout(120)
def test_closing_the_reader_ends_a_worker_stuck_in_an_item(data, monkeypatch, tmp_path):
    """Torch asks the workers to leave, then terminate()s one that does not: SIGTERM, which workers ignore.
    One stuck in an item is killed when the reader closes, or the rank's exit would wait on it."""
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)  # torch's waits, shorter
    train, started = dataset(data), tmp_path / "started"
    sampler = PretrainingSampler(len(train), 0, 3, 0, 1)
    reader = samplers.micro_batches(HangingItem(train, 3, started), sampler, 2, pin_memory=False)
    try:
        next(reader)  # micro-batch 0; the second worker hangs in micro-batch 1
        while not started.exists():
            time.sleep(0.05)
        reader.close()
        assert multiprocessing.active_children() == []
    finally:
        for child in multiprocessing.active_children():  # only when it failed
            child.kill()


def test_data_workers_start_with_the_stop_signals_blocked_then_ignore_them(data, monkeypatch, tmp_path):
    """A worker forks with the rank's handlers: a Ctrl-C before its init would run the rank's stop
    handler in the worker. The stop signals stay blocked from the fork until the worker ignores them."""
    monkeypatch.setattr(state, "get_data_parallel_rank", lambda: 0)
    monkeypatch.setattr(state, "get_data_parallel_world_size", lambda: 1)
    ignore = samplers.ignore_stop_signals

    def recording(worker_id):
        at_start = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        ignore(worker_id)
        handlers = [signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)]
        after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        (tmp_path / f"worker{worker_id}").write_text(json.dumps([sorted(map(int, at_start)),
                                                                 [int(handler) for handler in handlers],
                                                                 sorted(map(int, after))]))

    monkeypatch.setattr(samplers, "ignore_stop_signals", recording)
    read_steps(dataset(data), 2, 0, 2)
    for worker in range(2):
        at_start, handlers, after = json.loads((tmp_path / f"worker{worker}").read_text())
        assert {signal.SIGINT, signal.SIGTERM} <= set(at_start) and handlers == [signal.SIG_IGN] * 2, worker
        assert not set(CHILD_IGNORED) & set(after), worker  # SIGHUP too
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the rank's own


def test_collated_batch_splits_into_sequence_chunks(data):
    train = dataset(data)
    batch = collate_bert([train[i] for i in range(4)])
    assert batch.tokens.shape == (4, 64) and batch.tokens.dtype == torch.int64 and batch.sop_labels.shape == (4, 64)
    assert batch.loss_mask.dtype == torch.bool and batch.segments_per_sample() == 1.0
    chunks = [batch.sequence_chunk(rank, 4) for rank in range(4)]
    for field in ("tokens", "token_types", "segment_ids", "position_ids", "labels", "loss_mask", "sop_labels"):
        assert torch.equal(torch.cat([getattr(c, field) for c in chunks], dim=1), getattr(batch, field))
