"""Several datasets mixed by weight: sample i comes from the dataset furthest behind its share."""
import numpy as np
import torch

from megatron.data import helpers


class BlendableDataset(torch.utils.data.Dataset):
    def __init__(self, datasets: list, weights: list[float], size: int):
        self.datasets = datasets
        weights = np.asarray(weights, dtype=np.float64)
        self.weights = weights / weights.sum()
        self.dataset_index, self.dataset_sample_index = helpers.build_blending_indices(self.weights, size)
        for d, dataset in enumerate(datasets):
            taken = self.dataset_sample_index[self.dataset_index == d]
            if len(taken) and taken.max() >= len(dataset):
                raise ValueError(f"blended dataset {d} has {len(dataset)} samples, {taken.max() + 1} needed")

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, idx: int):
        return self.datasets[self.dataset_index[idx]][int(self.dataset_sample_index[idx])]
