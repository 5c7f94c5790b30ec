"""Image folders: LS-ImageNet-10, ImageNet-100, ImageNet-B100, and the LS-ImageNet-10 builder.

All three use the usual class-folder layout (as torchvision's ``ImageFolder`` reads it)::

    ROOT/train/<wnid>/*.JPEG        ROOT/val/<wnid>/*.JPEG

Images are read with Pillow (nothing in an image file is executed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from .tensors import DataFileError

__all__ = [
    "image_folder",
    "ImageFolderDataset",
    "ls_imagenet10",
    "imagenet100",
    "imagenet_b100",
    "build_image_subset",
    "build_ls_imagenet10",
    "choose_imagenet_b100",
    "LS_IMAGENET10_CLASSES",
    "IMAGENET100_CLASSES",
]

#: The 10 classes of LS-ImageNet-10: the widely used "ImageNet-10" subset (Chang et al.
#: 2017, Deep Adaptive Image Clustering): king penguin, Maltese dog, snow leopard,
#: airliner, airship, container ship, soccer ball, sports car, trailer truck, orange.
#: The paper's own list could not be checked here; pass ``classes=`` to use another.
LS_IMAGENET10_CLASSES = (
    "n02056570",
    "n02085936",
    "n02128757",
    "n02690373",
    "n02692877",
    "n03095699",
    "n04254680",
    "n04285008",
    "n04467665",
    "n07747607",
)

#: ImageNet-100 as in CMC (Tian et al. 2019, ``imagenet100.txt``), in that file's order.
IMAGENET100_CLASSES = (
    "n02869837 n01749939 n02488291 n02107142 n13037406 n02091831 n04517823 n04589890 "
    "n03062245 n01773797 n01735189 n07831146 n07753275 n03085013 n04485082 n02105505 "
    "n01983481 n02788148 n03530642 n04435653 n02086910 n02859443 n13040303 n03594734 "
    "n02085620 n02099849 n01558993 n04493381 n02109047 n04111531 n02877765 n04429376 "
    "n02009229 n01978455 n02106550 n01820546 n01692333 n07714571 n02974003 n02114855 "
    "n03785016 n03764736 n03775546 n02087046 n07836838 n04099969 n04592741 n03891251 "
    "n02701002 n03379051 n02259212 n07715103 n03947888 n04026417 n02326432 n03637318 "
    "n01980166 n02113799 n02086240 n03903868 n02483362 n04127249 n02089973 n03017168 "
    "n02093428 n02804414 n02396427 n04418357 n02172182 n01729322 n02113978 n03787032 "
    "n02089867 n02119022 n03777754 n04238763 n02231487 n03032252 n02138441 n02104029 "
    "n03837869 n03494278 n04136333 n03794056 n03492542 n02018207 n04067472 n03930630 "
    "n03584829 n02123045 n04229816 n02100583 n03642806 n04336792 n03259280 n02116738 "
    "n02108089 n03424325 n01855672 n02090622"
).split()

_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".webp", ".tif", ".tiff")


def _split_dir(root: Path, train: bool) -> Path:
    names = ("train",) if train else ("val", "test")
    for name in names:
        if (root / name).is_dir():
            return root / name
    raise DataFileError(
        f"No {' or '.join(names)} folder under {str(root)!r}; expected ROOT/train/<class>/ "
        "and ROOT/val/<class>/ image folders."
    )


class ImageFolderDataset(torch.utils.data.Dataset):
    """Class-folder images as float tensors ``(3, H, W)`` in [0, 1] with integer labels.

    ``classes`` fixes the classes and their order (all must be present); by default every
    sub-folder is a class, in sorted order. ``size`` resizes the shorter side and crops the
    centre to ``size`` x ``size`` (after which ``transform`` runs on the tensor).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        classes: Sequence[str] | None = None,
        size: int | None = None,
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        folder = Path(folder)
        if not folder.is_dir():
            raise DataFileError(f"Image folder {str(folder)!r} does not exist.")
        present = sorted(p.name for p in folder.iterdir() if p.is_dir())
        if classes is None:
            classes = present
        missing = [c for c in classes if c not in present]
        if missing:
            raise DataFileError(
                f"{len(missing)} class folder(s) missing in {str(folder)!r}: "
                f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )
        if not classes:
            raise DataFileError(f"No class folders in {str(folder)!r}.")
        self.root = folder
        self.classes = list(classes)
        self.samples: list[tuple[Path, int]] = []
        for label, name in enumerate(self.classes):
            files = sorted(p for p in (folder / name).iterdir() if p.suffix.lower() in _EXTENSIONS)
            self.samples += [(p, label) for p in files]
        if not self.samples:
            raise DataFileError(f"No images in the class folders of {str(folder)!r}.")
        self.targets = torch.tensor([s[1] for s in self.samples])
        self.size = size
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        from PIL import Image
        from torchvision.transforms.v2 import functional as F

        path, label = self.samples[index]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
        except OSError as exc:
            raise DataFileError(f"Cannot read image {str(path)!r}: {exc}") from exc
        x = F.pil_to_tensor(img)
        if self.size is not None:
            x = F.center_crop(F.resize(x, self.size, antialias=True), self.size)
        x = x.float().div_(255)
        if self.transform is not None:
            x = self.transform(x)
        return x, label


def image_folder(
    root: str | os.PathLike,
    train: bool = True,
    *,
    classes: Sequence[str] | None = None,
    size: int | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> ImageFolderDataset:
    """The ``train`` (or ``val``) split of an image-folder data set under ``root``."""
    return ImageFolderDataset(
        _split_dir(Path(root), train), classes=classes, size=size, transform=transform
    )


def ls_imagenet10(
    root: str | os.PathLike,
    train: bool = True,
    *,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> ImageFolderDataset:
    """LS-ImageNet-10 at 32x32, as written by :func:`build_ls_imagenet10`."""
    return image_folder(root, train, classes=LS_IMAGENET10_CLASSES, size=32, transform=transform)


def imagenet100(
    root: str | os.PathLike,
    train: bool = True,
    *,
    size: int = 224,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> ImageFolderDataset:
    """ImageNet-100 (CMC's 100 classes) from a class-folder tree, ``size`` x ``size``."""
    return image_folder(root, train, classes=IMAGENET100_CLASSES, size=size, transform=transform)


def imagenet_b100(
    root: str | os.PathLike,
    train: bool = True,
    *,
    classes: Sequence[str] | None = None,
    size: int = 224,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> ImageFolderDataset:
    """ImageNet-B100: 100 classes disjoint from ImageNet-100 (every folder under ``root``,
    or ``classes``); refuses a class that is also in ImageNet-100."""
    ds = image_folder(root, train, classes=classes, size=size, transform=transform)
    shared = sorted(set(ds.classes) & set(IMAGENET100_CLASSES))
    if shared:
        raise DataFileError(
            f"ImageNet-B100 must be disjoint from ImageNet-100, but {str(root)!r} has "
            f"{len(shared)} of its classes: {', '.join(shared[:5])}"
        )
    return ds


def choose_imagenet_b100(
    imagenet_root: str | os.PathLike, *, k: int = 100, seed: int = 0
) -> list[str]:
    """``k`` classes of an ImageNet train folder that are not in ImageNet-100 (seeded,
    sorted): a class list for :func:`build_image_subset` to write ImageNet-B100."""
    folder = _split_dir(Path(imagenet_root), True)
    pool = sorted(
        p.name for p in folder.iterdir() if p.is_dir() and p.name not in IMAGENET100_CLASSES
    )
    if len(pool) < k:
        raise DataFileError(
            f"{str(folder)!r} has only {len(pool)} classes outside ImageNet-100; need {k}."
        )
    perm = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:k]
    return sorted(pool[i] for i in perm.tolist())


def build_image_subset(
    imagenet_root: str | os.PathLike,
    out: str | os.PathLike,
    classes: Sequence[str],
    *,
    size: int | None = 32,
    per_class: int | None = None,
    progress: bool = False,
) -> Path:
    """Copy ``classes`` of an ImageNet class-folder tree to ``out`` (train and val splits).

    With ``size``, each whole image is resized to ``size`` x ``size`` (box filter, as in the
    downsampled ImageNet of Chrabaszcz et al. 2017) and written as PNG; ``per_class``
    keeps the first images (sorted by name) of each class. Returns ``out``.
    """
    from PIL import Image

    src, out = Path(imagenet_root), Path(out)
    splits = [(s, _split_dir(src, s == "train")) for s in ("train", "val")]
    for _, folder in splits:
        missing = [c for c in classes if not (folder / c).is_dir()]
        if missing:
            raise DataFileError(
                f"{len(missing)} class folder(s) missing in {str(folder)!r}: "
                f"{', '.join(missing[:5])}"
            )
    jobs = []
    for split, folder in splits:
        for c in classes:
            files = sorted(p for p in (folder / c).iterdir() if p.suffix.lower() in _EXTENSIONS)
            jobs += [(p, out / split / c) for p in files[:per_class]]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="images")
    for path, dest in jobs:
        dest.mkdir(parents=True, exist_ok=True)
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
        except OSError as exc:
            raise DataFileError(f"Cannot read image {str(path)!r}: {exc}") from exc
        if size is not None:
            img = img.resize((size, size), Image.Resampling.BOX)
        img.save(dest / f"{path.stem}.png")
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


def build_ls_imagenet10(
    imagenet_root: str | os.PathLike,
    out: str | os.PathLike,
    *,
    classes: Sequence[str] = LS_IMAGENET10_CLASSES,
    size: int = 32,
    per_class: int | None = None,
    progress: bool = False,
) -> Path:
    """Write LS-ImageNet-10 (its 10 classes at 32x32) from an ImageNet folder to ``out``."""
    return build_image_subset(
        imagenet_root, out, classes, size=size, per_class=per_class, progress=progress
    )
