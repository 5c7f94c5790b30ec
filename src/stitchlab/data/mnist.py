"""MNIST from its idx files, and the coloured MNIST variants of Smith et al. (2025)."""

from __future__ import annotations

import gzip
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .tensors import DataFileError, ImageTensorDataset

__all__ = ["mnist", "read_idx", "coloured_mnist", "ColouredMNIST", "download_mnist", "VARIANTS"]

_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an idx file (optionally gzip-compressed) into a numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataFileError(f"{str(path)!r} cannot be read ({exc}).") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise DataFileError(f"{str(path)!r} is not an idx file (bad magic number).")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataFileError(f"{str(path)!r} is truncated.")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    dtype = np.dtype(_DTYPES[raw[2]])
    count = int(np.prod(shape)) if shape else 0
    body = raw[4 + 4 * ndim :]
    if len(body) != count * dtype.itemsize:
        raise DataFileError(
            f"{str(path)!r}: header says shape {shape} ({count * dtype.itemsize} bytes) but the "
            f"file holds {len(body)} bytes; it is truncated or damaged."
        )
    return np.frombuffer(body, dtype=dtype).reshape(shape)


def _find(root: Path, name: str) -> Path:
    for folder in (root / "MNIST" / "raw", root / "raw", root):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise DataFileError(
        f"MNIST file {name}[.gz] not found under {str(root)!r} (looked in MNIST/raw, raw and "
        "the folder itself). Pass the folder that holds MNIST/raw, or download=True where a "
        "network is available."
    )


def _pad(images: Tensor, size: int) -> Tensor:
    h = images.shape[-1]
    if size == h:
        return images
    if size < h:
        raise ValueError(f"size must be at least {h}, got {size}")
    lo = (size - h) // 2
    return torch.nn.functional.pad(images, (lo, size - h - lo, lo, size - h - lo))


def mnist(
    root: str | os.PathLike,
    train: bool = True,
    *,
    channels: int = 1,
    size: int = 28,
    transform: Callable[[Tensor], Tensor] | None = None,
    download: bool = False,
) -> ImageTensorDataset:
    """MNIST (60,000 train or 10,000 test) as float images ``(channels, size, size)`` in [0, 1].

    Reads the idx files (``.gz`` or not) from ``root/MNIST/raw`` (torchvision's layout),
    ``root/raw`` or ``root``. ``channels=3`` repeats the grey plane; ``size=32`` pads the
    28x28 digits with black so that 32x32 models accept them.
    """
    root = Path(root)
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if download:
        try:
            _find(root, _FILES[train][0])
        except DataFileError:
            download_mnist(root)
    images = read_idx(_find(root, _FILES[train][0]))
    labels = read_idx(_find(root, _FILES[train][1]))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataFileError(
            f"MNIST files under {str(root)!r} do not match: images {images.shape}, labels "
            f"{labels.shape}."
        )
    x = _pad(torch.from_numpy(images.astype(np.uint8))[:, None], size)
    if channels == 3:
        x = x.expand(-1, 3, -1, -1)
    y = torch.from_numpy(labels.astype(np.int64))
    return ImageTensorDataset(x, y, transform=transform, classes=[str(i) for i in range(10)])


def download_mnist(root: str | os.PathLike) -> Path:
    """Download the four MNIST idx files into ``root/MNIST/raw`` (checks their MD5)."""
    from torchvision.datasets import MNIST
    from torchvision.datasets.utils import download_and_extract_archive

    raw = Path(root) / "MNIST" / "raw"
    for filename, md5 in MNIST.resources:
        for mirror in MNIST.mirrors:
            try:
                download_and_extract_archive(
                    f"{mirror}{filename}", str(raw), filename=filename, md5=md5
                )
                break
            except OSError:
                continue
        else:
            raise DataFileError(f"Could not download {filename} from any MNIST mirror.")
    return raw


#: The three coloured MNIST variants.
VARIANTS = ("digit", "correlated", "colour")


class ColouredMNIST(Dataset):
    """MNIST digits painted in one of 10 colours (Smith et al., 2025, "Functional Alignment
    Can Mislead").

    * ``digit``: the label is the digit; its colour is random (no label information).
    * ``correlated``: the label is the digit and the colour is the label's colour
      (both cues carry the label).
    * ``colour``: the label is a random colour class and the image shows a digit of any
      class in that colour (only the colour carries the label).

    The digit strokes are painted, the background stays black. The colours are
    :func:`stitchlab.data.markers.distinct_colours` (10). Colour draws depend only on
    ``seed`` and the split.
    """

    def __init__(
        self,
        digits: ImageTensorDataset,
        variant: str,
        *,
        seed: int = 0,
        train: bool = True,
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        from .markers import distinct_colours

        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        if digits.images.shape[1] != 1:
            raise ValueError("ColouredMNIST needs single-channel digits (mnist(..., channels=1))")
        self.digits = digits
        self.variant = variant
        self.transform = transform
        self.palette = distinct_colours(10)
        g = torch.Generator().manual_seed(2 * seed + (0 if train else 1))
        random_colour = torch.randint(0, 10, (len(digits),), generator=g)
        if variant == "correlated":
            self.colour_index = digits.targets.clone()
        else:
            self.colour_index = random_colour
        self.targets = self.colour_index.clone() if variant == "colour" else digits.targets
        self.digit_labels = digits.targets
        self.classes = [str(i) for i in range(10)] if variant != "colour" else None

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        grey = self.digits.images[index].float().div_(255)
        x = grey * self.palette[int(self.colour_index[index])][:, None, None]
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.targets[index])


def coloured_mnist(
    root: str | os.PathLike,
    variant: str = "correlated",
    train: bool = True,
    *,
    seed: int = 0,
    size: int = 32,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> ColouredMNIST:
    """Coloured MNIST: ``digit``, ``correlated`` or ``colour``, RGB ``size`` x ``size``."""
    return ColouredMNIST(
        mnist(root, train, size=size), variant, seed=seed, train=train, transform=transform
    )
