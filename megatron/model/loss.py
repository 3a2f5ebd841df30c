"""MLM + sentence-order loss, normalised over the whole sequence even when it is SP-split.

Each seq rank returns its SHARE of the loss: the summed cross-entropy of the masked tokens in
its chunk divided by the masked-token count of the whole sequence, plus the summed sentence-order
cross-entropy of the segments whose [CLS] lies in its chunk divided by the segment count of the
whole micro-batch. The shares sum to the single-rank loss, so gradients summed over the seq group
equal the single-rank gradients. Unpacked, a sample is one segment and the SOP term is the mean
over the samples, as in Megatron.

The loss meets no process group: the caller passes `sum_counts`, which sums this chunk's counts
over the seq group (megatron.parallel.reduce.sum_over_sequence), or `whole` for whole samples.
Leaving it out would divide each chunk by its own counts, a wrong loss without an error: bert_loss
requires it, and bert_batch_loss refuses a sequence chunk (BertBatch.chunk_of) without it.
"""
from typing import Callable, NamedTuple

import torch
from torch.autograd.function import once_differentiable


class BertLoss(NamedTuple):
    total: torch.Tensor  # this rank's share: backward on it
    mlm: torch.Tensor  # this rank's share of the MLM loss (detached)
    sop: torch.Tensor  # this rank's share of the SOP loss (detached)
    mlm_accuracy: torch.Tensor  # this rank's share of the fraction of masked tokens predicted right


def chunk_counts(mlm_labels, sop_labels) -> torch.Tensor:
    """[masked tokens, segments] of this chunk, as float32 for one all-reduce of both."""
    segments = 0 if sop_labels is None else sop_labels.numel()
    return torch.tensor([float(mlm_labels.numel()), float(segments)], device=mlm_labels.device)


class SummedCrossEntropy(torch.autograd.Function):
    """sum_i -log softmax(logits_i)[label_i] over [n, vocab] logits, in float32 for any input dtype.

    Same value and gradient as F.cross_entropy(logits.float(), labels, reduction="sum"), with
    less traffic over the [n, vocab] matrix, the largest tensor of a BERT step: no float32 copy
    of half-precision logits, and backward writes softmax - one_hot in one new buffer instead of
    torch's zero-filled one-hot gradient followed by log_softmax's backward.
    """

    @staticmethod
    def forward(ctx, logits, labels):
        log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        ctx.save_for_backward(log_probs, labels)
        ctx.logits_dtype = logits.dtype
        return -log_probs.gather(1, labels[:, None]).sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        log_probs, labels = ctx.saved_tensors
        grad_logits = log_probs.exp()
        grad_logits[torch.arange(labels.numel(), device=labels.device), labels] -= 1.0
        return grad_logits.mul_(grad).to(ctx.logits_dtype), None


def whole(counts: torch.Tensor) -> torch.Tensor:
    """bert_loss's `sum_counts` for whole samples (one chunk): their counts are the micro-batch's."""
    return counts


def bert_loss(mlm_logits, mlm_labels, sop_logits=None, sop_labels=None, *, sum_counts: Callable) -> BertLoss:
    """mlm_logits [n_masked, vocab] with mlm_labels [n_masked]; sop_logits [n_cls, 2] with
    sop_labels [n_cls] (the segments whose [CLS] is in this chunk, possibly none) or None;
    `sum_counts`: this chunk's counts -> the whole micro-batch's (`whole` for whole samples).

    A chunk without [CLS] keeps its (empty) SOP term in the graph, so the binary head gets (zero)
    gradients on every rank alike.
    """
    counts = chunk_counts(mlm_labels, sop_labels if sop_logits is not None else None)
    counts = sum_counts(counts).clamp(min=1.0)
    mlm = SummedCrossEntropy.apply(mlm_logits, mlm_labels) / counts[0]
    sop = torch.zeros((), device=mlm.device)
    if sop_logits is not None:
        sop = SummedCrossEntropy.apply(sop_logits, sop_labels) / counts[1]
    total = mlm + sop
    correct = (mlm_logits.detach().argmax(-1) == mlm_labels).sum() / counts[0]
    return BertLoss(total=total, mlm=mlm.detach(), sop=sop.detach(), mlm_accuracy=correct)


def bert_batch_loss(mlm_logits, sop_logits, batch, sum_counts: Callable | None = None) -> BertLoss:
    """bert_loss for the outputs of BertModel on `batch` (a BertBatch). A sequence chunk
    (batch.chunk_of > 1) needs `sum_counts`; whole samples need none."""
    if sum_counts is None and batch.chunk_of > 1:
        raise ValueError(f"a sequence chunk (one of {batch.chunk_of}) needs sum_counts: its own counts are not the "
                         "micro-batch's")
    return bert_loss(mlm_logits, batch.labels[batch.loss_mask], sop_logits, batch.sop_labels[batch.cls_mask],
                     sum_counts=sum_counts or whole)
