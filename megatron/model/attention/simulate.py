"""P virtual seq ranks in one process: the ring's, BigBird's and the local core's multi-rank
schedules, unchanged, with their communication replaced by hand-offs between threads.

`SimulatedComm` has `comm.SeqComm`'s methods; each virtual rank runs in its own thread, and a
hand-off copies the tensor (a receiver owns its buffer, as over the network). The cores'
autograd Functions are driven directly (`Function.forward(ctx, ...)`, then
`Function.backward(ctx, grad)`), not through the autograd engine: on CUDA the engine runs every
graph's backward on one device thread, where a virtual rank waiting for another would block it.

This is what lets one GPU check the P > 1 kernels, merges and exchanges in fp32 and bf16
(benchmarks/gpu_check.sh); on CPU the tests hold it equal to the real multi-process run.
Every point-to-point batch is recorded per rank as (peer, "send"/"recv", numel, dtype), so a
test can check that each send meets a receive of the same size in issue order.
"""
import threading
from collections import defaultdict, deque

import torch

from megatron.model.attention import bigbird, local, ring
from megatron.model.attention.comm import exchange_order

TIMEOUT = 120.0  # seconds a virtual rank waits for another before the run fails


class VirtualGroup:
    """Mailboxes (per source, destination) and collective rounds shared by P virtual ranks."""

    def __init__(self, size: int):
        self.size = size
        self._cond = threading.Condition()
        self._mail = defaultdict(deque)  # (src, dst) -> tensors in issue order
        self._rounds = defaultdict(dict)  # collective number -> {rank: (op, tensor)}
        self.failed = None

    def _wait_for(self, ready):
        if not self._cond.wait_for(lambda: self.failed or ready(), TIMEOUT):
            self.failed = "timeout"
            self._cond.notify_all()
            raise RuntimeError(f"virtual rank waited {TIMEOUT:.0f}s: the ranks' exchanges do not pair up")
        if self.failed:
            raise RuntimeError(f"another virtual rank failed ({self.failed})")

    def post(self, src: int, dst: int, tensor) -> None:
        with self._cond:
            self._mail[src, dst].append(tensor.detach().clone())
            self._cond.notify_all()

    def take(self, src: int, dst: int):
        with self._cond:
            self._wait_for(lambda: self._mail[src, dst])
            return self._mail[src, dst].popleft()

    def collect(self, number: int, rank: int, op: str, tensor) -> list:
        """Round `number` of the collectives: every rank's tensor, in rank order."""
        with self._cond:
            round_ = self._rounds[number]
            round_[rank] = (op, tensor.detach().clone())
            self._cond.notify_all()
            self._wait_for(lambda: len(round_) == self.size)
            ops = {op for op, _ in round_.values()}
            if len(ops) > 1:
                raise RuntimeError(f"collective {number}: the ranks called different collectives {sorted(ops)}")
            return [round_[r][1].clone() for r in range(self.size)]

    def fail(self, reason: str) -> None:
        with self._cond:
            self.failed = reason
            self._cond.notify_all()


class SimulatedComm:
    """comm.SeqComm's interface for virtual rank `rank` of `group` (global ranks = 0..P-1)."""

    def __init__(self, group: VirtualGroup, rank: int):
        self.group, self.rank, self.size = group, rank, group.size
        self.ranks = list(range(self.size))
        self.next, self.prev = (rank + 1) % self.size, (rank - 1) % self.size
        self.log = []  # per point-to-point batch: [(peer, "send"/"recv", numel, dtype), ...]
        self._collectives = 0

    def shift(self, tensor):
        received = torch.empty_like(tensor)
        wait = self._start([("send", self.next, tensor), ("recv", self.prev, received)])

        def waiter():
            wait()
            return received
        return waiter

    def exchange(self, outgoing: dict, incoming: dict) -> list:
        self._start(exchange_order(outgoing, incoming, "send", "recv"))()
        return [incoming[src] for src in sorted(incoming)]

    def all_gather(self, tensor) -> list:
        self._collectives += 1
        return self.group.collect(self._collectives, self.rank, "all_gather", tensor)

    def sum(self, tensor):
        if self.size == 1:
            return tensor
        self._collectives += 1
        parts = self.group.collect(self._collectives, self.rank, "sum",
                                    tensor.to(torch.promote_types(tensor.dtype, torch.float32)))
        total = parts[0]
        for part in parts[1:]:
            total += part
        return total.to(tensor.dtype)  # SeqComm.sum's fp32 accumulation, cast back once

    def _start(self, order: list):
        """SeqComm._start's batch: sends are posted now, receives are taken at the wait."""
        self.log.append([(peer, direction, tensor.numel(), tensor.dtype) for direction, peer, tensor in order])
        for direction, peer, tensor in order:
            if direction == "send":
                self.group.post(self.rank, peer, tensor)
        receives = [(peer, buffer) for direction, peer, buffer in order if direction == "recv"]

        def wait():
            for src, buffer in receives:
                tensor = self.group.take(src, self.rank)
                if tensor.shape != buffer.shape or tensor.dtype != buffer.dtype:
                    raise RuntimeError(f"rank {self.rank} expected {tuple(buffer.shape)} {buffer.dtype} from {src}, "
                                       f"got {tuple(tensor.shape)} {tensor.dtype}")
                buffer.copy_(tensor)
        return wait


def run_virtual_ranks(size: int, fn, *args, **kwargs) -> tuple:
    """Calls fn(comm, *args, **kwargs) for P = `size` virtual ranks, each in a thread ->
    (results in rank order, the comms, whose .log holds each rank's point-to-point batches)."""
    group = VirtualGroup(size)
    comms = [SimulatedComm(group, rank) for rank in range(size)]
    results, errors = [None] * size, {}

    def body(rank):
        try:
            results[rank] = fn(comms[rank], *args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller
            errors[rank] = error
            group.fail(f"rank {rank}: {error!r}")

    threads = [threading.Thread(target=body, args=(rank,), name=f"virtual-rank{rank}") for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        first = next((r for r in sorted(errors) if "another virtual rank" not in str(errors[r])), min(errors))
        raise RuntimeError(f"virtual rank {first} of {size} failed") from errors[first]
    return results, comms


class _Context:
    """The part of an autograd ctx the cores use: saved tensors and attributes."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def _run_function(function, inputs, grad_out, extra):
    """function.forward then function.backward on plain tensors -> (out, grads of the inputs)."""
    ctx = _Context()
    with torch.no_grad():
        out = function.forward(ctx, *inputs, *extra)
        grads = function.backward(ctx, grad_out)
    return out, grads[:len(inputs)]


def _ring_rank(comm, q, k, v, segment_ids, grad_out, scale):
    """One virtual rank of the ring on its chunk of the full [b, s, heads, d] inputs."""
    step = q.shape[1] // comm.size
    local = slice(comm.rank * step, (comm.rank + 1) * step)
    q, k, v, grad_out = (x[:, local].transpose(1, 2) for x in (q, k, v, grad_out))
    segments = segment_ids[:, local]
    plan = ring.schedule(segments, comm)
    out, grads = _run_function(ring.RingAttentionFunction, (q, k, v), grad_out, (segments, plan, comm, scale))
    return tuple(x.transpose(1, 2) for x in (out, *grads))


def ring_attention(q, k, v, segment_ids, grad_out, size: int, scale: float | None = None) -> tuple:
    """The ring at SP = `size`, simulated: full-sequence q, k, v, grad_out [b, s, heads, d] and
    segment_ids [b, s] -> (out, dq, dk, dv) [b, s, heads, d], and the comms (their logs)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    chunks, comms = run_virtual_ranks(size, _ring_rank, q, k, v, segment_ids, grad_out, scale)
    return tuple(torch.cat(parts, 1) for parts in zip(*chunks)), comms


def _bigbird_rank(comm, q, k, v, segment_ids, grad_out, scale, block_size, pattern):
    b, s, heads, d = q.shape
    m = s // block_size // comm.size
    step = m * block_size
    local = slice(comm.rank * step, (comm.rank + 1) * step)
    plan = bigbird._plan(*pattern, comm.rank, comm.size, comm.ranks, q.device)
    q, k, v, grad_out = (x[:, local].reshape(b, m, block_size, heads, d) for x in (q, k, v, grad_out))
    layer = bigbird._layer_plan(bigbird.host_segment_ids(segment_ids[:, local], comm), plan, block_size, q.device)
    segments = segment_ids[:, local].reshape(b, m, block_size)
    out, grads = _run_function(bigbird._BigBirdAttention, (q, k, v), grad_out, (segments, plan, layer, comm, scale))
    return tuple(x.reshape(b, step, heads, d) for x in (out, *grads))


def bigbird_attention(q, k, v, segment_ids, grad_out, size: int, block_size: int, window: int = 3,
                      num_random: int = 2, seed: int = 1234, iteration: int = 0, layer: int = 0,
                      scale: float | None = None) -> tuple:
    """BigBird at SP = `size`, simulated (arguments as ring_attention, plus BigBird's pattern:
    block size, window and random blocks, and the (seed, iteration, layer) of its draw)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    pattern = bigbird.block_pattern(q.shape[1] // block_size, window, num_random, seed, iteration, layer)
    chunks, comms = run_virtual_ranks(size, _bigbird_rank, q, k, v, segment_ids, grad_out, scale, block_size, pattern)
    return tuple(torch.cat(parts, 1) for parts in zip(*chunks)), comms


def _local_rank(comm, q, k, v, segment_ids, grad_out, scale, window):
    step = q.shape[1] // comm.size
    part = slice(comm.rank * step, (comm.rank + 1) * step)
    plan = local.local_plan(segment_ids[:, part], comm, window // 2)
    out, grads = _run_function(local._LocalAttention, tuple(x[:, part] for x in (q, k, v)), grad_out[:, part],
                               (plan, comm, scale))
    return (out, *grads)


def local_attention(q, k, v, segment_ids, grad_out, size: int, window: int, scale: float | None = None) -> tuple:
    """The local sliding-window core at SP = `size`, simulated (arguments as ring_attention, plus
    the window: a query sees the keys at most window // 2 away)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    chunks, comms = run_virtual_ranks(size, _local_rank, q, k, v, segment_ids, grad_out, scale, window)
    return tuple(torch.cat(parts, 1) for parts in zip(*chunks)), comms


def check_pairing(logs: list) -> None:
    """Raises unless, between every two ranks, the i-th send from A to B and the i-th receive at
    B from A have the same size and dtype (what NCCL's in-order pairing needs), and every rank
    issued the same number of batches. `logs[r]`: rank r's batches as recorded above."""
    counts = {len(log) for log in logs}
    if len(counts) > 1:
        raise AssertionError(f"ranks issued different numbers of point-to-point batches: {[len(l) for l in logs]}")
    sends, recvs = defaultdict(list), defaultdict(list)
    for rank, log in enumerate(logs):
        for batch in log:
            for peer, direction, numel, dtype in batch:
                (sends[rank, peer] if direction == "send" else recvs[peer, rank]).append((numel, dtype))
    for pair in set(sends) | set(recvs):
        if sends[pair] != recvs[pair]:
            raise AssertionError(f"rank {pair[0]} -> {pair[1]}: sends {sends[pair]} vs receives {recvs[pair]}")
