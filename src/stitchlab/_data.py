"""Turning what users pass as data into a Dataset of ``(image, label)`` pairs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

__all__ = [
    "as_dataset",
    "is_deterministic",
    "loader",
    "predict",
    "DataLike",
    "DataError",
    "check_images",
    "check_labels",
    "PairedImages",
    "triples",
]

DataLike = Dataset | DataLoader | tuple[Tensor, Tensor] | list


class DataError(ValueError):
    """Data that stitchlab cannot use correctly (NaN pixels, bad labels, wrong dtype)."""


def check_images(x: Tensor, what: str = "data", offset: int = 0) -> None:
    """Refuse a batch of images that is empty, not float32 or has a NaN or infinite pixel."""
    if x.dim() and len(x) == 0:
        raise DataError(f"{what}: there are no images (the dataset is empty).")
    if x.dtype != torch.float32:
        hint = (
            "Convert uint8 images with images.float() / 255."
            if not x.is_floating_point()
            else "Convert them with images.float() (models run in float32; use a "
            "recipe's amp option for mixed precision)."
        )
        raise DataError(f"{what}: images must be float32, got {x.dtype}. {hint}")
    finite = torch.isfinite(x.reshape(len(x), -1)).all(dim=1) if x.dim() else torch.isfinite(x)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten()[:5].tolist()
        raise DataError(
            f"{what}: image(s) {[offset + i for i in bad]} contain NaN or infinite values; "
            "remove or repair them (stitchlab never trains or scores on them)."
        )


def check_labels(y: Tensor, what: str = "data", num_classes: int | None = None) -> None:
    """Refuse labels that are not integers >= 0 (and < ``num_classes`` when given)."""
    if y.is_floating_point() or y.dtype == torch.bool or y.is_complex():
        raise DataError(
            f"{what}: labels must be integers (class indices), got {y.dtype}; float labels "
            "would be truncated. Convert them with labels.long() if they are whole numbers."
        )
    if y.numel() and int(y.min()) < 0:
        raise DataError(f"{what}: labels must be >= 0, found {int(y.min())}.")
    if num_classes is not None and y.numel() and int(y.max()) >= num_classes:
        raise DataError(
            f"{what}: label {int(y.max())} is outside 0..{num_classes - 1}, the classes of "
            f"the model's {num_classes} outputs; check the labels or the model's num_classes."
        )


def as_dataset(data: DataLike, what: str = "data") -> tuple[Dataset, int | None]:
    """``(dataset, batch size of a given DataLoader or None)``; checks the first item."""
    batch_size = None
    if isinstance(data, DataLoader):
        batch_size = data.batch_size
        data = data.dataset
    if (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and all(isinstance(t, Tensor) for t in data)
    ):
        images, labels = data
        if images.dim() < 2 or labels.dim() != 1 or len(images) != len(labels):
            raise ValueError(
                f"{what}: expected (images (N, ...), labels (N,)), got shapes "
                f"{tuple(images.shape)} and {tuple(labels.shape)}."
            )
        check_images(images, what)
        check_labels(labels, what)
        data = TensorDataset(images, labels.long())
    if not isinstance(data, Dataset):
        raise TypeError(
            f"{what}: expected a Dataset, a DataLoader or a pair of tensors (images, labels); "
            f"got {type(data).__name__}."
        )
    try:
        n = len(data)  # type: ignore[arg-type]
    except TypeError as exc:
        raise TypeError(f"{what}: the dataset must have a length (map-style Dataset).") from exc
    if n == 0:
        raise ValueError(f"{what}: the dataset is empty.")
    first = data[0]
    if not (isinstance(first, (tuple, list)) and len(first) >= 2 and isinstance(first[0], Tensor)):
        raise ValueError(
            f"{what}: each item must be an (image tensor, label) pair; got {type(first).__name__}."
        )
    check_images(first[0][None], what)
    label = torch.as_tensor(first[1])
    if label.dim() != 0:
        raise DataError(
            f"{what}: each item's label must be one class index (a scalar), got a label of "
            f"shape {tuple(label.shape)}; return int(label) or label.squeeze() from the "
            "dataset (a label of shape (1,) would be scored against every prediction)."
        )
    check_labels(label, what)
    return data, batch_size


def check_training_items(dataset: Dataset, what: str = "stitching data") -> None:
    """Refuse items of more than two elements for stitch training, where a third element
    would be read as the back model's target images (only :class:`PairedImages` pairs
    them); elsewhere extra elements (an index, metadata) are ignored."""
    first = dataset[0]
    if len(first) > 2 and not isinstance(_innermost(dataset), PairedImages):
        raise DataError(
            f"{what}: stitch training takes (image, label) items, got {len(first)} elements; "
            "a third element would be read as the back model's target images. Return "
            "(image, label) items for stitching."
        )


def _innermost(dataset: Dataset) -> Dataset:
    """``dataset`` with :class:`torch.utils.data.Subset` wrappers removed."""
    from torch.utils.data import Subset

    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def is_deterministic(dataset: Dataset) -> bool:
    """False when reading the same items twice differs (random augmentation)."""
    if isinstance(dataset, TensorDataset):
        return True
    n = len(dataset)  # type: ignore[arg-type]
    for i in sorted({0, n // 2, n - 1}):
        a, b = dataset[i][0], dataset[i][0]
        if a.shape != b.shape or not torch.equal(a, b):
            return False
    return True


def loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
) -> DataLoader:
    """A DataLoader with a seeded shuffle. It always has its own generator: a DataLoader
    without one draws its workers' base seed from the global RNG on every pass."""
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=gen,
        num_workers=num_workers,
        collate_fn=_collate,
    )


def _collate(items: list) -> Any:
    """torch's default collation, with a clear error for images of different shapes."""
    from torch.utils.data import default_collate

    try:
        return default_collate(items)
    except RuntimeError:
        images = [it[0] for it in items if isinstance(it, (tuple, list))]
        shapes = sorted({tuple(x.shape) for x in images if isinstance(x, Tensor)})
        if len(shapes) > 1:
            raise DataError(
                f"data: the images differ in shape ({', '.join(map(str, shapes[:3]))}"
                f"{', ...' if len(shapes) > 3 else ''}); give images of one size (resize or "
                "crop them before stitching)."
            ) from None
        raise


def batches(
    dataset: Dataset, batch_size: int, device: torch.device, num_workers: int = 0
) -> Iterator[tuple[Tensor, Tensor]]:
    """Ordered ``(images, labels)`` batches on ``device``, each checked (float32, finite
    pixels, integer labels >= 0)."""
    offset = 0
    for x, y, *_ in loader(dataset, batch_size, num_workers=num_workers):
        y = torch.as_tensor(y)
        check_images(x, "data", offset)
        check_labels(y, "data")
        offset += len(x)
        yield x.to(device, non_blocking=True), y.to(device)


class PairedImages(Dataset):
    """Items ``(front image, label, target image)``: the stitched model's front sees the
    first image, the back model's targets are computed on the second (IRI variants)."""

    def __init__(self, front: Dataset, target: Dataset) -> None:
        if len(front) != len(target):  # type: ignore[arg-type]
            raise ValueError(
                f"paired data sets differ in length: {len(front)} and {len(target)}"  # type: ignore[arg-type]
            )
        self.front, self.target = front, target

    def __len__(self) -> int:
        return len(self.front)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        x, y = self.front[i][:2]
        return x, y, self.target[i][0]


def triples(
    dataset: Dataset, batch_size: int, device: torch.device, num_workers: int = 0
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Ordered ``(front images, labels, target images)`` batches; the target images are
    the front images unless the data set pairs them (:class:`PairedImages`)."""
    for item in loader(dataset, batch_size, num_workers=num_workers):
        yield _triple(item, device)


def _triple(item, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    y = torch.as_tensor(item[1])
    check_images(item[0])
    check_labels(y)
    x, y = item[0].to(device, non_blocking=True), y.to(device)
    if len(item) > 2:
        check_images(item[2], "target images")
    xt = item[2].to(device, non_blocking=True) if len(item) > 2 else x
    return x, y, xt


def check_options(cls: type, kwargs: dict, what: str) -> None:
    """Raise a TypeError listing the valid fields when ``kwargs`` names an unknown one."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise TypeError(f"Unknown {what} option(s) {unknown}; valid options: {sorted(names)}")


@torch.inference_mode()
def predict(
    model: torch.nn.Module, data: DataLike, *, batch_size: int = 256, device=None
) -> tuple[Tensor, Tensor]:
    """``(logits, labels)`` of ``model`` over ``data``, in the model's current mode.

    A model that returns a tuple or a dict gives its logits element (see
    :func:`stitchlab.splitting.select_logits`)."""
    from .splitting import select_logits

    dataset, _ = as_dataset(data)
    if device is None:
        device = _module_device(model)
    outs, labels = [], []
    for x, y in batches(dataset, batch_size, device):
        outs.append(select_logits(model(x), None, type(model).__name__).float().cpu())
        labels.append(y.cpu())
    return torch.cat(outs), torch.cat(labels)


def _module_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")
