"""Data sets: real ones from disk (read safely), generated ones, markers and subsets.

* :func:`cifar10`, :func:`mnist`, :func:`coloured_mnist`: standard layouts on disk;
* :func:`image_folder`, :func:`ls_imagenet10`, :func:`imagenet100`, :func:`imagenet_b100`
  and :func:`build_ls_imagenet10`: ImageNet class-folder trees;
* :func:`shapes`, :func:`cues`: generated in memory, no files;
* :class:`Marked`: pixel-shortcut markers (Pixel+Loc, Pixel, Rand, rolled);
* :func:`subset`: seeded subsets and per-class limits for fast runs.

Every data set yields ``(image, label)`` with a float image ``(C, H, W)`` in [0, 1].
"""

from .cifar import CIFAR10_CLASSES, cifar10, download_cifar10
from .fingerprint import fingerprint
from .folders import (
    IMAGENET100_CLASSES,
    LS_IMAGENET10_CLASSES,
    ImageFolderDataset,
    build_image_subset,
    build_ls_imagenet10,
    choose_imagenet_b100,
    image_folder,
    imagenet100,
    imagenet_b100,
    ls_imagenet10,
)
from .markers import MODES as MARKER_MODES
from .markers import Marked, PartlyMarked, distinct_colours, marker_colours, marker_size
from .mnist import VARIANTS as COLOURED_MNIST_VARIANTS
from .mnist import ColouredMNIST, coloured_mnist, download_mnist, mnist, read_idx
from .safe_pickle import UnsafePickleError, safe_load
from .speech import (
    DIGITS,
    Beeped,
    EspeakNotFoundError,
    SpeechSynthesisError,
    WaveformDataset,
    spoken_digits,
    spoken_words,
)
from .synthetic import cues, render_cues, shapes
from .tensors import DataFileError, ImageTensorDataset, labels_of, subset
from .transforms import simclr_views, train_augmentation

__all__ = [
    "shapes",
    "cues",
    "render_cues",
    "cifar10",
    "download_cifar10",
    "CIFAR10_CLASSES",
    "mnist",
    "download_mnist",
    "read_idx",
    "coloured_mnist",
    "ColouredMNIST",
    "COLOURED_MNIST_VARIANTS",
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
    "Marked",
    "PartlyMarked",
    "MARKER_MODES",
    "distinct_colours",
    "marker_colours",
    "marker_size",
    "ImageTensorDataset",
    "labels_of",
    "subset",
    "fingerprint",
    "train_augmentation",
    "simclr_views",
    "safe_load",
    "DataFileError",
    "UnsafePickleError",
    "spoken_digits",
    "DIGITS",
    "spoken_words",
    "WaveformDataset",
    "Beeped",
    "SpeechSynthesisError",
    "EspeakNotFoundError",
]
