"""Which samples each data-parallel rank reads, and how a list of samples becomes a BertBatch.

Every seq rank of one data rank reads the same micro-batch and then keeps its sequence chunk
(`BertBatch.sequence_chunk`), so the sampler depends on the data coordinates only.
"""
import numpy as np
import torch

from megatron.data.batch import BertBatch
from megatron.errors import ConfigError, ignore_stop_signals_in_child, stop_signals_blocked_for_children


class PretrainingSampler:
    """Micro-batches of sample indices for one data rank, in order, from `consumed_samples` on:
    the global batch of step k is samples [k * m * D, (k + 1) * m * D), so resuming with the
    consumed count continues exactly where the run stopped, whatever the data degree D. A last
    incomplete global batch is dropped, so every rank takes the same number of steps.
    `micro_batches` caps how many are given (a DataLoader's workers build no more than are read)."""

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int, micro_batches: int | None = None):
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ConfigError(f"data-parallel rank {data_parallel_rank} is outside size {data_parallel_size}",
                              "pass the rank from megatron.parallel.state")
        if micro_batch_size < 1:
            raise ConfigError(f"--micro-batch-size {micro_batch_size} must be >= 1", "pass a positive micro-batch size")
        if not 0 <= consumed_samples <= total_samples:
            raise ConfigError(f"consumed samples {consumed_samples} exceed the {total_samples} samples of the dataset",
                              "resume with a larger --train-samples or a matching checkpoint")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.rank = data_parallel_rank
        self.global_micro = micro_batch_size * data_parallel_size
        self.micro_batches = micro_batches

    def __len__(self) -> int:
        available = (self.total_samples - self.consumed_samples) // self.global_micro
        return available if self.micro_batches is None else min(available, self.micro_batches)

    def __iter__(self):
        for step in range(len(self)):
            start = self.consumed_samples + step * self.global_micro + self.rank * self.micro_batch_size
            yield list(range(start, start + self.micro_batch_size))


def collate_bert(samples: list[dict]) -> BertBatch:
    """BertDataset items -> one BertBatch ([b, s] tensors)."""
    stacked = {key: torch.from_numpy(np.stack([sample[key] for sample in samples])) for key in samples[0]}
    return BertBatch(**stacked)


def micro_batches(dataset, sampler: PretrainingSampler, num_workers: int, pin_memory: bool):
    """The sampler's micro-batches of `dataset` as BertBatches, in its order. With num_workers > 0,
    that many processes build them (two micro-batches ahead each) while the steps run; 0 builds each
    in this process when it is read. The loader draws its workers' seeds from a generator of its
    own, not torch's global one (dropout's): a run's numbers do not depend on num_workers.

    A worker's ConfigError/DataError, or OSError naming a file, reaches the rank as itself (one line,
    as with 0 workers), not as torch's exception of two tracebacks; closing the generator, or an error,
    ends the workers."""
    with stop_signals_blocked_for_children():  # the workers fork here
        loader = iter(torch.utils.data.DataLoader(
            _ItemsOrError(dataset) if num_workers else dataset, batch_sampler=sampler,
            collate_fn=_collate_or_error if num_workers else collate_bert, num_workers=num_workers,
            pin_memory=pin_memory, worker_init_fn=ignore_stop_signals if num_workers else None,
            generator=torch.Generator()))
    try:
        for batch in loader:
            if isinstance(batch, WorkerError):
                raise batch.error
            yield batch
    finally:
        if num_workers:  # an error's traceback holds the loader, whose workers would then outlive the rank's exit
            _end_workers(loader)


def _end_workers(loader) -> None:
    """Torch asks the workers to leave, waits 5 s for each, and then terminate()s one still busy (in a
    stuck read): SIGTERM, which workers ignore. So one still alive is killed."""
    loader._shutdown_workers()
    for worker in loader._workers:
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=10)  # one in an uninterruptible read (a hung mount) dies when it returns


class WorkerError:
    """A worker's ConfigError or OSError, sent to the rank as data: torch's loader rebuilds a worker's
    exception from its type and one message, which a two-part ConfigError cannot be built from and
    which loses an OSError's filename (what makes it the rank's one line)."""

    def __init__(self, error: ConfigError | OSError):
        self.error = error


class _ItemsOrError(torch.utils.data.Dataset):
    """`dataset`'s items, or the WorkerError of the one that raised a ConfigError or an OSError naming a
    file; any other error keeps torch's way, with the worker's traceback."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int):
        try:
            return self.dataset[idx]
        except ConfigError as error:
            return WorkerError(error)
        except OSError as error:
            if error.filename is None:
                raise
            return WorkerError(error)


def _collate_or_error(samples: list):
    return next((sample for sample in samples if isinstance(sample, WorkerError)), None) or collate_bert(samples)


def ignore_stop_signals(worker_id: int) -> None:
    """A worker leaves Ctrl-C and SIGTERM (sent to the whole process group) to the rank: the rank
    agrees the stop with its peers and saves, reading batches until then, then ends its workers."""
    ignore_stop_signals_in_child()
