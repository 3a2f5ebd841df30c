"""BERT datasets over Megatron indexed data: document split, cached sample mappings, packing, blending.

A segment is a row (first sentence, end sentence, target length, epoch) of a mapping built by the
C++ `build_mapping` over the documents of one split; unpacked, a sample is one segment. Packed
(--pack-samples), a sample holds several segments back to back, chosen by the C++
`pack_segments` (best fit over a window of open samples), one epoch at a time. Both are shuffled
within each epoch only, so the mapping for more samples starts with the mapping for fewer: a run
resumed with a longer --train-iters or another batch size reads on in the same order. Mappings are
saved next to the data (or in --data-cache-path) as `{maps}_{split}_indexmap_*.npy` and
`{maps}_{split}_packmap_*.npy`, `{maps}` carrying a fingerprint of the data's contents
(index_maps.py), so that other data at the same prefix never meets maps of the old; in a
distributed run rank 0 builds a missing one while the others wait (cached_array), and every later
run on the same data reuses it.
"""
import contextlib
import math
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from megatron.data import helpers, index_maps
from megatron.data.bert_sample import SpecialIds, build_segment, pack, segment_length
from megatron.data.blendable import BlendableDataset
from megatron.data.indexed_dataset import make_dataset
from megatron.data.words import word_marks
from megatron.errors import ConfigError, DataError
from megatron.parallel import peers
from megatron.parallel.launch_env import local_rank

SPLIT_NAMES = ("train", "valid", "test")
LONG_SENTENCE_LEN = 512  # Megatron skips documents with a longer sentence; we raise it to the sample size
PACK_WINDOW = 256  # open samples pack_segments fills at once: more fills better and searches longer
BUILD_NOTICE_S = 5.0  # a map build taking longer says so (and later how long it took)
SKIPPED_SHARE_WARNED = 0.1  # of a prefix's tokens in documents build_mapping skips: a start-up warning


def split_weights(split: str) -> list[float]:
    """--split's weights as written ('949,50,1', Megatron's '90/5/5', empty parts skipped); [] when
    one is not a number."""
    try:
        return [float(part) for part in re.split(r"[,/]", split) if part.strip()]
    except ValueError:
        return []


def split_boundaries(split: str, num_docs: int) -> list[int]:
    """'949,50,1' over num_docs documents -> [0, train_end, valid_end, num_docs]."""
    weights = split_weights(split)
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
    """`_ep`: shuffled per epoch (maps without it are of the whole-map shuffle, before)."""
    return (f"{prefix}_{name}_indexmap_{max_num_samples}mns_{max_seq_length}msl_{short_seq_prob:0.2f}ssp_{seed}s"
            f"_{first_doc}-{end_doc}docs{'' if binary_head else '_nobh'}_ep.npy")


def cached_array(path: str, build, what: str = "") -> np.ndarray:
    """The array saved at `path`, built by `build()` first if missing, then loaded memory-mapped.
    A build still running after BUILD_NOTICE_S says so, naming `what` ("train index map (N samples)"),
    and how long it took: a large map takes minutes while the other ranks wait; a small one says nothing.

    In a distributed run rank 0 builds it while the others wait (peers.while_some_build: a build may
    take longer than a collective may wait, and goes on as long as it lasts; a builder or another rank
    ending stops them with the lost-rank line); then the first rank of any node that still does not
    see it (a cache folder each node has on its own disk) builds it there,
    the same array, as the build is deterministic. Written to a per-process `.partial` file and
    renamed, so a crash never leaves a file that looks complete. A folder that cannot be written
    (data on a read-only mount) stops every rank with the same one-line error."""
    distributed = dist.is_available() and dist.is_initialized()
    first_of_node = local_rank() == 0
    for builds in ((not distributed or dist.get_rank() == 0), first_of_node):
        failure = peers.while_some_build(builds and not os.path.isfile(path), lambda: _save_built(path, build, what))
        problem = _failure_text(path, failure)
        if distributed:  # every rank takes part, so that one failed build stops all, none waits
            problems = [None] * dist.get_world_size()
            dist.all_gather_object(problems, problem)
            problem = next((found for found in problems if found), None)
        if failure is not None and not isinstance(failure, OSError):
            raise failure  # a bug, not a folder: its traceback, on the rank that met it
        if problem:
            raise DataError(*problem)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:  # written whole and renamed: damaged since, or not a map
        raise DataError(f"index map {path} cannot be read ({error})",
                        "delete it: the next start builds it again") from None


def _save_built(path: str, build, what: str = "") -> Exception | None:
    """Builds and saves the array at `path`; None, or what stopped it (the partial file removed)."""
    partial = Path(f"{path}.partial-{socket.gethostname()}-{os.getpid()}.npy")
    said = []  # the building line, once printing it began
    notice = threading.Timer(BUILD_NOTICE_S, lambda: said.append(1) or print(f"building {what} ...", flush=True))
    if what:
        notice.start()
    started = time.perf_counter()
    try:
        partial.parent.mkdir(parents=True, exist_ok=True)
        array = build()
        with open(partial, "wb") as file:  # open until renamed: clean_index_maps.py tells a live build by that
            np.save(file, array, allow_pickle=False)
            file.flush()
            os.replace(partial, path)
        notice.cancel()
        if what:
            notice.join()  # a building line already begun comes out before its end
        if said:  # the building line was printed: its end too
            print(f"built {what} in {time.perf_counter() - started:.1f} s "
                  f"({index_maps.size_text(os.path.getsize(path))})", flush=True)
    except Exception as error:
        return error
    finally:  # also when a signal stops the start-up (errors.Interrupted)
        notice.cancel()
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
    return None


def _failure_text(path: str, failure: Exception | None) -> tuple[str, str] | None:
    """(what went wrong, its fix), or None."""
    if failure is None:
        return None
    where = f"{Path(path).parent} on {socket.gethostname()}"
    if isinstance(failure, FileNotFoundError) and ".partial-" in str(failure.filename) and Path(path).parent.is_dir():
        return (f"index map {Path(path).name}: its partial file {Path(failure.filename).name} was removed from {where} "
                "while it was built (by clean_index_maps.py, or a preprocess_data.py of this data meanwhile)",
                "rerun: the next start builds it again; clean index maps only while no run on this data starts")
    if isinstance(failure, OSError):
        return (f"index map {Path(path).name} cannot be written to {where} ({failure.strerror or failure})",
                "pass --data-cache-path DIR, a folder every rank can write, to keep the index maps apart from the "
                "data (Megatron's flag; the data is only read)")
    return (f"building index map {Path(path).name} for {where} failed ({type(failure).__name__}: {failure})",
            "see the traceback of the rank that built it (a corrupt .idx? preprocess again)")


def samples_mapping(indexed, prefix: str, name: str, first_doc: int, end_doc: int, max_num_samples: int,
                    max_tokens: int, short_seq_prob: float, seed: int, binary_head: bool) -> np.ndarray:
    """[n, 4] rows (first sentence, end sentence, target tokens, epoch) over documents
    [first_doc, end_doc), built once and cached (arguments: mapping_path's, after `indexed`; an
    error names the data by indexed.prefix, the --data-path the user knows, not the maps' prefix)."""
    path = mapping_path(prefix, name, first_doc, end_doc, max_num_samples, max_tokens, short_seq_prob, seed,
                        binary_head)
    min_num_sent, long_sentence_len = skip_rule(max_tokens, binary_head)

    def build():
        docs = np.ascontiguousarray(indexed.doc_idx[first_doc:end_doc + 1], dtype=np.int64)
        return helpers.build_mapping(docs, indexed.sizes, 2**31 - 1, max_num_samples, max_tokens, short_seq_prob,
                                     seed, min_num_sent=min_num_sent, long_sentence_len=long_sentence_len)

    mapping = cached_array(path, build, f"{name} index map ({max_num_samples} samples over {end_doc - first_doc} "
                                        "documents)")
    if len(mapping) == 0:
        raise DataError(f"{indexed.prefix}: the {name} split yields no BERT samples (documents need "
                        f"{min_num_sent}+ sentences of at most {long_sentence_len} tokens)",
                        "preprocess with --split-sentences, or give this split more documents with --split")
    return mapping


def skip_rule(max_tokens: int, binary_head: bool) -> tuple[int, int]:
    """(min_num_sent, long_sentence_len): build_mapping leaves out a document of fewer sentences, or with
    a longer one, for samples of max_tokens tokens (less the special ones); _warn_skipped counts them."""
    return (2 if binary_head else 1), max(LONG_SENTENCE_LEN, max_tokens)


@dataclass(frozen=True)
class SkippedDocuments:
    """What build_mapping leaves out of a prefix: documents (and their tokens) with fewer sentences
    than a sample needs, and the others with a sentence over the limit."""
    tokens: int
    few_sentences: tuple  # (documents, tokens)
    long_sentence: tuple  # (documents, tokens)
    sentence_level: bool = True  # some document holds several sentences: the corpus was split into them
    largest: tuple = (0, 0)  # (document, tokens) of the largest one left out

    @property
    def share(self) -> float:
        return (self.few_sentences[1] + self.long_sentence[1]) / max(1, self.tokens)


def document_tokens(indexed, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per document between the doc_idx entries `docs`: its sentence count, and for the non-empty ones
    their tokens and longest sentence, by a reduceat per document (no copy of the sizes, no loop over
    documents). Empty documents are left out of the sums: reduceat needs starts inside the sizes."""
    docs = np.asarray(docs, dtype=np.int64)
    counts = np.diff(docs)
    sizes = indexed.sizes[docs[0]:docs[-1]]
    starts = docs[:-1][counts > 0] - docs[0]
    if not len(starts):
        return counts, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return counts, np.add.reduceat(sizes, starts, dtype=np.int64), np.maximum.reduceat(sizes, starts)


def skipped_documents(indexed, min_num_sent: int, long_sentence_len: int) -> SkippedDocuments:
    """build_mapping's skip rule (helpers.cpp) over every document of `indexed`."""
    counts, tokens, longest = document_tokens(indexed, indexed.doc_idx)
    few = counts[counts > 0] < min_num_sent
    long = ~few & (longest > long_sentence_len)
    left_out = np.where(few | long, tokens, -1)
    largest = (int(np.flatnonzero(counts > 0)[left_out.argmax()]), int(left_out.max())) if left_out.size else (0, 0)
    return SkippedDocuments(int(tokens.sum()), (int(few.sum()), int(tokens[few].sum())),
                            (int(long.sum()), int(tokens[long].sum())), bool((counts > 1).any()), largest)


def skipped_warning(prefix: str, skipped: SkippedDocuments, long_sentence_len: int, packed: bool) -> str | None:
    """The start-up warning when build_mapping leaves a notable share of a prefix's tokens unread, else
    None. A corpus not split into sentences (every document one "sentence") wants --split-sentences;
    one that was split loses documents of one sentence (no pair for the sentence-order head) or with
    text the splitter cannot cut (code, tables, lists without sentence punctuation), where splitting
    again does not help."""
    if skipped.share < SKIPPED_SHARE_WARNED:
        return None
    few, long = skipped.few_sentences[0], skipped.long_sentence[0]  # no few without the sentence-order head
    reasons = [f"{count} document{' has' if count == 1 else 's have'} one sentence" for count in (few,) if count] + [
        f"{count} document{'' if count == 1 else 's'} hold{'s' if count == 1 else ''} a sentence over "
        f"{long_sentence_len} tokens" for count in (long,) if count]
    document, tokens = skipped.largest
    # at least: build_mapping also leaves out a document's last sentences too few for a sample, not counted
    found = (f"at least {skipped.share:.0%} of the {skipped.tokens} tokens of {prefix} lie in documents the BERT "
             f"sampler skips{', packed or not' if packed else ''} ({'; '.join(reasons)}; the largest: document "
             f"{document}, {tokens} tokens)")
    if not skipped.sentence_level:
        return f"{found}: check the sentence splitting (preprocess with --split-sentences and the corpus's --lang)"
    fixes = ["--bert-no-binary-head trains on documents of one sentence"] if few else []
    if long:
        fixes.append(f"a sentence over {long_sentence_len} tokens is text the splitter could not cut (code, tables, "
                     "lists): cut it into shorter sentences before preprocessing, or raise --seq-length above it")
    return f"{found}: {'; '.join(fixes)}"


class BertDataset(torch.utils.data.Dataset):
    """Samples of one split of one indexed dataset, one segment each (of at most seq_length
    tokens); item i is a dict of numpy arrays (bert_sample.pack)."""

    def __init__(self, name: str, indexed, prefix: str, doc_range: tuple, max_num_samples: int, seq_length: int,
                 tokenizer, masked_lm_prob: float = 0.15, short_seq_prob: float = 0.1, seed: int = 1234,
                 binary_head: bool = True, whole_word_masking: bool = False):
        self.indexed = indexed
        self.seq_length = seq_length
        self.masked_lm_prob = masked_lm_prob
        self.seed = seed
        self.binary_head = binary_head
        specials = 3 if binary_head else 2
        self.mapping_settings = (prefix, name, *doc_range, max_num_samples, seq_length - specials, short_seq_prob,
                                 seed, binary_head)
        self.mapping = samples_mapping(indexed, *self.mapping_settings)
        self.ids = SpecialIds(cls=tokenizer.cls, sep=tokenizer.sep, mask=tokenizer.mask, pad=tokenizer.pad)
        reserved = tokenizer.reserved_ids()
        self.random_ids = np.array([i for i in range(tokenizer.vocab_size) if i not in reserved])
        self.words = word_marks(tokenizer) if whole_word_masking else None
        self.rng = np.random.RandomState(seed)  # reseeded per segment: about 1/100 of the cost of a new one

    def __len__(self) -> int:
        return len(self.mapping)

    def map_files(self) -> list[str]:
        return [mapping_path(*self.mapping_settings)]

    def segment(self, idx: int) -> dict:
        """Segment idx of the mapping, unpadded; its randomness is keyed by idx alone, so it is the
        same whether it fills a sample alone or sits in a packed one. Reseeding the dataset's one
        RandomState gives the stream a new RandomState(seed + idx) would (DataLoader workers each
        hold a copy of the dataset; threads sharing one must not build segments at once)."""
        first, end, target = (int(v) for v in self.mapping[idx, :3])
        sentences = [self.indexed[i].astype(np.int64) for i in range(first, end)]
        self.rng.seed((self.seed + idx) % 2**32)
        return build_segment(sentences, target, self.seq_length, self.ids, self.random_ids, self.masked_lm_prob,
                             self.rng, self.binary_head, self.words)

    def __getitem__(self, idx: int) -> dict:
        return pack([self.segment(idx)], self.seq_length, self.ids.pad)

    def segment_lengths(self, indices=None) -> np.ndarray:
        """Tokens (specials included) of the segments `indices` (default: all), from the mapping alone."""
        rows = np.ascontiguousarray(self.mapping if indices is None else self.mapping[np.asarray(indices)])
        spans = helpers.span_tokens(rows, self.indexed.sizes)
        return segment_length(spans, rows[:, 2], self.seq_length, self.binary_head)


def packmap_path(mapping_settings: tuple, seq_length: int, window: int) -> str:
    """The packed mapping's file: the segment mapping's name (all its settings) plus the packing's."""
    return mapping_path(*mapping_settings).replace("_indexmap_", "_packmap_")[:-len(".npy")] + \
        f"_{seq_length}sl_{window}w.npy"


class PackedBertDataset(torch.utils.data.Dataset):
    """Samples of seq_length tokens, each holding segments of `segments` (a BertDataset whose
    seq_length is the longest segment) back to back, then padding. Item i concatenates segments
    built exactly as segments[j] builds them alone (same tokens, masking, sentence order), with
    segment_ids 1..k and positions restarting at each [CLS].

    The packing is cached as one int64 array [n, offsets[0..n], indices...]: sample i holds the
    segment indices indices[offsets[i]:offsets[i + 1]]. Every segment is used once."""

    def __init__(self, segments: BertDataset, seq_length: int, window: int = PACK_WINDOW):
        if segments.seq_length > seq_length:
            raise ConfigError(f"segments of up to {segments.seq_length} tokens do not fit samples of {seq_length}",
                              "lower --max-segment-length to at most --seq-length")
        self.segments = segments
        self.seq_length = seq_length
        self.path = path = packmap_path(segments.mapping_settings, seq_length, window)

        def build():
            return pack_epochs(segments.mapping[:, 3], segments.segment_lengths(), seq_length, segments.seed, window)

        packmap = cached_array(path, build, f"{segments.mapping_settings[1]} pack map ({len(segments)} segments into "
                                            f"{seq_length}-token samples)")
        num_samples = int(packmap[0])
        self.offsets = packmap[1:num_samples + 2]
        self.indices = packmap[num_samples + 2:]
        if len(self.indices) != len(segments):
            raise DataError(f"{path} packs {len(self.indices)} segments, the mapping has {len(segments)}",
                            "delete the file to rebuild it")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def map_files(self) -> list[str]:
        return self.segments.map_files() + [self.path]

    def segment_indices(self, idx: int) -> np.ndarray:
        return self.indices[self.offsets[idx]:self.offsets[idx + 1]]

    def __getitem__(self, idx: int) -> dict:
        return pack([self.segments.segment(int(j)) for j in self.segment_indices(idx)], self.seq_length,
                    self.segments.ids.pad)


def pack_epochs(epochs: np.ndarray, lengths: np.ndarray, seq_length: int, seed: int, window: int) -> np.ndarray:
    """The packing of a segment mapping, epoch by epoch (epoch e with its own stream, seed + 2 + e), as
    [n, offsets[0..n], indices...]: the packing of more epochs starts with the packing of fewer."""
    starts = np.flatnonzero(np.diff(epochs, prepend=-1))
    offsets, indices = [np.zeros(1, dtype=np.int64)], []
    for start, stop in zip(starts, [*starts[1:], len(epochs)]):
        epoch_offsets, epoch_indices = helpers.pack_segments(lengths[start:stop], seq_length,
                                                             (seed + 2 + int(epochs[start])) % 2**32, window)
        offsets.append(epoch_offsets[1:] + start)
        indices.append(epoch_indices + start)
    return np.concatenate([[sum(len(part) for part in offsets) - 1], *offsets, *indices])


def packed_dataset(name: str, indexed, prefix: str, doc_range: tuple, num_samples: int, seq_length: int,
                   max_segment_length: int, tokenizer, window: int = PACK_WINDOW, **options) -> PackedBertDataset:
    """At least num_samples packed samples: the segment mapping is sized from the documents' mean
    segment length, and grown (deterministically, the same on every rank) if the packing falls short."""
    binary_head = options.get("binary_head", True)
    num_segments = estimated_segments(indexed, doc_range, num_samples, seq_length, max_segment_length, binary_head)
    while True:
        segments = BertDataset(name, indexed, prefix, doc_range, num_segments, max_segment_length, tokenizer, **options)
        packed = PackedBertDataset(segments, seq_length, window)
        if len(packed) >= num_samples:
            return packed
        num_segments = math.ceil(len(segments) * num_samples / len(packed) * 1.05) + 1


def estimated_segments(indexed, doc_range: tuple, num_samples: int, seq_length: int, max_segment_length: int,
                       binary_head: bool) -> int:
    """Segments that fill num_samples samples of seq_length tokens (with a 10% margin), from the mean
    segment length: a document of t tokens splits into about ceil(t / room) segments."""
    _, tokens, _ = document_tokens(indexed, indexed.doc_idx[doc_range[0]:doc_range[1] + 1])
    specials = 3 if binary_head else 2
    pieces = np.ceil(tokens / (max_segment_length - specials)).sum()
    mean_length = tokens.sum() / pieces + specials if pieces else max_segment_length
    return max(num_samples, math.ceil(num_samples * seq_length / mean_length * 1.1)) + 1


@dataclass(frozen=True)
class TokenStats:
    samples: int
    seq_length: int
    packed: bool
    segments_per_sample: float
    real_token_share: float  # non-padding tokens / all tokens
    epoch_samples: int = 0  # of one pass over the split's documents (the mapping's first epoch)
    prefix_epochs: tuple = ()  # a blend's (share of its samples, epoch_samples) per --data-path prefix

    def describe(self, name: str) -> str:
        """The split's distinct samples (one pass over its documents), as the evaluation warning counts them
        (run_data.with_eval_passes), and the index map's size where the run's steps repeat them."""
        distinct = self.epoch_samples or self.samples
        passes = self.samples / distinct
        mapped = (f" (its index map repeats them to {self.samples}: {passes:.{1 if passes < 10 else 0}f} passes)"
                  if self.samples > distinct else "")
        return (f"{name} data: {distinct} {'packed ' if self.packed else ''}samples of {self.seq_length} tokens"
                f"{mapped}, {self.segments_per_sample:.1f} segments per sample, real-token share "
                f"{self.real_token_share:.2f}")


def token_stats(dataset, max_samples: int = 100_000) -> TokenStats:
    """Segments per sample and the real-token share of a dataset (BertDataset, PackedBertDataset,
    or a blend of them) from the mappings alone, no sample built: over its first max_samples
    samples (the order is shuffled, so they stand for the rest), to keep start-up short."""
    if isinstance(dataset, BlendableDataset):
        parts = [token_stats(d, max_samples) for d in dataset.datasets]
        counts = np.bincount(dataset.dataset_index, minlength=len(parts))
        weights = counts / max(1, counts.sum())
        return TokenStats(len(dataset), parts[0].seq_length, any(p.packed for p in parts),
                          float(sum(w * p.segments_per_sample for w, p in zip(weights, parts))),
                          float(sum(w * p.real_token_share for w, p in zip(weights, parts))),
                          sum(p.epoch_samples for p in parts),
                          tuple((float(w), p.epoch_samples) for w, p in zip(weights, parts)))
    count = min(len(dataset), max_samples)
    if isinstance(dataset, PackedBertDataset):
        used = np.asarray(dataset.indices[:dataset.offsets[count]])
        real = float(dataset.segments.segment_lengths(used).sum())
        first_segments = np.asarray(dataset.indices)[np.asarray(dataset.offsets[:-1])]  # a sample never mixes epochs
        return TokenStats(len(dataset), dataset.seq_length, True, len(used) / count,
                          real / (count * dataset.seq_length),
                          int((dataset.segments.mapping[first_segments, 3] == 0).sum()))
    real = float(dataset.segment_lengths(np.arange(count)).sum())
    return TokenStats(len(dataset), dataset.seq_length, False, 1.0, real / (count * dataset.seq_length),
                      int((dataset.mapping[:, 3] == 0).sum()))


def split_tokens(dataset) -> int:
    """Tokens (specials included) of one pass over a split's documents: the segments of the mapping's
    first epoch (a small split's samples repeat them, epoch after epoch, to fill the samples asked for)."""
    if isinstance(dataset, BlendableDataset):
        return sum(split_tokens(part) for part in dataset.datasets)
    segments = dataset.segments if isinstance(dataset, PackedBertDataset) else dataset
    return int(segments.segment_lengths(np.flatnonzero(segments.mapping[:, 3] == 0)).sum())


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
    named = [os.path.normpath(prefix) for prefix in data_path[1::2]]
    if twice := next((prefix for i, prefix in enumerate(named) if prefix in named[:i]), None):
        raise ConfigError(f"--data-path names {twice} twice", "pass each prefix once, with the sum of its weights")
    return [w / sum(weights) for w in weights], list(data_path[1::2])


def build_train_valid_test_datasets(data_path: list[str], data_impl: str, split: str, num_samples: tuple,
                                    seq_length: int, tokenizer, cache_path: str | None = None,
                                    **sample_options) -> list:
    """[train, valid, test] (None where a split has no documents or no samples are asked for);
    several prefixes are blended by weight; the index maps are cached next to the data or in
    cache_path (--data-cache-path). sample_options go to BertDataset, except
    pack_samples (True: PackedBertDataset samples of seq_length tokens; num_samples then counts
    packed samples) and max_segment_length (the longest segment when packed; default seq_length)."""
    weights, prefixes = parse_data_path(data_path)
    per_prefix = [_split_datasets(prefix, data_impl, split,
                                  [math.ceil(w * n * 1.005) + 1 if n else 0 for n in num_samples],
                                  seq_length, tokenizer, cache_path, sample_options)
                  for w, prefix in zip(weights, prefixes)]
    if len(prefixes) == 1:
        return per_prefix[0]
    blended = []
    for s, n in enumerate(num_samples):
        parts = [(w, datasets[s]) for w, datasets in zip(weights, per_prefix) if datasets[s] is not None and w > 0]
        blended.append(BlendableDataset([d for _, d in parts], [w for w, _ in parts], n) if parts and n else None)
    return blended


def _split_datasets(prefix, data_impl, split, num_samples, seq_length, tokenizer, cache_path, sample_options) -> list:
    options = dict(sample_options)
    pack_samples = options.pop("pack_samples", False)
    max_segment_length = options.pop("max_segment_length", None) or seq_length
    indexed = make_dataset(prefix, data_impl)
    maps = index_maps.maps_prefix(prefix, cache_path=cache_path)
    bounds = split_boundaries(split, len(indexed.doc_idx) - 1)
    datasets = []
    for s, name in enumerate(SPLIT_NAMES):
        if bounds[s + 1] <= bounds[s] or not num_samples[s]:
            datasets.append(None)
        elif pack_samples:
            datasets.append(packed_dataset(name, indexed, maps, (bounds[s], bounds[s + 1]), num_samples[s],
                                           seq_length, max_segment_length, tokenizer, **options))
        else:
            datasets.append(BertDataset(name, indexed, maps, (bounds[s], bounds[s + 1]), num_samples[s], seq_length,
                                        tokenizer, **options))
    _warn_skipped(prefix, indexed, (max_segment_length if pack_samples else seq_length),
                  options.get("binary_head", True), pack_samples)
    return datasets


def _warn_skipped(prefix: str, indexed, segment_length: int, binary_head: bool, packed: bool) -> None:
    """Prints skipped_warning's line, once (the first rank, which alone reads every sentence's size for it),
    with samples_mapping's settings."""
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    min_num_sent, long_sentence_len = skip_rule(segment_length - (3 if binary_head else 2), binary_head)
    warning = skipped_warning(prefix, skipped_documents(indexed, min_num_sent, long_sentence_len), long_sentence_len,
                              packed)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
