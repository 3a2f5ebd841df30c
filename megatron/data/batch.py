"""A BERT micro-batch and the slice of it one sequence-parallel rank keeps."""
from dataclasses import dataclass, fields

import torch

from megatron.errors import ConfigError


@dataclass
class BertBatch:
    tokens: torch.Tensor  # [b, s] int64
    token_types: torch.Tensor  # [b, s] int64
    key_padding_mask: torch.Tensor  # [b, s] bool, True at padding
    labels: torch.Tensor  # [b, s] int64, meaningful where loss_mask
    loss_mask: torch.Tensor  # [b, s] bool, True at masked (predicted) tokens
    sop_labels: torch.Tensor  # [b] int64, 1 when the two segments were swapped
    chunk_start: int = 0  # position of tokens[:, 0] in the full sequence

    def sequence_chunk(self, rank: int, size: int) -> "BertBatch":
        """Rank `rank` of `size` keeps tokens [rank * s/size, (rank + 1) * s/size)."""
        seq = self.tokens.shape[1]
        if seq % size:
            raise ConfigError(f"sequence length {seq} is not divisible by the sequence-parallel size {size}",
                              "choose --seq-length as a multiple of --sequence-parallel-size")
        step = seq // size
        sliced = {f.name: getattr(self, f.name)[:, rank * step:(rank + 1) * step]
                  for f in fields(self) if f.name not in ("sop_labels", "chunk_start")}
        return BertBatch(**sliced, sop_labels=self.sop_labels, chunk_start=self.chunk_start + rank * step)

    def samples(self, start: int, stop: int) -> "BertBatch":
        """Samples [start, stop) of the batch (a micro-batch of a global batch)."""
        sliced = {f.name: getattr(self, f.name)[start:stop] for f in fields(self) if f.name != "chunk_start"}
        return BertBatch(**sliced, chunk_start=self.chunk_start)

    def model_inputs(self) -> tuple:
        """The positional arguments of BertModel.forward."""
        return self.tokens, self.token_types, self.key_padding_mask, self.loss_mask, self.chunk_start
