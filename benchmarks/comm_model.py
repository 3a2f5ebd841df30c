"""Communication model of the sequence-parallel attention cores: bytes sent per rank per layer.

For ring, ulysses and hybrid (U x R = P) on a batch of b samples of s tokens, hidden h = heads x
d, e bytes per activation element, c = ceil(s / P) tokens per rank:

    ring      forward   (P-1) x 2bch e                      K/V chunks around the ring
              backward  (P-1) x 2bch e + P x 2bch x 4       K/V again, the fp32 dK/dV accumulators
    ulysses   forward   4 x bch e x (P-1)/P                 all-to-all of q, k, v in, the output back
              backward  the same                             the reverse all-to-alls of the gradients
    hybrid    forward   4 x bch e x (U-1)/U + (R-1) x 2bch e
              backward  4 x bch e x (U-1)/U + (R-1) x 2bch e + R x 2bch x 4     (R > 1; R = 1: no ring)
    + segment ids, int64, once per forward: ring/ulysses (P-1) x bc x 8; hybrid (U-1) x bc x 8 over
      the Ulysses group and (R-1) x b(Uc) x 8 over the ring group

An all-to-all sends the (n-1)/n of its input that other ranks hold, an all-gather each rank's
part to the n-1 others. `measure` counts the same on CPU (gloo) by wrapping the ring's exchange
(`SeqComm.shift`), torch.distributed.all_to_all_single and all_gather while one core runs forward
and backward; tests/test_hybrid.py checks measure == model.

`project` turns the model into time on 8 GPUs per node x N nodes (H100-class numbers, see
RESULTS.md for the sources): the ring's exchange of step t+1 overlaps block t's compute, so only
max(0, comm - compute) per step is exposed; the all-to-alls are not overlapped.

    .venv/bin/python benchmarks/comm_model.py --write  # measures on 4 and 6 CPU ranks, writes RESULTS.md
"""
import argparse
import contextlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

import this_repo  # noqa: E402  (tools/this_repo.py)
this_repo.put_first()  # this repository's megatron, not an installed one
from megatron.errors import start_up_stops_in_one_line  # noqa: E402

with start_up_stops_in_one_line(Path(sys.argv[0]).name):  # Ctrl-C while torch loads: one line, exit 130
    import torch
    import torch.distributed as dist

    from results import BenchmarkParser, machine, positive, run_benchmark, write_section

IDS = 8  # int64 segment ids
ACCUMULATOR = 4  # the ring's dK/dV travel as fp32


def modelled_bytes(variant: str, b: int, s: int, P: int, h: int, U: int = 1, e: int = 4) -> dict:
    """{"forward", "backward", "ids"}: bytes one rank sends in one layer's attention."""
    c = -(-s // P)
    chunk = b * c * h * e  # one [b, s/P, h] tensor
    if variant == "ring":
        U = 1
    elif variant == "ulysses":
        U = P
    R = P // U
    a2a = 4 * chunk * (U - 1) // U
    ring_kv = (R - 1) * 2 * chunk
    ring_grads = (R if R > 1 else 0) * 2 * b * c * h * ACCUMULATOR
    if variant == "ulysses":
        ids = (P - 1) * b * c * IDS
    else:
        ids = (U - 1) * b * c * IDS + (R - 1) * b * U * c * IDS
    return {"forward": a2a + ring_kv, "backward": a2a + ring_kv + ring_grads, "ids": ids}


@contextlib.contextmanager
def counting(log: dict):
    """Adds to log["sent"] the bytes this rank sends through the ring exchange, all-to-alls and
    all-gathers (int64 all-gathers, the segment ids, go to log["ids"] instead)."""
    from megatron.model.attention.comm import SeqComm

    # SeqComm.shift counts every core's shifts (ring, hybrid's ring, BigBird, local), not only the ring's
    shift, all_to_all, all_gather = SeqComm.shift, dist.all_to_all_single, dist.all_gather

    def bytes_of(tensor):
        return tensor.numel() * tensor.element_size()

    def counted_shift(self, tensor, *args, **kwargs):
        log["sent"] += bytes_of(tensor)
        return shift(self, tensor, *args, **kwargs)

    def counted_all_to_all(output, input, *args, group=None, **kwargs):
        n = dist.get_world_size(group)
        log["sent"] += bytes_of(input) * (n - 1) // n
        return all_to_all(output, input, *args, group=group, **kwargs)

    def counted_all_gather(tensor_list, tensor, group=None, **kwargs):
        key = "ids" if tensor.dtype == torch.int64 else "sent"
        log[key] += bytes_of(tensor) * (dist.get_world_size(group) - 1)
        return all_gather(tensor_list, tensor, group=group, **kwargs)

    SeqComm.shift, dist.all_to_all_single, dist.all_gather = counted_shift, counted_all_to_all, counted_all_gather
    try:
        yield log
    finally:
        SeqComm.shift, dist.all_to_all_single, dist.all_gather = shift, all_to_all, all_gather


def measure(variant: str, b: int, s: int, heads: int, d: int, U: int = 1) -> dict:
    """This rank's measured {"forward", "backward", "ids"} bytes for one core call (seq group
    already initialised, with the Ulysses degree U for hybrid)."""
    from megatron.model import attention
    from megatron.model.bert import BertConfig
    from megatron.parallel import state

    size, rank = state.get_sequence_parallel_world_size(), state.get_sequence_parallel_rank()
    config = BertConfig(hidden_size=heads * d, num_attention_heads=heads, seq_length=s, max_position_embeddings=s,
                        attention=variant, attention_dropout=0.0, ulysses_size=U if variant == "hybrid" else None)
    core = attention.build(config)
    c = -(-s // size)
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(b, c, heads, d, generator=g, requires_grad=True) for _ in range(3))
    segment_ids = (torch.arange(rank * c, (rank + 1) * c) < s).long().expand(b, c)  # the padded tail: 0
    forward, backward = {"sent": 0, "ids": 0}, {"sent": 0, "ids": 0}
    with counting(forward):
        out = core(q, k, v, segment_ids)
    with counting(backward):
        out.backward(torch.ones_like(out))
    return {"forward": forward["sent"], "backward": backward["sent"], "ids": forward["ids"] + backward["ids"]}


# ---- projection to GPUs -------------------------------------------------------------------
GPUS_PER_NODE = 8
NVLINK = 370e9  # B/s per GPU, achieved (H100 SXM NVLink 4: 450 GB/s per direction on paper)
IB = 48e9  # B/s per GPU, achieved (one ConnectX-7 NDR 400 Gb/s = 50 GB/s per direction per GPU)
FLOPS = 480e12  # attention FLOP/s per GPU, bf16 (about half of H100 SXM's 989 TFLOP/s dense peak)
BACKWARD_FLOPS = 2.5  # attention backward / forward FLOPs (5 matmuls with the recompute vs 2)


def _ring_time(steps: int, tokens: int, h_local: int, b: int, e: int, bandwidth: float) -> tuple:
    """(compute s, exposed comm s) of a ring of `steps` + 1 blocks, fwd + bwd, queries and keys
    of `tokens` tokens each, `h_local` = heads x d attended by this rank."""
    block = 4 * b * tokens * tokens * h_local / FLOPS  # QK^T and PV of one block, forward
    kv = 2 * b * tokens * h_local * e / bandwidth
    grads = 2 * b * tokens * h_local * ACCUMULATOR / bandwidth
    compute = (steps + 1) * block * (1 + BACKWARD_FLOPS)
    exposed = steps * (max(0.0, kv - block) + max(0.0, kv + grads - BACKWARD_FLOPS * block))
    if steps:
        exposed += grads  # the last hop home of the dK/dV accumulators
    return compute, exposed


def _all_to_all_time(nbytes: float, P: int) -> float:
    """The (P-1)/P of an all-to-all input that leaves a rank: the share for the other GPUs of the
    node on NVLink, the rest on IB, concurrently."""
    local = min(P, GPUS_PER_NODE)
    intra, inter = nbytes * (local - 1) / P, nbytes * (P - local) / P
    return max(intra / NVLINK, inter / IB)


def project(variant: str, s: int, nodes: int, heads: int = 16, h: int = 1024, b: int = 1, e: int = 2):
    """(fwd + bwd bytes per rank per layer, attention compute s, exposed comm s), or None where
    the variant cannot run (ulysses: heads % P)."""
    P = GPUS_PER_NODE * nodes
    U = {"ring": 1, "ulysses": P, "hybrid": GPUS_PER_NODE}[variant]
    if heads % U:
        return None
    R = P // U
    model = modelled_bytes(variant, b, s, P, h, U, e)
    c = s // P
    a2a = 2 * _all_to_all_time(4 * b * c * h * e, U) if U > 1 else 0.0
    ring_bandwidth = NVLINK if nodes == 1 and variant == "ring" else IB
    compute, exposed = _ring_time(R - 1, U * c, h // U, b, e, ring_bandwidth)
    return model["forward"] + model["backward"], compute, exposed + a2a


def projection_table(seq_lengths=(32768, 65536, 131072, 262144), node_counts=(1, 2, 4, 8)) -> str:
    lines = ["| tokens | nodes x 8 GPUs | ring MB / exposed | ulysses MB / exposed | hybrid 8 x N MB / exposed | pick |",
             "|---|---|---|---|---|---|"]
    for s in seq_lengths:
        for nodes in node_counts:
            cells, exposure = [], {}
            for variant in ("ring", "ulysses", "hybrid"):
                result = project(variant, s, nodes)
                if result is None:
                    cells.append("- (heads % P)")
                    continue
                nbytes, compute, exposed = result
                exposure[variant] = exposed / compute
                cells.append(f"{nbytes / 1e6:.0f} / {100 * exposed / compute:.0f}%")
            best = min(exposure.values())
            pick = min((v for v in exposure if exposure[v] <= best + 0.01), key=lambda v: project(v, s, nodes)[0])
            lines.append(f"| {s // 1024}K | {nodes} | " + " | ".join(cells) + f" | {pick} |")
    return "\n".join(lines)


def measured_rows(P: int, U: int, variants, b: int, s: int, heads: int, d: int) -> list:
    """[(variant, P, its Ulysses degree, per-rank measured bytes, modelled bytes)], one spawn of P ranks."""
    from megatron.parallel.spawn import run_on_ranks

    per_rank = run_on_ranks(_measure_on_rank, P, variants, P, U, b, s, heads, d, timeout=600)
    return [(variant, P, U if variant == "hybrid" else (P if variant == "ulysses" else 1),
             [rank[variant] for rank in per_rank], modelled_bytes(variant, b, s, P, heads * d, U, 4))
            for variant in variants]


def _measure_on_rank(variants, P, U, b, s, heads, d):
    from megatron.parallel import state

    state.initialize(sequence=P, ulysses=U)
    return {variant: measure(variant, b, s, heads, d, U) for variant in variants}


def parse_args(argv=None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-length", type=positive(int), default=1000,
                        help="tokens per sample (P need not divide it)")
    return parser.parse_args(argv)


def main():
    args = parse_args()
    started = time.perf_counter()
    b, s, heads, d = 2, args.seq_length, 4, 16
    rows = measured_rows(4, 2, ("ring", "ulysses", "hybrid"), b, s, heads, d)
    rows += measured_rows(6, 2, ("ring", "hybrid"), b, s, heads, d)
    table = ["| variant | P | U x R | forward measured / model | backward measured / model | segment ids measured / model |",
             "|---|---|---|---|---|---|"]
    for variant, P, U, per_rank, model in rows:
        cells = []
        for key in ("forward", "backward", "ids"):
            measured = sorted({r[key] for r in per_rank})
            cells.append(f"{', '.join(map(str, measured))} / {model[key]}")
        table.append(f"| {variant} | {P} | {U} x {P // U} | " + " | ".join(cells) + " |")
    write_section("Communication model: ring, ulysses, hybrid", f"""
Bytes one rank sends per layer (one attention call), b samples of s tokens, hidden h = heads x d,
e bytes per element, c = ceil(s/P) tokens per rank (a tail that P does not divide is padding),
hybrid = Ulysses over U adjacent ranks x ring over R = P/U groups:

| variant | forward | backward (adds) |
|---|---|---|
| ring | (P-1) x 2bch e | (P-1) x 2bch e + P x 2bch x 4 (fp32 dK/dV home) |
| ulysses | 4bch e x (P-1)/P (q, k, v in, output out) | 4bch e x (P-1)/P |
| hybrid | 4bch e x (U-1)/U + (R-1) x 2bch e | 4bch e x (U-1)/U + (R-1) x 2bch e + R x 2bch x 4 |

plus the segment ids (int64) once per forward: (P-1) x bc x 8 for ring and ulysses, (U-1) x bc x 8
+ (R-1) x b(Uc) x 8 for hybrid. In s: the ring moves 2(P-1)/P x bsh e per direction, Ulysses
4(P-1)/P^2 x bsh e (P/2 times less at P=8), hybrid 4(U-1)/(UP) x bsh e over the fast links plus
2(R-1)/P x bsh e over the ring, whose links run across nodes.

**Measured on CPU** ({machine()}; `.venv/bin/python benchmarks/comm_model.py --seq-length {s}`,
{time.perf_counter() - started:.0f} s): b={b}, s={s}, {heads} heads x d={d}, fp32; every rank's count
(listed when ranks differ) against the model. Counted by wrapping the ring's exchange (`SeqComm.shift`),
`torch.distributed.all_to_all_single` (DeepSpeed's `_SeqAllToAll` calls it) and `all_gather` while
one core runs forward and backward; `tests/test_hybrid.py` asserts equality at P=4 (2 x 2) and P=6 (2 x 3).

{chr(10).join(table)}

**Projection to 8 GPUs per node x N nodes**, BERT-large attention (h=1024, 16 heads), b=1, bf16
activations (e=2) with the ring's fp32 dK/dV, forward + backward per layer: MB sent per rank, and
the communication left exposed as a share of the attention compute time. Assumptions (not
measured here): NVLink {NVLINK / 1e9:.0f} GB/s per GPU achieved (H100 SXM NVLink 4 is 900 GB/s
bidirectional, 450 GB/s each way: NVIDIA H100 datasheet; ~370 GB/s is the bus bandwidth
nccl-tests reach on DGX H100), InfiniBand {IB / 1e9:.0f} GB/s per GPU (one ConnectX-7 NDR
400 Gb/s = 50 GB/s per GPU in a DGX H100: NVIDIA DGX H100 user guide), attention at
{FLOPS / 1e12:.0f} TFLOP/s per GPU (about half of the 989 TFLOP/s bf16 dense peak; FlashAttention-2/3
report 350-740 on H100), backward {BACKWARD_FLOPS}x the forward FLOPs. The ring overlaps each
exchange with one block (only max(0, comm - compute) per step is exposed, so it hides once a block
holds more than FLOPS/bandwidth = {FLOPS / NVLINK:.0f} tokens on NVLink, {FLOPS / IB:.0f} on IB); the
all-to-alls are exposed in full, their cross-node share at IB speed. Ring over N > 1 nodes runs at
the IB hop's speed; hybrid = Ulysses over the 8 GPUs of a node, ring over the N nodes (one IB link
per GPU, 8 rings side by side). Ulysses needs 16 % P = 0 (P <= 16).

{projection_table()}

**Which variant when** (the table's `pick`: least exposed communication, within a point the fewer
bytes). Inside one node (P <= 8, all NVLink) every variant hides or nearly hides its traffic from
32K tokens on, and Ulysses moves P/2 = 4x fewer bytes than the ring (NVLink left to ZeRO and
data-parallel traffic): `ulysses` when the heads divide P, else `hybrid` with the largest
`ulysses_size` dividing both, else `ring`. Across nodes the plain ring runs each step at the IB
hop's speed and hides only when a rank holds more than ~{FLOPS / IB / 1000:.0f}K tokens (s >= {GPUS_PER_NODE * FLOPS / IB / 1000:.0f}K x N): at
32K-128K its exposed communication is 0.4-21x the attention time. `hybrid` with `ulysses_size` =
GPUs per node keeps the all-to-all on NVLink and runs the ring between nodes on blocks {GPUS_PER_NODE}x longer
(s/N tokens for heads/{GPUS_PER_NODE} heads), which hide once s/N exceeds ~{FLOPS / IB / 1000:.0f}K: a few % of attention from
about 10% at 64K on 2-4 nodes and 3-5% from 128K on 2-8 nodes; what stays exposed is mostly the last hop of the fp32 dK/dV
accumulators (not overlapped by this ring). Ulysses over 2 nodes (P = 16 = heads) is as good or a little better but
ends at P = heads, with most of its all-to-all on IB. Short sequences over many nodes (32K on 8
nodes) are communication-bound whatever the variant: use fewer sequence-parallel ranks and more
data parallelism.
""")


if __name__ == "__main__":
    run_benchmark(main)
