"""A researcher's own image or audio data, for ``stitchlab compare``: found by its layout
on disk.

:func:`load_user_data` reads any of these formats (nothing in a file is ever executed):

* **image folder** (read with Pillow): ``ROOT/train/<class>/*`` and ``ROOT/test/<class>/*``
  (or ``ROOT/val/``), split by folder; ``ROOT/<class>/*``, split by a seeded fraction,
  stratified per class; or images directly in ``ROOT`` (unlabelled, split by fraction);
* **CIFAR-10 folder**: ``cifar-10-batches-py/`` (or a folder holding it), its train/test;
* **.npz** file (``numpy.load`` with ``allow_pickle=False``) and **.safetensors** file:
  images under ``images`` or ``x`` (optional labels ``labels`` or ``y``), or ``x_train`` and
  ``x_test`` (optional ``y_train`` and ``y_test``) for a given split; layout NCHW (when axis 1
  has size 1 or 3), else NHWC (axis 3 of size 1 or 3), or greyscale ``(N, H, W)``; dtype
  uint8 (0-255) or float in [0, 1]; optional class names (``classes``: a string array in a
  .npz, a JSON list in the .safetensors metadata);
* **Hugging Face datasets folder** written by ``Dataset.save_to_disk`` or
  ``DatasetDict.save_to_disk``, read with pyarrow only (no ``datasets`` package): the
  ``Image`` column (else ``image``/``img``), the ``ClassLabel`` column (else
  ``label``/``labels``; none: unlabelled), splits ``train`` and ``test`` (or ``validation``)
  when present, else split by fraction; images are decoded one at a time when read.

Every item is ``(image, label)``: a float32 image ``(3, H, W)`` in [0, 1] (greyscale and
RGBA become RGB) and an ``int`` label, -1 throughout when the data has no labels.

Audio (``audio=True``, or a folder holding ``.wav`` files):

* **.wav folder**, laid out like an image folder (``ROOT/train/<class>/*.wav`` with
  ``ROOT/test/<class>/*.wav``; ``ROOT/<class>/*.wav``; or ``.wav`` files in ``ROOT``), read
  with the standard library's :mod:`wave`: uncompressed PCM of 8 (unsigned), 16, 24 or 32
  bits, levels divided by ``2 ** (bits - 1) - 1`` (32767 for 16 bits, as
  :class:`~stitchlab.data.speech.WaveformDataset` reads int16 PCM; the lowest level is
  clipped to -1), channels averaged to mono (:func:`read_wav`);
* **.npz** / **.safetensors** waveforms under ``waveforms``, ``audio`` or ``x`` (or
  ``x_train`` and ``x_test``), labels as for images: shape ``(N, T)`` or ``(N, C, T)``
  (channels averaged), float in [-1, 1] or int16 PCM (/ 32767), at the rate of a
  ``sample_rate`` entry (a .npz array, .safetensors metadata; without one, at
  ``sample_rate``). A file with a ``sample_rate`` entry is read as audio unasked.

Clips are resampled to ``sample_rate`` (:func:`stitchlab.data.speech.resample`, windowed
sinc; default: the files' own rate, which must then be one) and centred in ``samples``
samples (zero padding or a centre crop; default: the longest clip). Only the clips of the
chosen stitch and test subsets are read; they are held in memory as
:class:`~stitchlab.data.speech.WaveformDataset` s, items ``(float32 (1, T) in [-1, 1],
label)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset

from .tensors import DataFileError, labels_of, subset
from .user_arrays import _load_tensors, _read_npz, _read_safetensors
from .user_arrow import _ArrowImageDataset, _load_hf
from .user_common import (
    _ACCEPTED,
    _header_size,
    _Loaded,
    _Options,
    _read_rgb,  # noqa: F401 (imported from here by callers)
    _unwrap,
)
from .user_folder import _load_cifar, _load_folder
from .user_wav import _longest, _one_rate, _rates, _waveforms, centre_padding, read_wav

__all__ = ["UserData", "load_user_data", "read_wav", "centre_padding"]


@dataclass(frozen=True)
class UserData:
    """Stitch and test splits of a researcher's own images or audio clips, and how they were
    found. Images have an ``image_size``; audio (``modality == "audio"``) a ``sample_rate``
    and ``samples`` per clip instead."""

    stitch: Dataset
    test: Dataset
    labelled: bool
    classes: tuple[str, ...] | None
    kind: str
    source: str
    split: str
    image_size: tuple[int, int] | None
    modality: str = "image"
    sample_rate: int | None = None
    samples: int | None = None

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one input: ``(3, H, W)``, or ``(1, samples)`` for audio."""
        if self.modality == "audio":
            return (1, int(self.samples))  # type: ignore[arg-type]
        return (3, *self.image_size)  # type: ignore[misc]

    def describe_items(self) -> str:
        """``"images 32x32"`` or ``"clips of 8000 samples (1 s) at 8000 Hz"``."""
        if self.modality == "audio":
            secs = self.samples / self.sample_rate  # type: ignore[operator]
            return f"clips of {self.samples} samples ({secs:.3g} s) at {self.sample_rate} Hz"
        return f"images {self.image_size[0]}x{self.image_size[1]}"  # type: ignore[index]

    @property
    def num_classes(self) -> int | None:
        """Number of classes: the class names, else the largest label + 1; None unlabelled."""
        if self.classes is not None:
            return len(self.classes)
        if not self.labelled:
            return None
        return int(max(labels_of(self.stitch).max(), labels_of(self.test).max())) + 1


def load_user_data(
    path: str | os.PathLike,
    *,
    size: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    n_stitch: int | None = None,
    n_test: int | None = None,
    audio: bool = False,
    sample_rate: int | None = None,
    samples: int | None = None,
) -> UserData:
    """Read images or audio at ``path`` (see the module docstring for the formats) as
    stitch/test splits.

    ``size`` resizes the shorter side of every image and crops the centre to ``size`` x
    ``size``; without it all images must have the same size. Data without a train/test split
    is split with ``test_fraction`` (seeded by ``seed``, stratified per class when labelled).
    ``n_stitch`` / ``n_test`` keep seeded random subsets (all images when there are fewer).
    ``audio`` asks for waveforms (a folder must hold .wav files; arrays are read as
    waveforms); ``sample_rate`` and ``samples`` are the rate (Hz) and length of the clips
    returned. Raises :class:`DataFileError` for a missing, unknown, damaged or unsafe input.
    """
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    for name, v in (("sample_rate", sample_rate), ("samples", samples)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    root = Path(path).expanduser()
    if not root.exists():
        raise DataFileError(f"{str(path)!r} does not exist. {_ACCEPTED}")
    root = root.resolve()
    opts = _Options(size, test_fraction, seed, audio, sample_rate, samples)
    if root.is_file():
        suffix = root.suffix.lower()
        if suffix == ".npz":
            loaded = _load_tensors(root, _read_npz(root), "npz", opts)
        elif suffix == ".safetensors":
            loaded = _load_tensors(root, _read_safetensors(root), "safetensors", opts)
        else:
            raise DataFileError(
                f"Unknown data file type {root.suffix!r} ({str(root)!r}). {_ACCEPTED}"
            )
    elif (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
        loaded = _load_hf(root, opts)
    elif (
        (root / "cifar-10-batches-py").is_dir()
        or (root / "data_batch_1").is_file()
        or (root / "test_batch").is_file()
    ):
        loaded = _load_cifar(root, opts)
    else:
        loaded = _load_folder(root, opts)
    if audio and not loaded.audio:
        raise DataFileError(
            f"{str(root)!r} holds images ({loaded.kind}), but audio was asked for (speech "
            "models read waveforms): give a folder of .wav files or a .npz/.safetensors file "
            "of waveforms (N, T)."
        )
    return _finish(loaded, root, opts, n_stitch, n_test)


def _raw_size(base: Dataset, i: int) -> tuple[tuple[int, int], str]:
    if isinstance(base, _ArrowImageDataset):
        return base.raw_size(i), f"row {i} of {str(base.folder)!r}"
    path = base.samples[i][0]  # type: ignore[attr-defined]
    return _header_size(path, repr(str(path))), repr(str(path))


def _common_size(datasets: Sequence[Dataset]) -> tuple[int, int]:
    """The one (H, W) of every image the datasets hold; an error naming two that differ."""
    first: tuple[tuple[int, int], str] | None = None
    for ds in datasets:
        base, indices = _unwrap(ds)
        for i in indices:
            hw, what = _raw_size(base, i)
            if first is None:
                first = (hw, what)
            elif hw != first[0]:
                raise DataFileError(
                    f"Images have different sizes: {first[0][0]}x{first[0][1]} (H x W) for "
                    f"{first[1]} but {hw[0]}x{hw[1]} for {what}. Pass size=N to resize the "
                    "shorter side of every image and crop the centre to N x N."
                )
    if first is None:
        raise DataFileError("No images to read.")
    return first[0]


def _finish(
    loaded: _Loaded, root: Path, opts: _Options, n_stitch: int | None, n_test: int | None
) -> UserData:
    split = loaded.split
    stitch, test = loaded.stitch, loaded.test
    notes = []
    for name, n, ds in (("stitch", n_stitch, stitch), ("test", n_test, test)):
        if n is not None:
            notes.append(f"{name} {min(n, len(ds))} of {len(ds)}")  # type: ignore[arg-type]
    stitch, test = subset(stitch, n_stitch, seed=opts.seed), subset(test, n_test, seed=opts.seed)
    if notes:
        split += f"; random subsets (seed {opts.seed}): " + ", ".join(notes)
    for name, ds in (("stitch", stitch), ("test", test)):
        if len(ds) == 0:  # type: ignore[arg-type]
            raise DataFileError(
                f"The {name} split of {str(root)!r} is empty ({split}). Add "
                f"{'clips' if loaded.audio else 'images'}, or use a larger test_fraction / "
                "data with a train and test split."
            )
    if loaded.audio:
        rates = _rates([stitch, test])
        rate = opts.sample_rate or _one_rate(rates, root)
        if rates - {None, rate}:
            native = ", ".join(str(r) for r in sorted(rates - {None, rate}))  # type: ignore[type-var]
            split += f"; resampled from {native} Hz to {rate} Hz"
        samples = opts.samples or _longest([stitch, test], rate)
        return UserData(
            stitch=_waveforms(stitch, rate, samples, loaded.classes),
            test=_waveforms(test, rate, samples, loaded.classes),
            **_described(loaded, root, split),
            image_size=None,
            modality="audio",
            sample_rate=rate,
            samples=samples,
        )
    image_size = loaded.image_size
    if image_size is None:
        image_size = (opts.size, opts.size) if opts.size else _common_size([stitch, test])
    return UserData(
        stitch=stitch, test=test, **_described(loaded, root, split), image_size=image_size
    )


def _described(loaded, root, split: str) -> dict:
    """The fields of :class:`UserData` that say what was read and how it was split."""
    return {"labelled": loaded.labelled, "classes": loaded.classes, "kind": loaded.kind,
            "source": str(root), "split": split}  # fmt: skip
