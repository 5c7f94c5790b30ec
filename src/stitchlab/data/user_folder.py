"""Folders of image or ``.wav`` files (split by ``train/``/``test/`` folders or by a
seeded fraction) and CIFAR-10 folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .cifar import CIFAR10_CLASSES, cifar10
from .folders import _EXTENSIONS, ImageFolderDataset
from .tensors import DataFileError, labels_of
from .user_common import (
    _ACCEPTED,
    _TEST_DIRS,
    _decode,
    _Loaded,
    _Options,
    _read_rgb,
    _resizer,
    _split_by_fraction,
)
from .user_wav import _AUDIO_EXTENSIONS, _holds_wav, _WavFiles


class _ImageFiles(Dataset):
    """Image files with given labels (-1: none), decoded like :class:`ImageFolderDataset`."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int], size: int | None) -> None:
        self.samples = list(zip(files, labels, strict=True))
        self.targets = torch.tensor(list(labels), dtype=torch.long)
        self.size = size
        self.classes = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        path, label = self.samples[index]
        return _decode(_read_rgb(path, repr(str(path))), self.size), int(label)


def _images_in(folder: Path, extensions: Sequence[str] = _EXTENSIONS) -> list[Path]:
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in extensions
    )


def _scan(folder: Path, extensions: Sequence[str] = _EXTENSIONS) -> tuple[list[str], list[Path]]:
    """(class sub-folders that hold images, images directly in ``folder``)."""
    classes = sorted(
        p.name
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and _images_in(p, extensions)
    )
    return classes, _images_in(folder, extensions)


def _folder_dataset(
    folder: Path, size: int | None, audio: bool = False
) -> tuple[Dataset, list[str] | None]:
    classes, loose = _scan(folder, _AUDIO_EXTENSIONS if audio else _EXTENSIONS)
    unit = ".wav files" if audio else "images"
    if classes and loose:
        raise DataFileError(
            f"{str(folder)!r} holds both {unit} ({loose[0].name}, ...) and class folders "
            f"({', '.join(classes[:3])}, ...): put every file in a class folder, or none."
        )
    if classes and audio:
        files = [(f, k) for k, c in enumerate(classes)
                 for f in _images_in(folder / c, _AUDIO_EXTENSIONS)]  # fmt: skip
        return _WavFiles([f for f, _ in files], [k for _, k in files]), classes
    if classes:
        return ImageFolderDataset(folder, classes=classes, size=size), classes
    if loose:
        if audio:
            return _WavFiles(loose, [-1] * len(loose)), None
        return _ImageFiles(loose, [-1] * len(loose), size), None
    if audio:
        raise DataFileError(
            f"No .wav files in {str(folder)!r} or its class sub-folders (speech models read "
            "audio): lay them out as ROOT/train/<class>/*.wav and ROOT/test/<class>/*.wav, "
            "ROOT/<class>/*.wav, or ROOT/*.wav."
        )
    raise DataFileError(f"No images in {str(folder)!r} or its sub-folders. {_ACCEPTED}")


def _load_folder(root: Path, opts: _Options) -> _Loaded:
    audio = opts.audio or _holds_wav(root)
    unit = "clips" if audio else "images"
    kind = "wav-folder" if audio else "folder"
    test_dir = next((root / n for n in _TEST_DIRS if (root / n).is_dir()), None)
    if (root / "train").is_dir() and test_dir is not None:
        stitch, train_classes = _folder_dataset(root / "train", opts.size, audio)
        test, test_classes = _folder_dataset(test_dir, opts.size, audio)
        if train_classes != test_classes:
            a, b = set(train_classes or ()), set(test_classes or ())
            raise DataFileError(
                f"The class folders of train/ and {test_dir.name}/ in {str(root)!r} differ: "
                f"only in train/: {', '.join(sorted(a - b)[:5]) or '-'}; only in "
                f"{test_dir.name}/: {', '.join(sorted(b - a)[:5]) or '-'}."
            )
        classes = tuple(train_classes) if train_classes else None
        return _Loaded(
            stitch,
            test,
            classes is not None,
            classes,
            kind,
            f"folders train/ and {test_dir.name}/",
            None,
            audio,
        )
    exts = _AUDIO_EXTENSIONS if audio else _EXTENSIONS
    if (root / "train").is_dir() and not _images_in(root / "train", exts):
        raise DataFileError(
            f"{str(root)!r} has a train/ folder but no test/ or val/ folder next to it: "
            "add one, or pass the train/ folder itself to split it by a fraction."
        )
    ds, classes = _folder_dataset(root, opts.size, audio)
    labelled = classes is not None
    stitch, test, words = _split_by_fraction(ds, labels_of(ds), opts, labelled, unit)
    return _Loaded(
        stitch, test, labelled, tuple(classes) if classes else None, kind, words, None, audio
    )


def _load_cifar(root: Path, opts: _Options) -> _Loaded:
    transform = _resizer(opts.size)
    stitch = cifar10(root, train=True, transform=transform)
    test = cifar10(root, train=False, transform=transform)
    size = (opts.size, opts.size) if opts.size else (32, 32)
    words = "CIFAR-10 train batches (data_batch_1..5) and test_batch"
    return _Loaded(stitch, test, True, CIFAR10_CLASSES, "cifar10", words, size)
