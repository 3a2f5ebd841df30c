"""One BERT training sample from a span of sentences, Megatron's recipe.

Segments A and B are consecutive runs of the span's sentences, swapped with probability 0.5
(the sentence-order label); `[CLS] A [SEP] B [SEP]`, token types 0 then 1; 15% of the tokens
are predicted: 80% become [MASK], 10% a random token, 10% stay. All randomness comes from the
`np.random.RandomState` passed in, so a segment depends only on (seed, its index in the mapping).
A sample holds one segment, or several back to back when packed (`pack`); every array is per
token, keyed like BertBatch's fields.
"""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    pad: int


def split_segments(rows, sentence_starts, rng: np.random.RandomState, binary_head: bool):
    """-> (A, B, swapped) of a span's sentences back to back (`rows`: a token per row, with what
    travels with it; `sentence_starts`: the row each sentence begins at). Without the binary head
    everything is A."""
    if not binary_head:
        return rows, rows[:0], False
    a_end = sentence_starts[rng.randint(1, len(sentence_starts))]  # A takes sentences [0, the draw), B the rest
    tokens_a, tokens_b = rows[:a_end], rows[a_end:]
    swapped = rng.random_sample() < 0.5
    return (tokens_b, tokens_a, True) if swapped else (tokens_a, tokens_b, False)


def truncate_segments(tokens_a, tokens_b, max_tokens: int, rng: np.random.RandomState):
    """Trims the longer segment, one token at a time from a random end, until both fit."""
    bounds = [[0, len(tokens_a)], [0, len(tokens_b)]]
    while (bounds[0][1] - bounds[0][0]) + (bounds[1][1] - bounds[1][0]) > max_tokens:
        longer = bounds[0] if bounds[0][1] - bounds[0][0] > bounds[1][1] - bounds[1][0] else bounds[1]
        if rng.random_sample() < 0.5:
            longer[0] += 1
        else:
            longer[1] -= 1
    return tokens_a[bounds[0][0]:bounds[0][1]], tokens_b[bounds[1][0]:bounds[1][1]]


def mask_tokens(tokens, maskable, ids: SpecialIds, random_ids, masked_lm_prob: float, rng: np.random.RandomState,
                word_starts=None):
    """-> (input tokens, labels, loss mask). `maskable` marks non-special positions;
    `word_starts` (bool per position), when given, masks whole words: a word is a start
    position and the pieces after it up to the next start (words.WordMarks). The masked units
    are the first that fit the budget in a random order of them (one permutation draw), then
    each masked position, in order, draws its 80/10/10 fate."""
    positions = np.flatnonzero(maskable)
    starts = unit_starts(positions, word_starts)
    lengths = np.diff(np.append(starts, len(positions)))
    budget = max(1, int(round(len(positions) * masked_lm_prob)))
    chosen = np.zeros(len(starts), dtype=bool)
    chosen[units_within_budget(lengths, rng.permutation(len(starts)), budget)] = True
    masked = positions[np.repeat(chosen, lengths)]
    inputs = tokens.copy()
    labels = np.full_like(tokens, ids.pad)
    labels[masked] = tokens[masked]
    loss_mask = np.zeros(len(tokens), dtype=bool)
    loss_mask[masked] = True
    as_mask, as_random, random_picks = [], [], []
    draw, pick, choices = rng.random_sample, rng.randint, len(random_ids)
    for p in masked.tolist():  # the draws interleave (a pick only after a draw >= 0.9): one at a time
        fate = draw()
        if fate < 0.8:
            as_mask.append(p)
        elif fate >= 0.9:
            as_random.append(p)
            random_picks.append(pick(choices))
    inputs[as_mask] = ids.mask
    inputs[as_random] = random_ids[random_picks]
    return inputs, labels, loss_mask


def unit_starts(positions, word_starts=None):
    """Where each masking unit begins, as indices into `positions`: every position without
    word_starts; with them, each word start and each position after a gap (a special token)."""
    if word_starts is None:
        return np.arange(len(positions))
    begins = word_starts[positions].astype(bool)
    begins[:1] = True
    begins[1:] |= np.diff(positions) != 1
    return np.flatnonzero(begins)


def units_within_budget(lengths, order, budget: int) -> list:
    """The units taken walking `order` and keeping each that still fits `budget` positions, until
    it is full. The leading run of units that all fit is taken at once (every unit, without
    whole words); the rest one by one."""
    sizes = lengths[order]
    fitting = int(np.searchsorted(np.cumsum(sizes), budget, side="right"))
    taken = int(sizes[:fitting].sum())
    chosen = order[:fitting].tolist()
    for unit, size in zip(order[fitting:].tolist(), sizes[fitting:].tolist()):
        if taken == budget:
            break
        if taken + size <= budget:
            chosen.append(unit)
            taken += size
    return chosen


def build_segment(sentences: list, target_tokens: int, max_length: int, ids: SpecialIds, random_ids,
                  masked_lm_prob: float, rng: np.random.RandomState, binary_head: bool = True,
                  words=None) -> dict:
    """One segment `[CLS] A [SEP] B [SEP]` of at most max_length tokens, unpadded: numpy arrays of
    its length keyed like BertBatch's fields (segment id 1, positions from 0). `words` (the
    tokenizer's words.WordMarks) turns on whole-word masking; each token travels with whether a word
    begins there (each sentence's first token does) through the split and the truncation."""
    tokens = np.concatenate(sentences)
    sentence_starts = np.cumsum([0] + [len(sentence) for sentence in sentences[:-1]])
    word_starts = np.ones(len(tokens), dtype=bool) if words is None else words.starts(tokens, sentence_starts)
    rows = np.stack([tokens, word_starts], axis=1)  # [n, 2]: the token, whether a word begins there
    rows_a, rows_b, swapped = split_segments(rows, sentence_starts, rng, binary_head)
    specials = 3 if binary_head else 2
    rows_a, rows_b = truncate_segments(rows_a, rows_b, min(target_tokens, max_length - specials), rng)
    cls, sep = [[ids.cls, 1]], [[ids.sep, 1]]
    rows = np.concatenate([cls, rows_a, sep] + ([rows_b, sep] if binary_head else [])).astype(np.int64)
    tokens = rows[:, 0].copy()
    token_types = np.zeros(len(tokens), dtype=np.int64)
    token_types[len(rows_a) + 2:] = 1
    maskable = np.ones(len(tokens), dtype=bool)
    maskable[[0, len(rows_a) + 1, len(tokens) - 1]] = False
    word_starts = None if words is None else rows[:, 1].astype(bool)
    inputs, labels, loss_mask = mask_tokens(tokens, maskable, ids, random_ids, masked_lm_prob, rng, word_starts)
    return {
        "tokens": inputs,
        "token_types": token_types,
        "segment_ids": np.ones(len(tokens), dtype=np.int64),
        "position_ids": np.arange(len(tokens), dtype=np.int64),
        "labels": labels,
        "loss_mask": loss_mask,
        "sop_labels": np.full(len(tokens), int(swapped), dtype=np.int64),
    }


def segment_length(span_tokens, target_tokens, max_length: int, binary_head: bool = True):
    """Tokens of the segment build_segment makes from a span of span_tokens sentence tokens
    (works on arrays): the specials plus the span truncated to min(target, room)."""
    specials = 3 if binary_head else 2
    return specials + np.minimum(np.minimum(span_tokens, target_tokens), max_length - specials)


def pack(segments: list, seq_length: int, pad: int) -> dict:
    """Segments back to back, numbered 1..k in segment_ids, then padding to seq_length
    (token and label [PAD], everything else 0 / False)."""
    length = sum(len(segment["tokens"]) for segment in segments)
    if length > seq_length:
        raise ValueError(f"segments of {length} tokens do not fit a sample of {seq_length}")
    sample = {}
    for key in segments[0]:
        values = [segment[key] if key != "segment_ids" else segment[key] * k
                  for k, segment in enumerate(segments, start=1)]
        fill = pad if key in ("tokens", "labels") else 0
        sample[key] = np.pad(np.concatenate(values), (0, seq_length - length), constant_values=fill)
    return sample
