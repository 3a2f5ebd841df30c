"""BertModel cut into DeepSpeed pipeline stages (LayerSpec / TiedLayerSpec list).

    [word embedding (tied)] [positions + types] [layer 0] ... [layer N-1]
    [word embedding (tied): hands over its weight] [heads]

Between stages travel (hidden [b, s/P, h], segment_ids [b, s/P] int64, position_ids [b, s/P]
int64, token_flags [b, s/P] int64): fixed shapes, the last three without gradient. The layers
read position_ids for rope (a learned table is read by the first stage only, but the tuple
keeps one shape for every layout). token_flags carries the MLM and [CLS] masks as bits (`_MLM`,
`_CLS`): DeepSpeed's pipeline engine casts only the LAST bool tensor of a stage's outputs for
NCCL (runtime/pipe/engine.py, has_bool_tensors), so no bool tensor crosses stages. The word
embedding is tied between the first and last stage (DeepSpeed all-reduces its gradient over the
two). The loss function runs on the last stage with labels (labels, loss_mask, sop_labels,
cls_mask), which the engine loads there and never sends.

The stage modules meet no process group: the topology (pipe x data x seq) and the seq-group sums
(the loss's counts, the gradients) come from megatron/parallel/pipeline.py's SeqParallelPipe,
the subclass engine.build_engine trains.
"""
from typing import Callable

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.activation_checkpointing import checkpointing
from torch import nn

from megatron.model.bert import (BertConfig, BinaryHead, Embeddings, LMHead, TransformerLayer,
                                 final_layernorm)
from megatron.model.init import init_bert_weights
from megatron.model.loss import bert_loss


class WordEmbeddingPipe(nn.Module):
    """The word embedding alone: the one module tied between the first and the last stage."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)

    def forward(self, inputs):
        tokens, *rest = inputs
        return self.word_embeddings(tokens), *rest


_MLM, _CLS = 1, 2  # token_flags bits


class EmbeddingPipe(Embeddings):
    def __init__(self, config: BertConfig):
        super().__init__(config, word_embeddings=False)

    def forward(self, inputs):
        words, token_types, position_ids, segment_ids, mlm_mask, cls_mask = inputs
        token_flags = mlm_mask.long() * _MLM + cls_mask.long() * _CLS  # [b, s/P] int64: NCCL-safe
        return self.add_positions_and_types(words, token_types, position_ids), segment_ids, position_ids, token_flags


def _hand_over_word_embeddings(embedding: WordEmbeddingPipe, inputs):
    """Last-stage use of the tied embedding: append its weight for the LM decoder."""
    return (*inputs, embedding.word_embeddings.weight)


class TransformerLayerPipe(TransformerLayer):
    def forward(self, inputs):
        hidden, segment_ids, position_ids, token_flags = inputs
        return super().forward(hidden, segment_ids, position_ids), segment_ids, position_ids, token_flags


class HeadsPipe(nn.Module):
    """Final LayerNorm, MLM head on the masked positions, sentence-order head."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.final_layernorm = final_layernorm(config)
        self.lm_head = LMHead(config)
        self.binary_head = BinaryHead(config) if config.add_binary_head else None

    def forward(self, inputs):
        hidden, _, _, token_flags, word_embeddings_weight = inputs
        mlm_mask, cls_mask = (token_flags & _MLM) != 0, (token_flags & _CLS) != 0
        hidden = self.final_layernorm(hidden)
        mlm_logits = self.lm_head(hidden[mlm_mask], word_embeddings_weight)
        if self.binary_head is None:
            return mlm_logits
        return mlm_logits, self.binary_head(hidden[cls_mask])


class PipelineLoss:
    """The last stage's loss function: the rank's share of the loss (see model/loss.py) for DeepSpeed
    to backpropagate, and each micro-batch's (mlm, sop, mlm accuracy) shares kept for the log line,
    which DeepSpeed's engine does not return."""

    def __init__(self, sum_counts: Callable):
        self.parts = []
        self.sum_counts = sum_counts  # see model/loss.py bert_loss

    def __call__(self, outputs, labels):
        mlm_logits, sop_logits = outputs if isinstance(outputs, tuple) else (outputs, None)
        token_labels, loss_mask, sop_labels, cls_mask = labels
        loss = bert_loss(mlm_logits, token_labels[loss_mask], sop_logits, sop_labels[cls_mask],
                         sum_counts=self.sum_counts)
        self.parts.append(torch.stack([loss.mlm, loss.sop, loss.mlm_accuracy]).float())
        return loss.total


class BertModelPipe(PipelineModule):
    """`topology`: DeepSpeed's process grid; `sum_counts`: the loss's (model/loss.py bert_loss: its stages
    see sequence chunks at SP > 1, which it cannot tell from whole samples, so it is required)."""

    def __init__(self, config: BertConfig, topology, *, sum_counts: Callable, activation_checkpoint_interval: int = 0,
                 activation_checkpoint_func=checkpointing.checkpoint):
        specs = [TiedLayerSpec("embed", WordEmbeddingPipe, config, tied_weight_attr=["word_embeddings.weight"]),
                 LayerSpec(EmbeddingPipe, config)]
        specs += [LayerSpec(TransformerLayerPipe, config, index) for index in range(config.num_layers)]
        specs += [TiedLayerSpec("embed", WordEmbeddingPipe, config, forward_fn=_hand_over_word_embeddings,
                                tied_weight_attr=["word_embeddings.weight"]),
                  LayerSpec(HeadsPipe, config)]
        with torch.no_grad():  # its in-place broadcast of the tied embedding, kept out of every backward
            super().__init__(layers=specs, loss_fn=PipelineLoss(sum_counts), topology=topology,
                             partition_method="type:TransformerLayerPipe",
                             activation_checkpoint_interval=activation_checkpoint_interval,
                             # only transformer layers: the embedding's inputs carry no gradient
                             checkpointable_layers=["TransformerLayerPipe"],
                             activation_checkpoint_func=activation_checkpoint_func)
        self.config = config
        # BertModel's init, keyed by each parameter's BertModel name: every stage (and both copies
        # of the tied embedding) holds what the single process draws for the same seed
        init_bert_weights(self, config, seed=torch.initial_seed(),
                          bert_name=lambda name: pipe_to_bert_name(name, config.num_layers))


def _layout(num_layers: int) -> list:
    """(BertModel name prefix, pipeline layer index): the one name map, used in both directions.
    First match wins; the tied word embedding lives at layer 0 (and again at num_layers + 2)."""
    return ([("embeddings.word_embeddings.", 0), ("embeddings.", 1)]
            + [(f"layers.{i}.", i + 2) for i in range(num_layers)] + [("", num_layers + 3)])


def bert_to_pipe_layer(name: str, num_layers: int) -> tuple:
    """BertModel parameter name -> (pipeline layer index, name inside that layer)."""
    prefix, layer = next((p, i) for p, i in _layout(num_layers) if name.startswith(p))
    return layer, name[len(prefix):] if layer != 0 else name[len("embeddings."):]


def pipe_layer_to_bert(layer: int, key: str, num_layers: int) -> str:
    """(pipeline layer index, name inside it) -> BertModel parameter name."""
    layer = 0 if layer == num_layers + 2 else layer
    if layer == 0:
        return f"embeddings.{key}"
    return next(p for p, i in _layout(num_layers) if i == layer) + key


def bert_to_pipe_name(name: str, num_layers: int) -> str:
    """BertModel parameter name -> BertModelPipe state-dict name."""
    layer, key = bert_to_pipe_layer(name, num_layers)
    return f"tied_modules.embed.{key}" if layer == 0 else f"{layer}.{key}"


def pipe_to_bert_name(name: str, num_layers: int) -> str:
    """BertModelPipe state-dict name -> BertModel parameter name (inverse of bert_to_pipe_name)."""
    tied = "tied_modules.embed."
    if name.startswith(tied):
        return pipe_layer_to_bert(0, name[len(tied):], num_layers)
    layer, key = name.split(".", 1)
    return pipe_layer_to_bert(int(layer), key, num_layers)


def load_bert_state(pipe: BertModelPipe, bert_state: dict) -> None:
    """Copies a BertModel state dict into this stage's share of the pipeline."""
    names = {bert_to_pipe_name(name, pipe.config.num_layers): name for name in bert_state}
    with torch.no_grad():
        for name, tensor in pipe.state_dict().items():
            tensor.copy_(bert_state[names[name]])
