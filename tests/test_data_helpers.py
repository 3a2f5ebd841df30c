"""The C++ helpers against pure-numpy references written from their specification.

Both use the MT19937 stream of a 32-bit seed (std::mt19937 == numpy's RandomState raw draws),
so every sample, target length and shuffle position must agree exactly.
"""
import numpy as np
import pytest

from megatron.data import helpers


class Draws:
    """Raw 32-bit MT19937 outputs one at a time, as std::mt19937(seed)() yields them."""

    def __init__(self, seed):
        self.state = np.random.RandomState(seed)

    def __call__(self) -> int:
        return int(self.state.randint(0, 2**32, dtype=np.uint32))


def reference_mapping(docs, sizes, num_epochs, max_num_samples, max_seq_length, short_seq_prob, seed,
                      min_num_sent=2, long_sentence_len=512):
    draw = Draws(seed)
    short_ratio = int(round(1 / short_seq_prob)) if short_seq_prob > 0 else 0

    def target():
        if short_ratio == 0:
            return max_seq_length
        r = draw()
        return 2 + r % (max_seq_length - 1) if r % short_ratio == 0 else max_seq_length

    rows, shuffle = [], Draws(seed + 1)
    for epoch in range(num_epochs):
        if len(rows) >= max_num_samples:
            break
        before = len(rows)
        for first, last in zip(docs[:-1], docs[1:]):
            if last - first < min_num_sent or max(sizes[first:last]) > long_sentence_len:
                continue
            goal, start, length = target(), first, 0
            for s in range(first, last):
                length += sizes[s]
                count, ends = s + 1 - start, s + 1 == last
                if (length >= goal and count >= min_num_sent) or ends:
                    if count >= min_num_sent:
                        rows.append([start, s + 1, goal, epoch])
                    start, length = s + 1, 0
                    if not ends:
                        goal = target()
        if len(rows) == before:
            break
        for i in range(len(rows) - 1, before, -1):  # this epoch's rows only
            j = before + shuffle() % (i - before + 1)
            rows[i], rows[j] = rows[j], rows[i]
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def reference_blending(weights, size):
    taken = [0] * len(weights)
    index, sample_index = [], []
    for i in range(size):
        seen = max(float(i), 1.0)
        errors = [w * seen - t for w, t in zip(weights, taken)]
        best = errors.index(max(errors))
        index.append(best)
        sample_index.append(taken[best])
        taken[best] += 1
    return np.array(index), np.array(sample_index)


def random_corpus(seed, num_docs=60):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 12, num_docs)
    docs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sizes = rng.integers(1, 60, docs[-1]).astype(np.int32)
    sizes[rng.integers(0, docs[-1], 3)] = 700  # a few over-long sentences
    return docs, sizes


@pytest.mark.parametrize("seed,short_seq_prob,max_num_samples,min_num_sent", [
    (1, 0.1, 10**9, 2), (7, 0.0, 300, 2), (12345, 0.5, 50, 1), (2**31, 1.0, 1000, 3),
])
def test_build_mapping_matches_reference(seed, short_seq_prob, max_num_samples, min_num_sent):
    docs, sizes = random_corpus(seed % 1000)
    args = (docs, sizes, 5, max_num_samples, 128, short_seq_prob, seed, min_num_sent, 512)
    fast = helpers.build_mapping(*args)
    assert len(fast) > 20
    np.testing.assert_array_equal(fast, reference_mapping(*args))


def test_build_mapping_samples_stay_inside_documents_and_skip_long_sentences():
    docs, sizes = random_corpus(3)
    mapping = helpers.build_mapping(docs, sizes, 1, 10**9, 100, 0.1, 5)
    doc_of = np.searchsorted(docs, mapping[:, 0], side="right") - 1
    assert np.all(mapping[:, 1] <= docs[doc_of + 1])  # a sample never crosses a document end
    assert np.all(mapping[:, 1] - mapping[:, 0] >= 2)
    long_docs = {int(d) for d in np.searchsorted(docs, np.flatnonzero(sizes > 512), side="right") - 1}
    assert long_docs and not long_docs & set(doc_of.tolist())
    assert not np.array_equal(mapping[:, 0], np.sort(mapping[:, 0]))  # shuffled
    assert np.all((mapping[:, 2] >= 2) & (mapping[:, 2] <= 100))


def test_build_mapping_is_deterministic_per_seed():
    docs, sizes = random_corpus(4)
    first = helpers.build_mapping(docs, sizes, 2, 10**9, 64, 0.1, 99)
    np.testing.assert_array_equal(first, helpers.build_mapping(docs, sizes, 2, 10**9, 64, 0.1, 99))
    assert not np.array_equal(first, helpers.build_mapping(docs, sizes, 2, 10**9, 64, 0.1, 100))


def test_build_mapping_makes_whole_epochs_until_enough_samples():
    docs, sizes = random_corpus(5)
    one_epoch = len(helpers.build_mapping(docs, sizes, 1, 10**9, 64, 0.0, 1))
    assert len(helpers.build_mapping(docs, sizes, 10**6, one_epoch + 1, 64, 0.0, 1)) == 2 * one_epoch


def test_build_mapping_for_more_samples_starts_with_the_mapping_for_fewer():
    """Shuffled within each epoch, the streams going on: a resume that asks for more samples (a longer
    --train-iters, a larger batch) reads the samples it has not read yet, in the same order."""
    docs, sizes = random_corpus(6)
    one_epoch = len(helpers.build_mapping(docs, sizes, 1, 10**9, 64, 0.1, 3))
    fewer = helpers.build_mapping(docs, sizes, 10**6, one_epoch + 1, 64, 0.1, 3)
    more = helpers.build_mapping(docs, sizes, 10**6, 5 * len(fewer), 64, 0.1, 3)
    assert fewer[-1, 3] >= 1 and more[-1, 3] > fewer[-1, 3]  # both span epochs
    np.testing.assert_array_equal(more[:len(fewer)], fewer)
    for epoch in range(more[-1, 3] + 1):  # every epoch holds each sample once
        rows = more[more[:, 3] == epoch]
        assert len(np.unique(rows[:, 0])) == len(rows)


def test_build_mapping_rejects_bad_documents():
    with pytest.raises(ValueError, match="increasing"):
        helpers.build_mapping(np.array([0, 5, 3]), np.ones(5, np.int32), 1, 10, 64, 0.1, 1)


@pytest.mark.parametrize("weights,size", [([0.5, 0.5], 101), ([0.7, 0.2, 0.1], 1000), ([1 / 3, 1 / 3, 1 / 3], 999)])
def test_blending_matches_reference_and_weights(weights, size):
    index, sample_index = helpers.build_blending_indices(np.array(weights), size)
    expected_index, expected_sample = reference_blending(weights, size)
    np.testing.assert_array_equal(index, expected_index)
    np.testing.assert_array_equal(sample_index, expected_sample)
    counts = np.bincount(index, minlength=len(weights))
    assert np.all(np.abs(counts - np.array(weights) * size) <= 1)


def test_build_mapping_of_more_rows_than_a_storage_chunk_matches_reference():
    """build_mapping keeps rows in chunks of 2^20 (no doubling vector copied into the result: the peak
    was 2-3x the map): a shuffle across chunk boundaries, and the copy out, keep every row. One
    sentence per document gives the rows before the shuffle directly, so the reference is fast."""
    num_docs = (1 << 20) + 4321
    mapping = helpers.build_mapping(np.arange(num_docs + 1, dtype=np.int64), np.full(num_docs, 10, dtype=np.int32),
                                    1, 10**9, 64, 0.0, 11, 1, 512)
    order = list(range(num_docs))
    draws = np.random.RandomState(12).randint(0, 2**32, size=num_docs, dtype=np.uint32).tolist()  # seed + 1
    for k, i in enumerate(range(num_docs - 1, 0, -1)):
        j = draws[k] % (i + 1)
        order[i], order[j] = order[j], order[i]
    expected = np.stack([order, np.add(order, 1), np.full(num_docs, 64), np.zeros(num_docs, dtype=np.int64)], axis=1)
    np.testing.assert_array_equal(mapping, expected)
