"""In-memory image datasets, labels of any dataset, and subsets for fast runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

__all__ = ["ImageTensorDataset", "labels_of", "subset", "DataFileError"]


class DataFileError(ValueError):
    """A data file is missing, damaged, unsafe or not in the expected layout."""


class ImageTensorDataset(Dataset):
    """Images held in memory (uint8 or float) with integer labels.

    Items are ``(image, label)``: a float image ``(C, H, W)`` in [0, 1] (uint8 images are
    divided by 255) passed through ``transform`` if given, and an ``int`` label.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor | Sequence[int],
        *,
        transform: Callable[[Tensor], Tensor] | None = None,
        classes: Sequence[str] | None = None,
    ) -> None:
        labels = torch.as_tensor(labels, dtype=torch.long)
        if images.dim() != 4 or len(images) != len(labels):
            raise ValueError(
                f"expected images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and "
                f"{tuple(labels.shape)}"
            )
        if images.dtype != torch.uint8 and not images.is_floating_point():
            raise ValueError(f"images must be uint8 or floating point, got {images.dtype}")
        self.images = images
        self.targets = labels
        self.transform = transform
        self.classes = list(classes) if classes is not None else None

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        x = self.images[index]
        x = x.float().div_(255) if x.dtype == torch.uint8 else x
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.targets[index])

    @property
    def num_classes(self) -> int:
        """Number of classes (from ``classes`` or the largest label)."""
        return len(self.classes) if self.classes else int(self.targets.max()) + 1


def labels_of(dataset: Dataset) -> Tensor:
    """All labels of a dataset as a LongTensor, without loading images where possible."""
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets, dtype=torch.long)
    if isinstance(dataset, Subset):
        return labels_of(dataset.dataset)[torch.as_tensor(dataset.indices, dtype=torch.long)]
    if isinstance(dataset, TensorDataset):
        return dataset.tensors[1].long()
    if isinstance(dataset, ConcatDataset):
        return torch.cat([labels_of(d) for d in dataset.datasets])
    inner = getattr(dataset, "dataset", None)
    if isinstance(inner, Dataset) and len(inner) == len(dataset):  # type: ignore[arg-type]
        return labels_of(inner)  # wrappers that keep the order (markers, ...)
    return torch.tensor([int(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]


def subset(
    dataset: Dataset,
    n: int | None = None,
    *,
    per_class: int | None = None,
    seed: int = 0,
) -> Dataset:
    """A seeded random subset: at most ``per_class`` items of each class, then at most ``n``.

    The choice depends only on ``seed`` and the labels; the order is shuffled.
    """
    if n is None and per_class is None:
        return dataset
    for name, v in (("n", n), ("per_class", per_class)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be a positive number, got {v}")
    g = torch.Generator().manual_seed(seed)
    total = len(dataset)  # type: ignore[arg-type]
    order = torch.randperm(total, generator=g)
    if per_class is not None:
        labels = labels_of(dataset)[order]
        keep = torch.zeros(total, dtype=torch.bool)
        for c in labels.unique():
            where = (labels == c).nonzero().flatten()[:per_class]
            keep[where] = True
        order = order[keep]
    if n is not None:
        order = order[:n]
    return Subset(dataset, order.tolist())

