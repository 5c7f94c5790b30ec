"""What the readers of a researcher's own data share (:mod:`stitchlab.data.user`): the
options of a read, what a reader returns, image decoding with Pillow, seeded splits."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from .tensors import DataFileError

_ACCEPTED = (
    "Accepted: an image folder (ROOT/train/<class>/ with ROOT/test/<class>/ or ROOT/val/<class>/; "
    "ROOT/<class>/; or images directly in ROOT), a CIFAR-10 folder (cifar-10-batches-py), "
    "a .npz or .safetensors file (keys images or x [+ labels or y], or x_train and x_test "
    "[+ y_train and y_test]), or a Hugging Face datasets folder written by save_to_disk "
    "(state.json or dataset_dict.json). Speech: a folder of .wav files laid out like an "
    "image folder, or waveforms (N, T) in a .npz or .safetensors file (key waveforms, audio "
    "or x)."
)


_TEST_DIRS = ("test", "val")


_TEST_SPLITS = ("test", "validation", "valid", "val")


@dataclass(frozen=True)
class _Options:
    size: int | None
    test_fraction: float
    seed: int
    audio: bool = False
    sample_rate: int | None = None
    samples: int | None = None


@dataclass
class _Loaded:
    stitch: Dataset
    test: Dataset
    labelled: bool
    classes: tuple[str, ...] | None
    kind: str
    split: str
    image_size: tuple[int, int] | None  # None: decoded files, checked after subsetting
    audio: bool = False  # datasets of _Clips, read into waveforms after subsetting


def _resize_crop(x: Tensor, size: int) -> Tensor:
    from torchvision.transforms.v2 import functional as F

    return F.center_crop(F.resize(x, size, antialias=True), size).clamp_(0, 1)


def _resizer(size: int | None) -> Callable[[Tensor], Tensor] | None:
    return None if size is None else functools.partial(_resize_crop, size=size)


def _decode(img: Any, size: int | None) -> Tensor:
    """An RGB PIL image as a float ``(3, H, W)`` tensor in [0, 1], as ImageFolderDataset does."""
    from torchvision.transforms.v2 import functional as F

    x = F.pil_to_tensor(img)
    if size is not None:
        x = F.center_crop(F.resize(x, size, antialias=True), size)
    return x.float().div_(255)


def _read_rgb(source: Path | bytes, what: str) -> Any:
    """An image file or its bytes, decoded with Pillow and converted to RGB."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            if img.mode.startswith("I;16"):
                # Pillow's convert("RGB") clips 16-bit values at 255 (a white image): scale
                # the full 16-bit range to 8 bits instead
                import numpy as np

                level = np.asarray(img, dtype=np.float64) / 65535.0 * 255.0
                img8 = Image.fromarray(np.rint(level).astype(np.uint8), mode="L")
                return img8.convert("RGB")
            if img.mode in ("I", "F"):
                kind = "integer" if img.mode == "I" else "float"
                raise DataFileError(
                    f"Cannot read image {what}: it holds 32-bit {kind} pixels, whose range "
                    "stitchlab cannot know; save it as 8- or 16-bit (PNG, JPEG) or pass the "
                    "images as tensors in [0, 1]."
                )
            return img.convert("RGB")
    except DataFileError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataFileError(f"Cannot read image {what}: {exc}") from exc


def _header_size(source: Path | bytes, what: str) -> tuple[int, int]:
    """(H, W) of an image from its header (nothing decoded)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
            w, h = img.size
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataFileError(f"Cannot read image {what}: {exc}") from exc
    return h, w


def _fraction_split(
    labels: Tensor, fraction: float, seed: int, stratified: bool
) -> tuple[list[int], list[int]]:
    """Seeded (stitch, test) indices; per class when ``stratified`` (every class with two or
    more images lands in both splits)."""
    g = torch.Generator().manual_seed(seed)
    if stratified:
        groups = [(labels == c).nonzero().flatten() for c in labels.unique()]
    else:
        groups = [torch.arange(len(labels))]
    stitch: list[int] = []
    test: list[int] = []
    for idx in groups:
        idx = idx[torch.randperm(len(idx), generator=g)]
        n = len(idx)
        k = 0 if n < 2 else min(max(int(fraction * n + 0.5), 1), n - 1)
        test += idx[:k].tolist()
        stitch += idx[k:].tolist()
    return sorted(stitch), sorted(test)


def _split_by_fraction(
    ds: Dataset, labels: Tensor, opts: _Options, labelled: bool, unit: str = "images"
) -> tuple[Dataset, Dataset, str]:
    stitch, test = _fraction_split(labels, opts.test_fraction, opts.seed, labelled)
    words = f"fraction {opts.test_fraction:g} of {len(labels)} {unit}, seed {opts.seed}"
    if labelled:
        words += ", stratified by class"
    words += f" ({len(stitch)} stitch, {len(test)} test)"
    return Subset(ds, stitch), Subset(ds, test), words


def _unwrap(ds: Dataset) -> tuple[Dataset, list[int]]:
    """The dataset under nested Subsets and the indices into it."""
    idx: list[int] | None = None
    while isinstance(ds, Subset):
        inner = list(ds.indices)
        idx = inner if idx is None else [inner[i] for i in idx]
        ds = ds.dataset
    return ds, (idx if idx is not None else list(range(len(ds))))  # type: ignore[arg-type]
