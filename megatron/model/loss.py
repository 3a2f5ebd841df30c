"""MLM + sentence-order loss, normalised over the whole sequence even when it is SP-split.

Each seq rank returns its SHARE of the loss: the summed cross-entropy of the masked tokens in
its chunk divided by the masked-token count of the whole sequence (all-reduced over the seq
group), plus the SOP loss on the rank that holds [CLS]. The shares sum to the single-rank
loss, so gradients summed over the seq group equal the single-rank gradients.
"""
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron.parallel import state


class BertLoss(NamedTuple):
    total: torch.Tensor  # this rank's share: backward on it
    mlm: torch.Tensor  # this rank's share of the MLM loss (detached)
    sop: torch.Tensor  # the SOP loss where [CLS] lives, else 0 (detached)


def masked_token_count(mlm_labels) -> torch.Tensor:
    """Masked tokens in the whole micro-batch sequence (all seq chunks together)."""
    count = torch.tensor(float(mlm_labels.numel()), device=mlm_labels.device)
    if state.get_sequence_parallel_world_size() > 1:
        dist.all_reduce(count, group=state.get_sequence_parallel_group())
    return count


def bert_loss(mlm_logits, mlm_labels, sop_logits=None, sop_labels=None) -> BertLoss:
    """mlm_logits [n_masked, vocab] with mlm_labels [n_masked]; sop_logits [b, 2] or None."""
    count = masked_token_count(mlm_labels).clamp(min=1.0)
    mlm = F.cross_entropy(mlm_logits.float(), mlm_labels, reduction="sum") / count
    sop = (F.cross_entropy(sop_logits.float(), sop_labels) if sop_logits is not None
           else torch.zeros((), device=mlm.device))
    total = mlm + sop
    return BertLoss(total=total, mlm=mlm.detach(), sop=sop.detach())
