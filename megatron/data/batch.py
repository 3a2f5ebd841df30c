"""A BERT micro-batch and the slice of it one sequence-parallel rank keeps.

A sample holds one or more segments back to back (several when packed, --pack-samples), each
`[CLS] A [SEP] B [SEP]` with its own positions (from 0), token types and sentence-order label,
then padding. What a token may see is data: `segment_ids` (0 at padding, 1, 2, ... per segment)
lets a query attend only to keys of its own segment; the attention cores read nothing else.
Every tensor field is per token, so a sequence-parallel rank slices all of them alike (and the chunk
says it is one: chunk_of).
"""
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch


PAD_SEGMENT = 0  # segment id of padding: attends to nothing, seen by nothing


@dataclass
class BertBatch:
    tokens: torch.Tensor  # [b, s] int64
    token_types: torch.Tensor  # [b, s] int64, 0 for A and 1 for B within each segment
    segment_ids: torch.Tensor  # [b, s] int64, PAD_SEGMENT at padding, 1..k for the k segments of a sample
    position_ids: torch.Tensor  # [b, s] int64, position within the token's segment (0 at its [CLS]; 0 at padding)
    labels: torch.Tensor  # [b, s] int64, meaningful where loss_mask
    loss_mask: torch.Tensor  # [b, s] bool, True at masked (predicted) tokens
    sop_labels: torch.Tensor  # [b, s] int64, the sentence-order label of the token's segment (read at [CLS])
    # the number of sequence chunks the samples are cut into, this batch one of them (sequence_chunk); 1: whole
    # samples. A chunk's loss needs the counts of all of them (model/loss.py bert_batch_loss's sum_counts)
    chunk_of: int = 1

    @classmethod
    def unpacked(cls, tokens, token_types, key_padding_mask, labels, loss_mask, sop_labels) -> "BertBatch":
        """One segment per sample (positions 0..s-1, sop_labels [b]) from the classic padded layout."""
        b, s = tokens.shape
        segment_ids = (~key_padding_mask).long()
        position_ids = torch.arange(s, device=tokens.device).expand(b, s).masked_fill(key_padding_mask, 0)
        return cls(tokens, token_types, segment_ids, position_ids, labels, loss_mask,
                   sop_labels.reshape(b, 1).expand(b, s).contiguous())

    def tensors(self) -> dict:
        """{name: tensor} of the per-token fields (all but chunk_of)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "chunk_of"}

    def mapped(self, change: Callable) -> "BertBatch":
        """The batch with `change(tensor)` in place of each per-token field, the same chunk."""
        return replace(self, **{name: change(tensor) for name, tensor in self.tensors().items()})

    def pin_memory(self) -> "BertBatch":
        """Page-locked copies of the fields (a DataLoader with pin_memory calls it): the copy to the GPU
        can then run asynchronously."""
        return self.mapped(torch.Tensor.pin_memory)

    @property
    def key_padding_mask(self) -> torch.Tensor:  # [b, s] bool, True at padding
        return self.segment_ids == PAD_SEGMENT

    @property
    def cls_mask(self) -> torch.Tensor:  # [b, s] bool, True at each segment's [CLS]
        return cls_positions(self.position_ids, self.segment_ids)

    def sequence_chunk(self, rank: int, size: int) -> "BertBatch":
        """Rank `rank` of `size` keeps tokens [rank * c, (rank + 1) * c) of every field, c = ceil(s/size).

        A length that `size` does not divide is first padded at the tail to size * c with padding
        positions (segment id PAD_SEGMENT, no loss, no [CLS]): attention cores let padding see
        nothing and be seen by nothing, so the result is that of the unpadded sample (the cores
        that cannot pad refuse such a length at start-up: registry.AttentionCore.check). The chunk
        says it is one (chunk_of), so that its loss is not taken over its own counts alone."""
        step = -(-self.tokens.shape[1] // size)
        batch = self.padded_to(step * size)
        return replace(batch.mapped(lambda tensor: tensor[:, rank * step:(rank + 1) * step]), chunk_of=size)

    def padded_to(self, length: int) -> "BertBatch":
        """The batch with `length - s` padding positions appended (every field 0 / False there)."""
        extra = length - self.tokens.shape[1]
        if extra <= 0:
            return self
        return self.mapped(lambda tensor: torch.nn.functional.pad(tensor, (0, extra)))

    def samples(self, start: int, stop: int) -> "BertBatch":
        """Samples [start, stop) of the batch (a micro-batch of a global batch)."""
        return self.mapped(lambda tensor: tensor[start:stop])

    def model_inputs(self) -> tuple:
        """The positional arguments of BertModel.forward."""
        return self.tokens, self.token_types, self.position_ids, self.segment_ids, self.loss_mask, self.cls_mask

    def real_token_share(self) -> float:
        """Non-padding tokens / all tokens of the batch."""
        return float((self.segment_ids != PAD_SEGMENT).float().mean())

    def segments_per_sample(self) -> float:
        return float(self.cls_mask.sum()) / self.tokens.shape[0]

    def segment_lengths(self) -> torch.Tensor:
        """The token count of every segment of every sample (padding is none), one vector."""
        ids = self.segment_ids
        counts = torch.zeros(ids.shape[0], int(ids.max()) + 1, dtype=torch.int64, device=ids.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids))
        counts = counts[:, PAD_SEGMENT + 1:]
        return counts[counts > 0]


def cls_positions(position_ids, segment_ids):
    """True where a segment starts ([CLS]): position 0 of a non-padding segment."""
    return (position_ids == 0) & (segment_ids != PAD_SEGMENT)
