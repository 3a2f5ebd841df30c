"""BERT datasets over Megatron indexed data: document split, cached sample mappings, blending.

A sample is a row (first sentence, end sentence, target length) of a mapping built by the C++
`build_mapping` over the documents of one split. Mappings are saved next to the data as
`{prefix}_{split}_indexmap_*.npy`; in a distributed run rank 0 builds a missing one while the
others wait at a barrier, and every later run reuses it.
"""
import math
import os
import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from megatron.data import helpers
from megatron.data.bert_sample import SpecialIds, build_sample
from megatron.data.blendable import BlendableDataset
from megatron.data.indexed_dataset import make_dataset
from megatron.errors import ConfigError, DataError

SPLIT_NAMES = ("train", "valid", "test")
LONG_SENTENCE_LEN = 512  # Megatron skips documents with a longer sentence; we raise it to the sample size


def split_boundaries(split: str, num_docs: int) -> list[int]:
    """'949,50,1' over num_docs documents -> [0, train_end, valid_end, num_docs]."""
    try:
        weights = [float(part) for part in re.split(r"[,/]", split) if part.strip()]
    except ValueError:
        weights = []
    if not 1 <= len(weights) <= 3 or min(weights) < 0 or sum(weights) <= 0:
        raise ConfigError(f"--split {split!r} is not up to three non-negative weights", "pass e.g. --split 949,50,1")
    weights = [w / sum(weights) for w in weights + [0.0] * (3 - len(weights))]
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight * num_docs)))
    excess = bounds[-1] - num_docs
    return [bounds[0]] + [b - excess for b in bounds[1:]]


def mapping_path(prefix: str, name: str, first_doc: int, end_doc: int, max_num_samples: int, max_seq_length: int,
                 short_seq_prob: float, seed: int, binary_head: bool) -> str:
    return (f"{prefix}_{name}_indexmap_{max_num_samples}mns_{max_seq_length}msl_{short_seq_prob:0.2f}ssp_{seed}s"
            f"_{first_doc}-{end_doc}docs{'' if binary_head else '_nobh'}.npy")


def samples_mapping(indexed, prefix: str, name: str, doc_range: tuple, max_num_samples: int, max_tokens: int,
                    short_seq_prob: float, seed: int, binary_head: bool) -> np.ndarray:
    """[n, 3] rows (first sentence, end sentence, target tokens) over documents
    [doc_range[0], doc_range[1]), built once and cached."""
    path = mapping_path(prefix, name, *doc_range, max_num_samples, max_tokens, short_seq_prob, seed, binary_head)
    distributed = dist.is_available() and dist.is_initialized()
    if not os.path.isfile(path) and (not distributed or dist.get_rank() == 0):
        docs = np.ascontiguousarray(indexed.doc_idx[doc_range[0]:doc_range[1] + 1], dtype=np.int64)
        mapping = helpers.build_mapping(docs, indexed.sizes, 2**31 - 1, max_num_samples, max_tokens, short_seq_prob,
                                        seed, min_num_sent=2 if binary_head else 1,
                                        long_sentence_len=max(LONG_SENTENCE_LEN, max_tokens))
        partial = Path(path + ".partial.npy")
        np.save(partial, mapping, allow_pickle=False)
        os.replace(partial, path)
    if distributed:
        dist.barrier()
    mapping = np.load(path, mmap_mode="r", allow_pickle=False)
    if len(mapping) == 0:
        raise DataError(f"{prefix}: the {name} split yields no BERT samples (documents need "
                        f"{2 if binary_head else 1}+ sentences of at most {max(LONG_SENTENCE_LEN, max_tokens)} tokens)",
                        "preprocess with --split-sentences, or give this split more documents with --split")
    return mapping


class BertDataset(torch.utils.data.Dataset):
    """Samples of one split of one indexed dataset; item i is a dict of numpy arrays."""

    def __init__(self, name: str, indexed, prefix: str, doc_range: tuple, max_num_samples: int, seq_length: int,
                 tokenizer, masked_lm_prob: float = 0.15, short_seq_prob: float = 0.1, seed: int = 1234,
                 binary_head: bool = True, whole_word_masking: bool = False):
        self.indexed = indexed
        self.seq_length = seq_length
        self.masked_lm_prob = masked_lm_prob
        self.seed = seed
        self.binary_head = binary_head
        specials = 3 if binary_head else 2
        self.mapping = samples_mapping(indexed, prefix, name, doc_range, max_num_samples, seq_length - specials,
                                       short_seq_prob, seed, binary_head)
        self.ids = SpecialIds(cls=tokenizer.cls, sep=tokenizer.sep, mask=tokenizer.mask, pad=tokenizer.pad)
        vocab_tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
        self.random_ids = np.array([i for i, t in enumerate(vocab_tokens) if not (t.startswith("[") and t.endswith("]"))])
        self.continuation = (np.array([t.startswith("##") for t in vocab_tokens]) if whole_word_masking else None)

    def __len__(self) -> int:
        return len(self.mapping)

    def __getitem__(self, idx: int) -> dict:
        first, end, target = (int(v) for v in self.mapping[idx])
        sentences = [self.indexed[i].astype(np.int64) for i in range(first, end)]
        rng = np.random.RandomState((self.seed + idx) % 2**32)
        return build_sample(sentences, target, self.seq_length, self.ids, self.random_ids, self.masked_lm_prob, rng,
                            self.binary_head, self.continuation)


def parse_data_path(data_path: list[str]) -> tuple[list[float], list[str]]:
    """['p'] or ['w1', 'p1', 'w2', 'p2', ...] -> (normalised weights, prefixes)."""
    if len(data_path) == 1:
        return [1.0], list(data_path)
    try:
        weights = [float(w) for w in data_path[0::2]]
    except ValueError:
        weights = []
    if len(data_path) % 2 or not weights or min(weights) < 0 or sum(weights) <= 0:
        raise ConfigError(f"--data-path {' '.join(data_path)} is not one prefix or weight/prefix pairs",
                          "pass --data-path PREFIX or --data-path W1 PREFIX1 W2 PREFIX2 ...")
    return [w / sum(weights) for w in weights], list(data_path[1::2])


def build_train_valid_test_datasets(data_path: list[str], data_impl: str, split: str, num_samples: tuple,
                                    seq_length: int, tokenizer, **sample_options) -> list:
    """[train, valid, test] (None where a split has no documents or no samples are asked for);
    several prefixes are blended by weight. sample_options go to BertDataset."""
    weights, prefixes = parse_data_path(data_path)
    per_prefix = [_split_datasets(prefix, data_impl, split,
                                  [math.ceil(w * n * 1.005) + 1 if n else 0 for n in num_samples],
                                  seq_length, tokenizer, sample_options)
                  for w, prefix in zip(weights, prefixes)]
    if len(prefixes) == 1:
        return per_prefix[0]
    blended = []
    for s, n in enumerate(num_samples):
        parts = [(w, datasets[s]) for w, datasets in zip(weights, per_prefix) if datasets[s] is not None and w > 0]
        blended.append(BlendableDataset([d for _, d in parts], [w for w, _ in parts], n) if parts and n else None)
    return blended


def _split_datasets(prefix, data_impl, split, num_samples, seq_length, tokenizer, sample_options) -> list:
    indexed = make_dataset(prefix, data_impl)
    bounds = split_boundaries(split, len(indexed.doc_idx) - 1)
    datasets = []
    for s, name in enumerate(SPLIT_NAMES):
        if bounds[s + 1] <= bounds[s] or not num_samples[s]:
            datasets.append(None)
            continue
        datasets.append(BertDataset(name, indexed, prefix, (bounds[s], bounds[s + 1]), num_samples[s], seq_length,
                                    tokenizer, **sample_options))
    return datasets
