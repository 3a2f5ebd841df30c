"""Which keys a query may see, from segment ids: the same segment, never padding.

Segment ids `[b, s]` are 0 (PAD_SEGMENT) at padding and 1, 2, ... for the segments of a packed
sample (one segment when unpacked). A query attends to key j iff seg[q] == seg[j] != 0, so a
padding query sees nothing (its output is 0) and segments never see each other.

The attention cores work on (query chunk, key block) pairs. Each pair is one of four kinds,
decided on the host before any kernel runs:
  - "skip":   no query shares a segment with any key: the block is not computed at all;
  - "full":   in every sample, every token of both sides is in one segment, no padding: no mask
              at all (BlockMask(None, None)), which lets CUDA run the flash kernel (blocks.py);
  - "single": in every sample, all non-padding tokens of both sides are one segment (always the
              case unpacked): the mask is the cheap key-padding row [b, 1, 1, s_k];
  - "mixed":  the block-diagonal mask [b, 1, s_q, s_k].
The decision (`pair_kind`, on the host) uses each side's (min, max) segment id and whether it
holds padding, per sample.
Segments are contiguous runs with increasing ids, so the ids a side holds are exactly that range
and two sides share a segment iff the ranges overlap (for any other layout the test only skips
less, never wrongly).

The ring goes further (`tile_plan`): a block is cut into tiles of query rows, and each tile is
cropped to the rows and key columns that can see anything, so a packed block costs about the
sum of its segments' squares instead of s_q x s_k (what varlen kernels do on a GPU): the block
of two neighbouring chunks shrinks to the one segment that straddles them.
"""
from typing import NamedTuple

import numpy as np
import torch

from megatron.data.batch import PAD_SEGMENT
from megatron.model.attention import plans

_NONE = torch.iinfo(torch.int64).max  # min id of a side without any segment


class BlockMask(NamedTuple):
    allowed: torch.Tensor | None  # [b, 1, s_q or 1, s_k] bool: query may see key (None: every key)
    blind: torch.Tensor | None  # [b, s_q] bool: query sees no key of this block (output 0, lse -inf)


def pair_kind(q_segments: np.ndarray, k_segments: np.ndarray) -> str:
    """The kind ("skip", "full", "single", "mixed") of a query side [b, s_q] against a key side
    [b, s_k], from their segment ids on the host."""
    (q_low, q_high), (k_low, k_high) = _id_range(q_segments), _id_range(k_segments)
    if not (np.maximum(q_low, k_low) <= np.minimum(q_high, k_high)).any():
        return "skip"
    return _kind(np.concatenate([q_segments, k_segments], 1))


def block_mask(q_segments, k_segments, kind: str) -> BlockMask:
    """The mask of one (query chunk [b, s_q], key block [b, s_k]) pair of kind "full", "single" or "mixed"."""
    if kind == "full":
        return BlockMask(None, None)
    key_real = (k_segments != PAD_SEGMENT)[:, None, None, :]  # [b, 1, 1, s_k]
    if kind == "single":
        blind = (q_segments == PAD_SEGMENT) | ~key_real[:, 0, 0].any(-1, keepdim=True)
        return BlockMask(key_real, blind)
    allowed = (q_segments[:, None, :, None] == k_segments[:, None, None, :]) & key_real
    return BlockMask(allowed, ~allowed[:, 0].any(-1))


class Tile(NamedTuple):
    """Query rows [q_start, q_stop) against key columns [k_start, k_stop) of a block, and its kind."""
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    kind: str  # "full", "single" or "mixed"


ROWS_PER_TILE = 512  # the most query rows of a tile: a longer segment is cut into row ranges
MIN_ROWS_PER_TILE = 64  # segments shorter than this share a tile: fewer, larger kernel calls


def tile_plan(q_segments: np.ndarray, k_segments: np.ndarray, rows: int | None = None,
              shortest: int | None = None) -> list:
    """The tiles to compute for a query chunk [b, s_q] against a key block [b, s_k] (segment ids
    on the host); [] when no query shares a segment with any key (the block is skipped). A
    single-segment block is one tile; a mixed one is cut at the segment starts (of any sample)
    into row ranges of `shortest` to `rows` rows, so that a tile of one sample's segment sees
    exactly that segment's keys: the block costs the sum of its segments' squares. Every tile is
    cropped to its rows that see a key and the keys they see, over all samples of the batch."""
    whole = _crop(q_segments, k_segments, 0, q_segments.shape[1])
    if whole is None or whole.kind != "mixed":
        return [] if whole is None else [whole]
    ranges = _row_ranges(q_segments, whole.q_start, whole.q_stop, rows or ROWS_PER_TILE,
                         shortest or MIN_ROWS_PER_TILE)
    tiles = (_crop(q_segments, k_segments, start, stop) for start, stop in ranges)
    return [tile for tile in tiles if tile is not None]


def _row_ranges(q_segments, start: int, stop: int, longest: int, shortest: int) -> list:
    """[start, stop) cut where any sample's segment changes, merging pieces shorter than
    `shortest` with the next one and cutting pieces longer than `longest`."""
    q = q_segments[:, start:stop]
    boundaries = (np.flatnonzero((q[:, 1:] != q[:, :-1]).any(0)) + start + 1).tolist() + [stop]
    ranges, first = [], start
    for boundary in boundaries:
        if boundary - first < shortest and boundary != stop:
            continue
        while boundary - first > longest:
            ranges.append((first, first + longest))
            first += longest
        ranges.append((first, boundary))
        first = boundary
    return ranges


def _crop(q_segments, k_segments, start: int, stop: int):
    """The Tile of query rows [start, stop), cropped; None when they see no key."""
    q = q_segments[:, start:stop]
    low, high = _id_range(q)  # [b]: the ids these rows hold, exactly (segments are contiguous)
    seen = (k_segments >= low[:, None]) & (k_segments <= high[:, None]) & (k_segments != PAD_SEGMENT)
    columns = np.flatnonzero(seen.any(0))
    if not len(columns):
        return None
    k_start, k_stop = int(columns[0]), int(columns[-1]) + 1
    k_low, k_high = _id_range(np.where(seen, k_segments, PAD_SEGMENT)[:, k_start:k_stop])
    seeing = (q >= k_low[:, None]) & (q <= k_high[:, None]) & (q != PAD_SEGMENT)
    rows = np.flatnonzero(seeing.any(0))
    q_start, q_stop = start + int(rows[0]), start + int(rows[-1]) + 1
    ids = np.concatenate([q_segments[:, q_start:q_stop], k_segments[:, k_start:k_stop]], 1)
    return Tile(q_start, q_stop, k_start, k_stop, _kind(ids))


def _kind(ids: np.ndarray) -> str:
    """"full", "single" or "mixed" of a pair whose ids of both sides are `ids` [b, n]."""
    low, high = _id_range(ids)
    if not ((low == high) | (high == PAD_SEGMENT)).all():
        return "mixed"
    return "full" if (ids != PAD_SEGMENT).all() else "single"  # no padding either: no mask (flash on CUDA)


def _id_range(segment_ids: np.ndarray) -> tuple:
    """[b, n] -> per sample (min, max) of the non-padding ids; (_NONE, PAD_SEGMENT) for none."""
    real = segment_ids != PAD_SEGMENT
    return np.where(real, segment_ids, _NONE).min(1), np.where(real, segment_ids, PAD_SEGMENT).max(1)


class Varlen(NamedTuple):
    """A block as variable-length sequences for the CUDA varlen kernels: the query rows and the
    keys of every (sample, segment), padding rows as sequences without keys and padding keys as
    sequences without queries, so that the sequences cover both sides in memory order. cu_q,
    cu_k: [n + 1] int32 cumulative row / key offsets into the block flattened to [b * s_q] and
    [b * s_k] (on the kernels' device); max_q, max_k: the longest sequence on each side."""
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


class BlockPlan(NamedTuple):
    """How one (query chunk, key block) pair is computed: its kind ("full", "single", "mixed"),
    its tiles (tile_plan: the CPU kernels, and CUDA where the layout has no Varlen) and, for a
    masked pair on CUDA, the pair as variable-length sequences (Varlen; None otherwise)."""
    kind: str
    tiles: list
    varlen: "Varlen | None"


def block_plan(q_segments: np.ndarray, k_segments: np.ndarray, device, cuda: bool) -> "BlockPlan | None":
    """The BlockPlan of a query side [b, s_q] against a key side [b, s_k] (host ids); None when
    no query sees any key (the block is skipped). `cuda`: plan the variable-length sequences the
    CUDA kernels take for masked pairs (their offsets go to `device` without waiting)."""
    tiles = tile_plan(q_segments, k_segments)
    if not tiles:
        return None
    kind = "mixed" if len(tiles) > 1 else tiles[0].kind  # tiles of one segment each are still a mixed block
    return BlockPlan(kind, tiles, varlen_plan(q_segments, k_segments, device) if cuda and kind != "full" else None)


def varlen_plan(q_segments: np.ndarray, k_segments: np.ndarray, device) -> "Varlen | None":
    """The pair as a Varlen (its offsets sent to `device` without waiting), or None where
    varlen_lengths cannot describe it."""
    lengths = varlen_lengths(q_segments, k_segments)
    if lengths is None:
        return None
    offsets = np.zeros((2, len(lengths[0]) + 1), dtype=np.int32)
    np.cumsum(lengths, axis=1, out=offsets[:, 1:])
    cu = plans.to_device(offsets, device)
    return Varlen(cu[0], cu[1], int(lengths[0].max()), int(lengths[1].max()))


def varlen_lengths(q_segments: np.ndarray, k_segments: np.ndarray):
    """(query lengths, key lengths) [n] of the block's sequences (see Varlen), or None when a
    sample's segments are not contiguous ascending runs with padding only at the tail (a layout
    the cumulative offsets cannot describe; BigBird's gathered keys, for instance)."""
    q_lengths, k_lengths = [], []
    for q_ids, k_ids in zip(q_segments, k_segments):
        q_runs, k_runs = _runs(q_ids), _runs(k_ids)
        if q_runs is None or k_runs is None:
            return None
        segments = sorted((q_runs.keys() | k_runs.keys()) - {PAD_SEGMENT})
        pairs = [(q_runs.get(segment, 0), k_runs.get(segment, 0)) for segment in segments]
        pairs += [(q_runs.get(PAD_SEGMENT, 0), 0), (0, k_runs.get(PAD_SEGMENT, 0))]
        for q_length, k_length in pairs:
            if q_length or k_length:
                q_lengths.append(q_length)
                k_lengths.append(k_length)
    return np.asarray(q_lengths, dtype=np.int32), np.asarray(k_lengths, dtype=np.int32)


def _runs(ids: np.ndarray) -> dict | None:
    """{segment id: length} of a row of ids made of ascending runs, padding (if any) last; None otherwise."""
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    values = ids[starts]
    real = values[values != PAD_SEGMENT]
    if (values[:len(real)] == PAD_SEGMENT).any() or (np.diff(real) <= 0).any():
        return None
    return dict(zip(values.tolist(), np.diff(np.r_[starts, len(ids)]).tolist()))
