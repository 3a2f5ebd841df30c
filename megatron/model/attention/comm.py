"""The seq group as the attention cores see it: one object for every exchange they make.

The ring, BigBird and local (halo) schedules call only `shift`, `exchange`, `all_gather` and
`sum` on it, so the same schedule code runs over torch.distributed (`SeqComm`, here) or between
P virtual ranks inside one process (`simulate.SimulatedComm`), which is how one GPU checks the
P > 1 math. Linformer sums, and Ulysses and hybrid gather segment ids, through it too; only
DeepSpeed's all-to-alls (Ulysses, hybrid) go around it.

Point-to-point is NCCL-safe by construction:
  - one exchange is ONE `dist.batch_isend_irecv` of all its sends and receives: NCCL runs the
    batch as a group, so a send to rank r+1 and a receive from r-1 cannot wait on each other
    (also when they are the same peer, at P = 2);
  - inside a batch the operations are issued in a fixed order, the same rule on every rank: a
    ring shift sends to the next rank, then receives from the previous one; an exchange goes
    by ascending peer rank, a peer's send before its receive. Batches are issued in the same
    program order on every rank. NCCL
    ignores tags and pairs the operations between two ranks in issue order, so each send meets
    the receive it was meant for: no tags are used (gloo then matches on tag 0, in order too);
  - every buffer sent or received is referenced by the returned waiter until it has waited;
  - the first operation a core issues on its group is a collective (the all-gather of segment
    ids of the ring, BigBird and the local core): NCCL creates the group's communicator there,
    with every rank taking part.
"""
import torch
import torch.distributed as dist


class SeqComm:
    """Point-to-point and collectives over the seq group `group` of global ranks `ranks`.

    `rank` and `size` are the position in and the size of the group; `next` / `prev` are the
    global ranks of the ring neighbours; `exchange` addresses peers by global rank.
    """

    def __init__(self, group, ranks):
        self.group = group
        self.ranks = list(ranks)
        self.size = len(self.ranks)
        self.rank = self.ranks.index(dist.get_rank()) if self.size > 1 else 0
        self.next = self.ranks[(self.rank + 1) % self.size]
        self.prev = self.ranks[(self.rank - 1) % self.size]

    def shift(self, tensor):
        """Starts sending `tensor` to the next rank and receiving the previous rank's tensor of
        the same shape; returns a waiter that returns the received tensor."""
        received = torch.empty_like(tensor)
        wait = self._start([(dist.isend, self.next, tensor), (dist.irecv, self.prev, received)])

        def waiter():
            wait()
            return received
        return waiter

    def exchange(self, outgoing: dict, incoming: dict) -> list:
        """Sends outgoing[dst] while receiving into the buffers incoming[src] (global ranks);
        returns the received buffers in ascending source rank."""
        self._start(exchange_order(outgoing, incoming, dist.isend, dist.irecv))()
        return [incoming[src] for src in sorted(incoming)]

    def all_gather(self, tensor) -> list:
        """Every rank's `tensor` (same shape everywhere), in seq-rank order."""
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor, group=self.group)
        return parts

    def sum(self, tensor):
        """All-reduce (sum) of an fp32 (or wider) copy of `tensor`, cast back once; the tensor itself on one
        rank. In bf16 (8 significant bits) every partial sum of a ring or tree reduction would be
        rounded again, an error that grows with the group size."""
        if self.size == 1:
            return tensor
        total = tensor.to(torch.promote_types(tensor.dtype, torch.float32), memory_format=torch.contiguous_format,
                          copy=True)  # fp64 stays fp64
        dist.all_reduce(total, group=self.group)
        return total.to(tensor.dtype)

    def _start(self, order: list):
        """Issues [(dist.isend or dist.irecv, peer, tensor), ...] as one batch -> its waiter."""
        ops = [dist.P2POp(op, tensor.contiguous() if op is dist.isend else tensor, peer, group=self.group)
               for op, peer, tensor in order]
        works = dist.batch_isend_irecv(ops) if ops else []

        def wait():
            for work in works:
                work.wait()
            ops.clear()  # `ops` held every sent and received buffer alive up to here
        return wait


def exchange_order(outgoing: dict, incoming: dict, send, recv) -> list:
    """The issue order of an exchange: ascending peer rank, a peer's send before its receive."""
    order = []
    for peer in sorted(set(outgoing) | set(incoming)):
        if peer in outgoing:
            order.append((send, peer, outgoing[peer]))
        if peer in incoming:
            order.append((recv, peer, incoming[peer]))
    return order
