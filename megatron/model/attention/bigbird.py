"""`bigbird`: block-sparse attention (window + global + random blocks) over an SP-split sequence.

The sequence is cut into n = s / B blocks of B tokens. Query block i attends to key blocks:
  - window: i - h .. i + h (h = (w - 1) / 2, clipped at the ends), w = bigbird_num_window_blocks;
  - global: blocks 0 and n - 1, which every block attends to and which attend to every block;
  - random: r = bigbird_num_random_blocks blocks drawn without replacement from the blocks that
    are neither in the window nor global (so no key block is counted twice).
The random blocks are a deterministic function of (bigbird_seed, iteration, layer): every rank
computes the same pattern on its own, with no broadcast (`block_pattern`).

The training loop sets the iteration: call `set_iteration(model, iteration)` before each step.
The layer is the core's own, given when it is built (registry.build's layer_index: the model's
layer number, also on a pipeline stage that does not start at layer 0). Until set_iteration is
called, every layer uses iteration 0.

Under sequence parallelism rank p holds blocks [p*m, (p+1)*m), m = n / P:
  - Non-global query blocks gather their key blocks; the ones held elsewhere (window halo from
    the adjacent ranks, the two global blocks, random blocks) are fetched point-to-point from
    their owners, each needed block once per rank; their dK, dV go back the same way in backward
    (comm.SeqComm.exchange: one batch_isend_irecv per exchange, the same issue order on every
    rank, no tags: NCCL-safe; K/V, their segment ids and the gradients are three exchanges).
  - Global query blocks (on ranks 0 and P-1) attend to the whole sequence without moving it: the
    two query blocks are shared with every rank, each rank attends them to its local keys with
    the log-sum-exp of its partial result, and the P partials are merged (as the ring does).
Both paths run torch's SDPA kernels through blocks.py (no score matrix is kept) and recompute
in backward from the saved lse. What a query may see comes from segment ids (masks.py): padding
and other segments of a packed sample are masked inside the blocks, and a query block none of
whose key blocks shares a segment with it (a block of padding, or a segment far from it) is
dropped from the kernel batch, as is the global path of a rank whose keys share no segment with
the global query blocks. Non-global rows gather their w + 2 + r key blocks in passes of
at most _PASS_KEYS keys per sample, so those copies take bounded memory; kept for backward are
O(s/P) tensors plus the fetched blocks (at most r times the local K, V, plus the halo and the
two global blocks). Attention dropout is refused, as for the ring (exact recompute cannot
replay the dropout masks).
"""
import hashlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from megatron.data.batch import PAD_SEGMENT
from megatron.model.attention import blocks, masks, plans
from megatron.model.attention.comm import SeqComm
from megatron.model.attention.registry import AttentionCore, register
from megatron.parallel import state

_PASS_KEYS = 16384


def _generator(seed: int, iteration: int, layer: int) -> torch.Generator:
    """A CPU generator seeded by a stable hash of (seed, iteration, layer): same on every process."""
    digest = hashlib.blake2b(f"bigbird/{seed}/{iteration}/{layer}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little"))


def block_pattern(num_blocks: int, window: int, num_random: int, seed: int, iteration: int, layer: int):
    """Key blocks of every query block -> (slots [n, w + 2 + r] int64, valid [n, w + 2 + r] bool).

    Columns: w window blocks, the 2 global blocks, r random blocks. A slot is invalid where the
    window runs past an end or a global block already lies in the window. The rows of the global
    query blocks 0 and n-1 are all invalid: those blocks attend to everything. Needs
    n >= w + 2 + r so that every row has r blocks to draw from (checked at start-up).
    """
    n, half = num_blocks, window // 2
    rows = torch.arange(n)[:, None]
    window_ids = rows + torch.arange(-half, half + 1)  # [n, w]
    window_ok = (window_ids >= 0) & (window_ids < n)
    global_ids = torch.tensor([0, n - 1]).expand(n, 2)
    global_ok = (global_ids < rows - half) | (global_ids > rows + half)
    # Random blocks, r draws without replacement (sequential uniform picks): draw u uniform in
    # [0, #free) and walk the sorted taken blocks to find the u-th block not taken.
    taken = torch.cat([window_ids.masked_fill(~window_ok, n), global_ids.masked_fill(~global_ok, n)], 1).sort(1).values
    free = n - (taken < n).sum(1)  # [n]
    generator = _generator(seed, iteration, layer)
    picks = []
    for _ in range(num_random):
        pick = torch.randint(0, 2 ** 53, (n,), generator=generator) % free.clamp(min=1)
        for column in taken.unbind(1):  # ascending: each taken block at or below the pick shifts it up
            pick += column <= pick
        picks.append(pick)
        taken = torch.cat([taken, pick[:, None]], 1).sort(1).values
        free = free - 1
    random_ids = torch.stack(picks, 1) if picks else torch.empty(n, 0, dtype=torch.long)
    slots = torch.cat([window_ids.clamp(0, n - 1), global_ids, random_ids], 1)
    valid = torch.cat([window_ok, global_ok, torch.ones_like(random_ids, dtype=torch.bool)], 1)
    valid[[0, -1]] = False
    return slots, valid


@dataclass
class _Plan:
    """Who sends which blocks to whom, and where each key slot of the local rows is found.

    The local rows are this rank's non-global query blocks [row_start, row_stop) (local indices).
    `slot_index` [rows, c] indexes the rank's extended key blocks: its own m blocks followed by
    the fetched ones (in ascending block order), `slot_valid` marks the slots that count.
    """
    row_start: int
    row_stop: int
    slot_index: torch.Tensor
    slot_valid: torch.Tensor
    send: dict  # global rank -> local block indices it needs from us
    recv: dict  # global rank -> how many blocks it sends us (ascending global rank = block order)
    slot_blocks: np.ndarray  # [rows, c] on the host: the global key block of each slot
    slot_valid_host: np.ndarray  # [rows, c] on the host: slot_valid
    first_block: int  # the global index of this rank's first block
    num_local: int  # blocks per rank (m)


def _plan(slots, valid, rank: int, size: int, ranks: list, device) -> _Plan:
    """Built on the CPU from the pattern; the index tensors the step uses go to `device`."""
    n = slots.shape[0]
    m = n // size
    owner = torch.arange(n) // m
    needs = []  # per seq rank: the sorted global ids of the remote blocks it needs
    for r in range(size):
        rows = slice(r * m, (r + 1) * m)
        used = slots[rows][valid[rows]].unique()
        needs.append(used[owner[used] != r])
    position = torch.zeros(n, dtype=torch.long)
    position[rank * m:(rank + 1) * m] = torch.arange(m)
    position[needs[rank]] = m + torch.arange(len(needs[rank]))
    row_start = 1 if rank == 0 else 0
    row_stop = m - 1 if rank == size - 1 else m
    rows = slice(rank * m + row_start, rank * m + row_stop)
    send = {ranks[r]: needs[r][owner[needs[r]] == rank] - rank * m for r in range(size) if r != rank}
    recv = {ranks[r]: int((owner[needs[rank]] == r).sum()) for r in range(size) if r != rank}
    return _Plan(row_start, row_stop, plans.to_device(position[slots[rows]].numpy(), device),
                 plans.to_device(valid[rows].numpy(), device),
                 {dst: plans.to_device(ids.numpy(), device) for dst, ids in send.items() if len(ids)},
                 {src: k for src, k in recv.items() if k}, slots[rows].numpy(), valid[rows].numpy(), rank * m, m)


def _fetch(k, v, segment_ids, plan, seq):
    """Local blocks k, v [b, m, B, heads, d], segment ids [b, m, B] -> the remote blocks this rank
    needs: k, v [b, F, B, heads, d] and their segment ids [b, F, B], in ascending block order."""
    b, _, block, heads, d = k.shape
    kv = seq.exchange({dst: torch.stack([k[:, ids], v[:, ids]]) for dst, ids in plan.send.items()},
                      {src: k.new_empty(2, b, count, block, heads, d) for src, count in plan.recv.items()})
    segments = seq.exchange({dst: segment_ids[:, ids] for dst, ids in plan.send.items()},
                            {src: segment_ids.new_empty(b, count, block) for src, count in plan.recv.items()})
    if not kv:
        return k[:, :0], v[:, :0], segment_ids[:, :0]
    fetched_k, fetched_v = torch.cat(kv, 2).unbind(0)
    return fetched_k, fetched_v, torch.cat(segments, 1)


def _send_home(grad_fetched, grad_local, plan, seq):
    """Adds the gradients of fetched blocks [2, b, F, B, heads, d] into their owners' local
    gradient [2, b, m, B, heads, d] (in place, on the owner)."""
    outgoing, start = {}, 0
    for src, count in sorted(plan.recv.items()):
        outgoing[src] = grad_fetched[:, :, start:start + count]
        start += count
    shape = grad_local.shape
    incoming = {dst: grad_local.new_empty(2, shape[1], len(ids), *shape[3:]) for dst, ids in plan.send.items()}
    for (_, ids), grad in zip(sorted(plan.send.items()), seq.exchange(outgoing, incoming)):
        grad_local.index_add_(2, ids, grad)


def _gather(k, v, segment_ids, slot_index, slot_valid):
    """Extended blocks [b, m+F, B, heads, d] -> the keys and values of some rows' slots
    [b*rows, heads, c*B, d] in kernel layout, and their segment ids [b*rows, c*B] (invalid slots
    count as padding)."""
    b, _, block, heads, d = k.shape
    rows, c = slot_index.shape
    index = slot_index.reshape(-1)
    sel_k, sel_v = (x[:, index].reshape(b * rows, c * block, heads, d).transpose(1, 2) for x in (k, v))
    segments = segment_ids[:, index].reshape(b, rows, c, block).masked_fill(~slot_valid[None, :, :, None], 0)
    return sel_k, sel_v, segments.reshape(b * rows, c * block)


class _LayerPlan(NamedTuple):
    """What one layer's pattern lets each query see in this micro-batch, decided on the host from
    the gathered segment ids (no device synchronisation per layer): the global query blocks'
    pair kind against this rank's keys, and per pass of non-global rows (kind, the active items:
    those with a query that sees a key; the others are not computed)."""
    global_kind: str
    passes: list


def _layer_plan(host_ids: np.ndarray, plan: _Plan, block: int, device) -> _LayerPlan:
    """The _LayerPlan of a layer's pattern plan; host_ids: the whole sequence's segment ids [b, s]."""
    b = host_ids.shape[0]
    by_block = host_ids.reshape(b, -1, block)  # [b, n, B]
    keys = by_block[:, plan.first_block:plan.first_block + plan.num_local].reshape(b, -1)
    global_q = np.concatenate([by_block[:, 0], by_block[:, -1]], 1)  # [b, 2B]
    rows = by_block[:, plan.first_block + plan.row_start:plan.first_block + plan.row_stop]  # [b, rows, B]
    passes = []
    for part in _passes(plan, block):
        q_items = rows[:, part].reshape(-1, block)  # [b * rows, B], sample-major as _items
        k_items = np.where(plan.slot_valid_host[part][None, :, :, None], by_block[:, plan.slot_blocks[part]],
                           PAD_SEGMENT).reshape(len(q_items), -1)  # [b * rows, c * B], invalid slots as padding
        kind = masks.pair_kind(q_items, k_items)
        if kind in ("full", "skip"):
            active = np.arange(len(q_items) if kind == "full" else 0)
        else:
            sees = (q_items[:, :, None] == k_items[:, None, :]) & (k_items != PAD_SEGMENT)[:, None, :]
            active = np.flatnonzero(sees.any((1, 2)))
        passes.append((kind, plans.to_device(active, device)))
    return _LayerPlan(masks.pair_kind(global_q, keys), passes)


def _row_mask(q_segments, k_segments, kind: str, active) -> masks.BlockMask:
    """The BlockMask of a pass's active items (see _LayerPlan)."""
    return masks.block_mask(q_segments[active], k_segments[active], kind)


def _global_mask(global_segments, segment_ids, kind: str):
    """The global query blocks [b, 2B] against this rank's keys [b, m*B] (their pair kind, from
    forward): None when they share no segment."""
    return None if kind == "skip" else masks.block_mask(global_segments, segment_ids, kind)


def _passes(plan, block: int) -> list:
    """Slices of the plan's rows, each gathering at most _PASS_KEYS keys per sample: the
    gathered copies (c blocks per row) then take bounded memory whatever s/P is."""
    rows, c = plan.slot_index.shape
    step = max(1, _PASS_KEYS // (c * block))
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def _items(x):
    """[b, rows, B, heads, d] -> one kernel batch item per (sample, row): [b*rows, heads, B, d]."""
    b, rows, block, heads, d = x.shape
    return x.reshape(b * rows, block, heads, d).transpose(1, 2)


def _flat(x):
    """[b, blocks, B, heads, d] -> kernel layout over all those tokens [b, heads, blocks*B, d]."""
    b, blocks_, block, heads, d = x.shape
    return x.reshape(b, blocks_ * block, heads, d).transpose(1, 2)


def host_segment_ids(segment_ids, seq) -> np.ndarray:
    """This rank's chunk of segment ids [b, s/P] -> the whole sequence's [b, s] on the host."""
    chunks = seq.all_gather(segment_ids) if seq.size > 1 else [segment_ids]
    return plans.to_host(torch.cat(chunks, 1))  # the plan's one host synchronisation


def _global_queries(q, segment_ids, seq):
    """The global query blocks 0 and n-1 and their segment ids, from their owners (the first and
    last seq rank) to every rank: [b, 2, B, heads, d] and [b, 2 * B]."""
    b, _, block, heads, d = q.shape
    first, last = seq.rank == 0, seq.rank == seq.size - 1
    pieces = []
    for x, zeros in ((q, q.new_zeros(b, 1, block, heads, d)), (segment_ids, segment_ids.new_zeros(b, 1, block))):
        pieces.append(seq.sum(torch.cat([x[:, :1] if first else zeros, x[:, -1:] if last else zeros], 1)))
    return pieces[0], pieces[1].view(b, 2 * block)


class _BigBirdAttention(torch.autograd.Function):
    """One rank's block-sparse attention: q, k, v [b, m, B, heads, d] -> out [b, m, B, heads, d].

    One Function for the whole rank, as for the ring, so every rank takes part in every
    collective of backward even where it holds no global or no non-global query block.
    Saved: the inputs, the fetched blocks, the global queries, and each path's out and lse.
    """

    @staticmethod
    def forward(ctx, q, k, v, segment_ids, plan, layer, seq, scale):
        b, m, block, heads, d = q.shape
        first, last = seq.rank == 0, seq.rank == seq.size - 1
        # Global query blocks 0 and n-1, shared with every rank: [b, 2, B, heads, d]. Each rank
        # attends them to its keys; the partial results are merged by log-sum-exp in rank order.
        global_q, global_segments = _global_queries(q, segment_ids, seq)
        global_mask = _global_mask(global_segments, segment_ids.view(b, -1), layer.global_kind)
        # [b, heads, 2B, d] views of [b, 2B, heads, d] memory throughout: the layout the kernels
        # write and the memory-efficient backward assumes for `out` (kernels.py)
        if global_mask is None:
            global_out, global_lse = blocks.empty_result(_flat(global_q))
        else:
            global_out, global_lse = blocks.forward(_flat(global_q), _flat(k), _flat(v), global_mask, scale)
        if seq.size > 1:
            outs, lses = seq.all_gather(global_out.transpose(1, 2)), seq.all_gather(global_lse)
            global_out = global_lse = None
            for part_out, part_lse in zip(outs, lses):
                global_out, global_lse = blocks.merge(global_out, global_lse, part_out.transpose(1, 2).float(),
                                                      part_lse)
        global_out = global_out.to(q.dtype)

        # Non-global query blocks: each attends to its gathered window, global and random blocks.
        fetched_k, fetched_v, fetched_segments = _fetch(k, v, segment_ids, plan, seq)
        rows = q[:, plan.row_start:plan.row_stop]
        sparse_out = sparse_lse = None
        pieces = [global_out.transpose(1, 2).view(b, 2, block, heads, d)[:, :1]] if first else []
        if rows.shape[1]:
            extended = (torch.cat([k, fetched_k], 1), torch.cat([v, fetched_v], 1),
                        torch.cat([segment_ids, fetched_segments], 1))
            row_segments = segment_ids[:, plan.row_start:plan.row_stop]
            outs, lses = [], []
            for part, (kind, active) in zip(_passes(plan, block), layer.passes):
                sel_k, sel_v, sel_segments = _gather(*extended, plan.slot_index[part], plan.slot_valid[part])
                items = _items(rows[:, part])
                item_segments = row_segments[:, part].reshape(items.shape[0], block)
                out = items.new_zeros(items.shape)
                lse = out.new_full(items.shape[:3], float("-inf"), dtype=torch.float32)
                if len(active):
                    mask = _row_mask(item_segments, sel_segments, kind, active)
                    out[active], lse[active] = blocks.forward(items[active], sel_k[active], sel_v[active], mask, scale)
                outs.append(out.transpose(1, 2).reshape(b, -1, block, heads, d))
                lses.append(lse.view(b, -1, heads, block))
            del extended, sel_k, sel_v
            # [b, rows, B, heads, d], [b, rows, heads, B]
            sparse_out, sparse_lse = torch.cat(outs, 1), torch.cat(lses, 1)
            pieces.append(sparse_out)
        if last:
            pieces.append(global_out.transpose(1, 2).view(b, 2, block, heads, d)[:, 1:])
        ctx.save_for_backward(q, k, v, segment_ids, fetched_k, fetched_v, fetched_segments,
                              global_q, global_segments, global_out, global_lse, sparse_out, sparse_lse)
        ctx.plan, ctx.layer, ctx.seq, ctx.scale = plan, layer, seq, scale
        return torch.cat(pieces, 1)

    @staticmethod
    def backward(ctx, grad_out):
        (q, k, v, segment_ids, fetched_k, fetched_v, fetched_segments,
         global_q, global_segments, global_out, global_lse, sparse_out, sparse_lse) = ctx.saved_tensors
        plan, seq, scale = ctx.plan, ctx.seq, ctx.scale
        b, m, block, heads, d = q.shape
        first, last = seq.rank == 0, seq.rank == seq.size - 1
        dq = q.new_zeros(q.shape, dtype=torch.float32)
        dkv = k.new_zeros((2, *k.shape), dtype=torch.float32)  # dK, dV of the local blocks

        # Global rows: their output is replicated, so its full gradient is the sum over ranks of
        # each rank's (only the owners' is non-zero); each rank then differentiates its own
        # partial with the merged lse, and the partial dq's are summed back the same way.
        zeros = grad_out.new_zeros(b, 1, block, heads, d)
        global_grad = seq.sum(torch.cat([grad_out[:, :1] if first else zeros, grad_out[:, -1:] if last else zeros], 1))
        global_mask = _global_mask(global_segments, segment_ids.view(b, -1), ctx.layer.global_kind)
        dq_global = q.new_zeros(b, 2, block, heads, d)
        if global_mask is not None:
            dq_global, dk_global, dv_global = blocks.backward(_flat(global_grad), _flat(global_q), _flat(k), _flat(v),
                                                              global_mask, global_out, global_lse, scale)
            dq_global = dq_global.transpose(1, 2).reshape(b, 2, block, heads, d)
            dkv[0] += dk_global.transpose(1, 2).reshape(k.shape)
            dkv[1] += dv_global.transpose(1, 2).reshape(k.shape)
        dq_global = seq.sum(dq_global)
        if first:
            dq[:, 0] += dq_global[:, 0]
        if last:
            dq[:, -1] += dq_global[:, 1]

        # Non-global rows: gather again, differentiate, index-add dK and dV into the extended
        # blocks (masked keys, i.e. padding and invalid slots, get exactly zero gradient).
        grad_fetched = k.new_zeros((2, *fetched_k.shape), dtype=torch.float32)
        if sparse_out is not None:
            extended = (torch.cat([k, fetched_k], 1), torch.cat([v, fetched_v], 1),
                        torch.cat([segment_ids, fetched_segments], 1))
            grad_extended = k.new_zeros((2, b, m + fetched_k.shape[1], block, heads, d), dtype=torch.float32)
            for part, (kind, active) in zip(_passes(plan, block), ctx.layer.passes):
                if not len(active):
                    continue
                local = slice(plan.row_start + part.start, plan.row_start + part.stop)
                sel_k, sel_v, sel_segments = _gather(*extended, plan.slot_index[part], plan.slot_valid[part])
                items = _items(q[:, local])
                mask = _row_mask(segment_ids[:, local].reshape(items.shape[0], block), sel_segments, kind, active)
                lse = sparse_lse[:, part].reshape(-1, heads, block)[active]
                dq_act, dk_act, dv_act = blocks.backward(_items(grad_out[:, local])[active], items[active],
                                                         sel_k[active], sel_v[active], mask,
                                                         _items(sparse_out[:, part])[active], lse, scale)
                dq_rows, dk_sel, dv_sel = (x.new_zeros((items.shape[0], *x.shape[1:])).index_copy_(0, active, x)
                                           for x in (dq_act, dk_act, dv_act))
                dq[:, local] += dq_rows.transpose(1, 2).reshape(dq[:, local].shape)
                index = plan.slot_index[part].reshape(-1)
                for i, grad in enumerate((dk_sel, dv_sel)):
                    grad_extended[i].index_add_(1, index, grad.transpose(1, 2).reshape(b, -1, block, heads, d).float())
            dkv += grad_extended[:, :, :m]
            grad_fetched += grad_extended[:, :, m:]
        _send_home(grad_fetched, dkv, plan, seq)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


@register("bigbird")
class BigBirdAttention(AttentionCore):
    per_layer = True  # each layer draws its own random blocks

    def __init__(self, config, layer_index: int = 0):
        super().__init__()
        self.seq = SeqComm(state.get_sequence_parallel_group(), state.get_sequence_parallel_ranks())
        self.block_size = config.bigbird_block_size
        self.window = config.bigbird_num_window_blocks
        self.num_random = config.bigbird_num_random_blocks
        self.seed = config.bigbird_seed
        self.scale = config.head_dim ** -0.5
        self.iteration = 0
        self.layer = layer_index
        self._cached_plan = (None, None)

    def pattern(self, num_blocks: int):
        """This layer's pattern at the current iteration (see block_pattern)."""
        return block_pattern(num_blocks, self.window, self.num_random, self.seed, self.iteration, self.layer)

    def _plan(self, num_blocks: int, device) -> _Plan:
        key = (num_blocks, self.iteration, self.layer, device)
        if self._cached_plan[0] != key:
            self._cached_plan = (key, _plan(*self.pattern(num_blocks), self.seq.rank, self.seq.size, self.seq.ranks,
                                            device))
        return self._cached_plan[1]

    def host_ids(self, segment_ids) -> np.ndarray:
        """The whole sequence's segment ids [b, s] on the host: gathered and copied once per
        micro-batch (plans.py), then every layer plans its pattern from them without waiting."""
        return plans.cached(("bigbird", self.seq.rank, tuple(self.seq.ranks)), segment_ids,
                            lambda: host_segment_ids(segment_ids, self.seq))

    def forward(self, q, k, v, segment_ids):
        b, chunk, heads, d = q.shape  # [b, s/P, heads, d]
        m = chunk // self.block_size
        plan = self._plan(m * self.seq.size, q.device)
        layer = _layer_plan(self.host_ids(segment_ids), plan, self.block_size, q.device)
        q, k, v = (x.view(b, m, self.block_size, heads, d) for x in (q, k, v))
        out = _BigBirdAttention.apply(q, k, v, segment_ids.view(b, m, self.block_size), plan, layer, self.seq,
                                      self.scale)
        return out.view(b, chunk, heads, d)


def set_iteration(model, iteration: int) -> None:
    """Sets the training iteration on every BigBird core of `model`. Call before each step; no-op
    for other variants."""
    for module in model.modules():
        if isinstance(module, BigBirdAttention):
            module.iteration = iteration
