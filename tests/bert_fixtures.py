"""A small BERT and a padded batch shared by the exactness tests (importable by spawned ranks)."""

import torch
import torch.nn.functional as F

from megatron.data.batch import BertBatch
from megatron.model.bert import BertConfig, BertModel

VOCAB = 97


def small_config(attention="ring", seq_length=48, **overrides) -> BertConfig:
    values = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_attention_heads=4, seq_length=seq_length,
                  max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0,
                  make_vocab_size_divisible_by=16, attention=attention)
    values.update(overrides)
    return BertConfig(**values)


def small_model(config: BertConfig, seed: int = 1234) -> BertModel:
    torch.manual_seed(seed)
    return BertModel(config)


def padded_batch(seq_length=48, pad_starts=(48, 29, 5, 24), seed: int = 7) -> BertBatch:
    """Sample i is real up to pad_starts[i]: 0%, ~40%, ~90% padding, and one whose last half
    (so the whole last chunk at SP = 2, 3, 4) is padding."""
    g = torch.Generator().manual_seed(seed)
    b = len(pad_starts)
    positions = torch.arange(seq_length)[None]
    key_padding_mask = positions >= torch.tensor(pad_starts)[:, None]
    tokens = torch.randint(5, VOCAB, (b, seq_length), generator=g).masked_fill(key_padding_mask, 0)
    token_types = (positions >= torch.tensor(pad_starts)[:, None] // 2).long().masked_fill(key_padding_mask, 0)
    loss_mask = (torch.rand(b, seq_length, generator=g) < 0.3) & ~key_padding_mask
    labels = torch.randint(5, VOCAB, (b, seq_length), generator=g)
    sop_labels = torch.randint(0, 2, (b,), generator=g)
    return BertBatch.unpacked(tokens, token_types, key_padding_mask, labels, loss_mask, sop_labels)


# sample 0: segments crossing the chunk boundaries at SP = 2 and 4, then a chunk of padding at
# SP = 4; 1: full, no padding; 2: one segment filling the sequence; 3: two short segments, then
# padding over the last chunk at SP = 2 and the last two at SP = 4
PACKED_LAYOUTS = ((7, 13, 5, 11), (20, 16, 12), (48,), (9, 9))


def packed_batch(layouts=PACKED_LAYOUTS, seq_length=48, seed: int = 7):
    """Packed samples of random segments ([CLS] A [SEP] B [SEP]: types 0 then 1, ~30% predicted)
    -> (packed BertBatch, [per sample: [per segment: the same segment alone as an unpacked
    BertBatch of one sample, padded to seq_length]])."""
    g = torch.Generator().manual_seed(seed)
    packed, alone = [], []
    for lengths in layouts:
        parts, singles = [], []
        for number, length in enumerate(lengths, start=1):
            tokens = torch.randint(5, VOCAB, (length,), generator=g)
            token_types = (torch.arange(length) >= length // 2).long()
            loss_mask = torch.rand(length, generator=g) < 0.3
            loss_mask[[0, length - 1]] = False  # never [CLS] or the final [SEP]
            labels = torch.randint(5, VOCAB, (length,), generator=g)
            sop_label = torch.randint(0, 2, (1,), generator=g)
            fields = dict(tokens=tokens, token_types=token_types, segment_ids=torch.full((length,), number),
                          position_ids=torch.arange(length), labels=labels, loss_mask=loss_mask,
                          sop_labels=sop_label.expand(length))
            parts.append(fields)
            pad = seq_length - length
            padded = {name: F.pad(value, (0, pad))[None] for name, value in fields.items()}
            singles.append(BertBatch.unpacked(padded["tokens"], padded["token_types"], padded["segment_ids"] == 0,
                                              padded["labels"], padded["loss_mask"], sop_label))
        pad = seq_length - sum(lengths)
        packed.append({name: F.pad(torch.cat([part[name] for part in parts]), (0, pad)) for name in parts[0]})
        alone.append(singles)
    return BertBatch(**{name: torch.stack([sample[name] for sample in packed]) for name in packed[0]}), alone


def concat_batches(*batches) -> BertBatch:
    return BertBatch(**{name: torch.cat([b.tensors()[name] for b in batches]) for name in batches[0].tensors()})


def with_fp16_kernels_allowed(fn, *args, **kwargs):
    """Runs fn(*args) with DeepSpeed's CPU accelerator reporting fp16 support.

    DeepSpeed refuses fp16 on a CPU whose oneDNN lacks fp16 kernels (it depends on the CPU model);
    torch's CPU kernels still compute in fp16, so the loss-scaling logic under test runs the same
    on every machine."""
    from deepspeed.accelerator import get_accelerator

    get_accelerator().is_fp16_supported = lambda: True
    return fn(*args, **kwargs)


def naive_masked_attention(q, k, v, allowed):
    """[b, s_q, heads, d] queries over keys with allowed [b, s_q, s_k]; a row with no allowed key
    gets zeros (the convention of every core here)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    empty = ~allowed.any(-1)[:, None, :, None]
    probs = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def bigbird_allowed(slots, valid, block: int):
    """BigBird's block pattern (block_pattern's slots and valid, [n, columns]) -> [s, s] bool: query i may
    see key j where j's block is in i's row, and the global blocks 0 and n - 1 see and are seen by all."""
    num_blocks = slots.shape[0]
    blocks = torch.zeros(num_blocks, num_blocks, dtype=torch.bool)
    for row in range(num_blocks):
        blocks[row, slots[row][valid[row]]] = True
    blocks[[0, -1], :] = blocks[:, [0, -1]] = True
    return blocks.repeat_interleave(block, 0).repeat_interleave(block, 1)


def segment_allowed(segment_ids):
    """[b, s] segment ids (0 = padding) -> [b, s, s]: query i may see key j of its own segment."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
