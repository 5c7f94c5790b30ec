"""CIFAR-10 from its standard python layout, read without running pickled code."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .safe_pickle import safe_load
from .tensors import DataFileError, ImageTensorDataset

__all__ = ["cifar10", "download_cifar10", "CIFAR10_CLASSES"]

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
_FOLDER = "cifar-10-batches-py"
_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
_TEST = ["test_batch"]


def _folder(root: Path) -> Path:
    for cand in (root / _FOLDER, root):
        if (cand / "test_batch").is_file() or (cand / "data_batch_1").is_file():
            return cand
    raise DataFileError(
        f"No CIFAR-10 batches under {str(root)!r}: expected {str(root / _FOLDER)!r} with "
        "data_batch_1..5 and test_batch (the layout torchvision downloads). Pass the folder "
        "that contains cifar-10-batches-py, or download=True where a network is available."
    )


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = safe_load(path)
    if not isinstance(batch, dict):
        raise DataFileError(f"{str(path)!r} is not a CIFAR batch (expected a dict).")
    batch = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in batch.items()}
    data, labels = batch.get("data"), batch.get("labels", batch.get("fine_labels"))
    if not isinstance(data, np.ndarray) or labels is None:
        raise DataFileError(f"{str(path)!r} is not a CIFAR batch (no 'data' and 'labels').")
    labels = np.asarray(labels, dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataFileError(
            f"{str(path)!r}: expected uint8 data of shape (N, 3072), got {data.dtype} {data.shape}."
        )
    if len(labels) != len(data) or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise DataFileError(f"{str(path)!r}: labels do not match the images or are not 0-9.")
    return data.reshape(-1, 3, 32, 32), labels


def cifar10(
    root: str | os.PathLike,
    train: bool = True,
    *,
    transform: Callable[[Tensor], Tensor] | None = None,
    download: bool = False,
) -> ImageTensorDataset:
    """CIFAR-10 (50,000 train or 10,000 test images) as float images ``(3, 32, 32)`` in [0, 1].

    ``root`` is the folder holding ``cifar-10-batches-py/`` (or that folder itself). The
    batches are read with a restricted unpickler: a file that tries to run code is refused.
    ``download=True`` fetches the archive first when it is missing (needs a network).
    """
    root = Path(root)
    if download and not (root / _FOLDER / "test_batch").is_file():
        download_cifar10(root)
    folder = _folder(root)
    names = _TRAIN if train else _TEST
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataFileError(f"CIFAR-10 files missing in {str(folder)!r}: {', '.join(missing)}")
    parts = [_read_batch(folder / n) for n in names]
    images = torch.from_numpy(np.concatenate([p[0] for p in parts]))
    labels = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    return ImageTensorDataset(images, labels, transform=transform, classes=CIFAR10_CLASSES)


def download_cifar10(root: str | os.PathLike) -> Path:
    """Download and extract the CIFAR-10 python archive into ``root`` (checks its MD5)."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import download_and_extract_archive

    root = Path(root)
    download_and_extract_archive(
        CIFAR10.url, str(root), filename=CIFAR10.filename, md5=CIFAR10.tgz_md5
    )
    return root / _FOLDER
