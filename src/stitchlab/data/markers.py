"""Pixel-shortcut markers (docs/method.md section 5): Pixel+Loc, Pixel and Rand.

A marker is a solid square of a class colour, 4x4 pixels on 32x32 images (28x28 on
224x224), pasted on the image *after* the base dataset's augmentation. Where and in which
colour it is pasted depends only on ``(seed, index)`` (and the label), never on a global
random state, so marked data sets are deterministic and can be cached.

* ``pixel+loc``: class colour at a class-fixed location;
* ``pixel``: class colour at a random location;
* ``rand``: a random palette colour at a random location (no label information).

``rolled=True`` gives every class the marker of the next class (``roll`` classes on):
the test set for excess agreement and for checking that a network relies on the marker.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..vocabulary import IMAGE_MARKERS
from .tensors import labels_of

__all__ = [
    "MODES", "distinct_colours", "marker_colours", "marker_size", "Marked", "PartlyMarked",
]  # fmt: skip

MODES = IMAGE_MARKERS
_MASK64 = (1 << 64) - 1


def distinct_colours(k: int, *, levels: int = 5, min_chroma: float = 0.5) -> Tensor:
    """``k`` colours ``(k, 3)`` by farthest-point sampling over an RGB grid.

    The grid has ``levels`` values per channel; only colours whose chroma
    (max - min channel) is at least ``min_chroma`` are candidates, so that markers stand
    out from grey images (0 allows black, white and greys). The first colour is the
    candidate farthest from mid-grey; each next one is the candidate farthest from those
    already chosen (ties: grid order).
    """
    values = torch.linspace(0, 1, levels)
    grid = torch.tensor(list(itertools.product(values.tolist(), repeat=3)))
    chroma = grid.max(1).values - grid.min(1).values
    cand = grid[chroma >= min_chroma - 1e-9]
    if k > len(cand):
        raise ValueError(
            f"only {len(cand)} grid colours have chroma >= {min_chroma}; ask for fewer "
            "colours or raise levels"
        )
    first = int((cand - 0.5).norm(dim=1).argmax())
    chosen = [first]
    dist = (cand - cand[first]).norm(dim=1)
    for _ in range(k - 1):
        nxt = int(dist.argmax())
        chosen.append(nxt)
        dist = torch.minimum(dist, (cand - cand[nxt]).norm(dim=1))
    return cand[chosen].clone()


def marker_colours(num_classes: int, seed: int = 0) -> Tensor:
    """The class colours ``(num_classes, 3)``: :func:`distinct_colours` permuted by ``seed``."""
    colours = distinct_colours(num_classes)
    perm = torch.randperm(num_classes, generator=torch.Generator().manual_seed(seed))
    return colours[perm]


def marker_size(image_size: int) -> int:
    """Side of the marker: 4 pixels at 32x32, 28 at 224x224 (an eighth of the side)."""
    return max(1, round(image_size / 8))


def _mix(*values: int) -> int:
    """A 63-bit hash of integers (splitmix64), for per-item generator seeds."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


class Marked(Dataset):
    """Wrap a dataset of ``(image, label, ...)`` items and paste a marker on every image.

    Args:
        dataset: the base dataset (with its augmentation, applied before the marker).
        mode: ``"pixel+loc"``, ``"pixel"`` or ``"rand"``.
        num_classes: class count (default: from ``dataset.classes`` or the labels).
        seed: fixes the colour permutation, the class locations and every random draw.
        size: marker side in pixels (default: :func:`marker_size` of the image).
        rolled: give each class the marker of class ``(label + roll) % num_classes``.
        roll: how many classes to roll by (1).

    Labels are returned unchanged. Images must be RGB.
    """

    def __init__(
        self,
        dataset: Dataset,
        mode: str = "pixel+loc",
        *,
        num_classes: int | None = None,
        seed: int = 0,
        size: int | None = None,
        rolled: bool = False,
        roll: int = 1,
    ) -> None:
        mode = mode.lower()
        if mode not in MODES:
            raise ValueError(f"marker mode must be one of {', '.join(MODES)}, got {mode!r}")
        if num_classes is None:
            classes = getattr(dataset, "classes", None)
            num_classes = len(classes) if classes else int(labels_of(dataset).max()) + 1
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        self.dataset = dataset
        self.mode = mode
        self.num_classes = num_classes
        self.seed = seed
        self.size = size
        self.rolled = rolled
        self.roll = roll if rolled else 0
        self.colours = marker_colours(num_classes, seed)
        g = torch.Generator().manual_seed(_mix(seed, 0x10C))
        self._class_loc = torch.rand(num_classes, 2, generator=g)  # fractions of the free range
        self.classes = getattr(dataset, "classes", None)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def targets(self) -> Tensor:
        """The labels (unchanged by the marker)."""
        return labels_of(self.dataset)

    def marker(self, index: int, label: int, height: int, width: int) -> tuple[Tensor, int, int]:
        """``(colour (3,), top, left)`` of the marker of item ``index`` with ``label``."""
        s = self.size or marker_size(min(height, width))
        g = torch.Generator().manual_seed(_mix(self.seed, index))
        u = torch.rand(3, generator=g)  # location draws and a colour draw, always all three
        c = (int(label) + self.roll) % self.num_classes
        if self.mode == "rand":
            colour = self.colours[min(int(u[2] * self.num_classes), self.num_classes - 1)]
        else:
            colour = self.colours[c]
        frac = self._class_loc[c] if self.mode == "pixel+loc" else u[:2]
        top = min(int(frac[0] * (height - s + 1)), height - s)
        left = min(int(frac[1] * (width - s + 1)), width - s)
        return colour, top, left

    def __getitem__(self, index: int):
        item = self.dataset[index]
        x, y = item[0], item[1]
        if x.dim() != 3 or x.shape[0] != 3:
            raise ValueError(
                f"markers need RGB images (3, H, W); got {tuple(x.shape)}. For MNIST use "
                "mnist(..., channels=3) or coloured_mnist(...)."
            )
        h, w = x.shape[-2:]
        s = self.size or marker_size(min(h, w))
        colour, top, left = self.marker(index, int(y), h, w)
        x = x.clone()
        x[:, top : top + s, left : left + s] = colour.to(x.dtype)[:, None, None]
        return (x, y, *item[2:])


class PartlyMarked(Dataset):
    """Items of ``marked`` for a fixed ``rate`` of the indices, of ``clean`` for the rest:
    training data for a partial shortcut (the marker predicts the class on only part of
    the data, so the network must also learn the real cue). Item ``i`` is marked when a
    uniform draw from ``(seed, i)`` falls below ``rate``; ``clean`` and ``marked`` must
    index the same items (``marked`` wraps ``clean``)."""

    def __init__(self, clean: Dataset, marked: Dataset, rate: float, *, seed: int = 0) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"a marker rate is a fraction in (0, 1], got {rate!r}")
        if len(clean) != len(marked):  # type: ignore[arg-type]
            raise ValueError(f"clean ({len(clean)}) and marked ({len(marked)}) sizes differ")  # type: ignore[arg-type]
        self.clean, self.marked, self.rate, self.seed = clean, marked, float(rate), int(seed)
        n = len(clean)  # type: ignore[arg-type]
        g = torch.Generator().manual_seed(_mix(seed, n, 0x9A57))
        self.is_marked = torch.rand(n, generator=g) < self.rate
        for name in ("classes", "sample_rate"):
            if hasattr(clean, name):
                setattr(self, name, getattr(clean, name))

    def __len__(self) -> int:
        return len(self.clean)  # type: ignore[arg-type]

    @property
    def targets(self) -> Tensor:
        """The labels (markers never change them)."""
        return labels_of(self.clean)

    def __getitem__(self, index: int):
        return (self.marked if self.is_marked[index] else self.clean)[index]
