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

import functools
import io
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from .cifar import CIFAR10_CLASSES, cifar10
from .folders import _EXTENSIONS, ImageFolderDataset
from .speech import WaveformDataset
from .tensors import DataFileError, ImageTensorDataset, labels_of, subset

__all__ = ["UserData", "load_user_data", "read_wav"]

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
_AUDIO_EXTENSIONS = (".wav",)
_CONVERT = (
    "Only uncompressed PCM WAV (8, 16, 24 or 32-bit integer samples) is read; convert it, "
    "e.g. `ffmpeg -i IN -c:a pcm_s16le OUT.wav` or `sox IN -b 16 -e signed-integer OUT.wav`."
)


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


# ---------------------------------------------------------------------------
# shared pieces


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


# ---------------------------------------------------------------------------
# audio clips


def centre_padding(length: int, samples: int) -> tuple[int, int]:
    """``(left, right)`` padding that centres ``length`` samples in ``samples`` (negative:
    a centre crop), as ``torch.nn.functional.pad`` takes it."""
    extra = samples - length
    left = extra // 2 if extra >= 0 else -((-extra) // 2)
    return left, extra - left


def _fit(x: np.ndarray, samples: int) -> np.ndarray:
    left, right = centre_padding(len(x), samples)
    x = x[max(0, -left) : len(x) - max(0, -right)]
    return np.pad(x, (max(0, left), max(0, right)))


def read_wav(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """The samples (float64, mono, in [-1, 1]) and sample rate of an uncompressed PCM WAV
    file, read with the standard library's :mod:`wave` (nothing else is parsed).

    8-bit files are unsigned (level 128 is 0), 16/24/32-bit signed; levels are divided by
    ``2 ** (bits - 1) - 1`` (32767 for 16 bits, :data:`stitchlab.data.speech.PCM_SCALE`),
    so the lowest level (-32768) is clipped to -1. Channels are averaged.
    """
    import wave

    where = repr(str(path))
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError, OSError, ValueError) as exc:
        raise DataFileError(f"Cannot read WAV file {where}: {exc}. {_CONVERT}") from exc
    if width not in (1, 2, 3, 4) or channels < 1 or rate < 1:
        raise DataFileError(
            f"WAV file {where} has {channels} channel(s) of {8 * width}-bit samples at {rate} "
            f"Hz. {_CONVERT}"
        )
    n = len(frames) // (width * channels)
    if n == 0:
        raise DataFileError(f"WAV file {where} holds no samples.")
    raw = np.frombuffer(frames, np.uint8, count=n * width * channels)
    if width == 1:
        levels = raw.astype(np.float64) - 128
    elif width == 3:
        b = raw.reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        levels = np.where(v >= 1 << 23, v - (1 << 24), v).astype(np.float64)
    else:
        levels = np.frombuffer(raw.tobytes(), f"<i{width}").astype(np.float64)
    x = levels.reshape(n, channels).mean(1) / (2.0 ** (8 * width - 1) - 1)
    return np.clip(x, -1.0, 1.0), int(rate)


def _wav_header(path: Path) -> tuple[int, int]:
    """(sample rate, frames) of a WAV file, from its header."""
    import wave

    try:
        with wave.open(str(path), "rb") as w:
            return int(w.getframerate()), int(w.getnframes())
    except (wave.Error, EOFError, OSError, ValueError) as exc:
        raise DataFileError(f"Cannot read WAV file {str(path)!r}: {exc}. {_CONVERT}") from exc


class _Clips(Dataset):
    """Clips at their own rate, read one at a time (before they are fitted to a window)."""

    targets: Tensor
    classes: list[str] | None = None

    def clip(self, i: int) -> tuple[np.ndarray, int | None]:
        """Samples (float64, mono) and rate (None: not known) of clip ``i``."""
        raise NotImplementedError

    def header(self, i: int) -> tuple[int | None, int]:
        """(rate, length) of clip ``i`` without reading its samples where possible."""
        x, rate = self.clip(i)
        return rate, len(x)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        x, _ = self.clip(index)
        return torch.from_numpy(x).float()[None], int(self.targets[index])


class _WavFiles(_Clips):
    """WAV files with labels (-1: none)."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int]) -> None:
        self.samples = list(zip(files, labels, strict=True))
        self.targets = torch.tensor(list(labels), dtype=torch.long)

    def clip(self, i: int) -> tuple[np.ndarray, int | None]:
        return read_wav(self.samples[i][0])

    def header(self, i: int) -> tuple[int | None, int]:
        return _wav_header(self.samples[i][0])


class _ArrayClips(_Clips):
    """Rows of a float waveform tensor ``(N, T)`` in [-1, 1] at ``rate`` (None: unknown)."""

    def __init__(self, x: Tensor, labels: Tensor, rate: int | None) -> None:
        self.x, self.targets, self.rate = x, labels, rate

    def clip(self, i: int) -> tuple[np.ndarray, int | None]:
        return self.x[i].double().numpy(), self.rate

    def header(self, i: int) -> tuple[int | None, int]:
        return self.rate, int(self.x.shape[1])


def _headers(datasets: Sequence[Dataset]):
    for ds in datasets:
        base, indices = _unwrap(ds)
        for i in indices:
            yield base.header(i)  # type: ignore[attr-defined]


def _rates(datasets: Sequence[Dataset]) -> set[int | None]:
    """The sample rates of the clips (None for arrays without one)."""
    base = [_unwrap(ds)[0] for ds in datasets]
    if all(isinstance(b, _ArrayClips) for b in base):
        return {b.rate for b in base}  # type: ignore[attr-defined]
    return {rate for rate, _ in _headers(datasets)}


def _one_rate(rates: set[int | None], root: Path) -> int:
    known = sorted(r for r in rates if r is not None)
    if not known:
        raise DataFileError(
            f"The sample rate of the waveforms in {str(root)!r} is not known: add a "
            "sample_rate entry (a .npz array, .safetensors metadata) or pass sample_rate=."
        )
    if len(known) > 1:
        raise DataFileError(
            f"The clips of {str(root)!r} have different sample rates ({', '.join(map(str, known))}"
            " Hz): pass sample_rate= to resample them all to one."
        )
    return known[0]


def _longest(datasets: Sequence[Dataset], rate: int) -> int:
    """The longest clip's length at ``rate``."""
    return max((n * rate) // (r or rate) for r, n in _headers(datasets))


def _waveforms(
    ds: Dataset, rate: int, samples: int, classes: Sequence[str] | None
) -> WaveformDataset:
    """The clips of ``ds`` (a _Clips dataset or a subset of one) resampled to ``rate`` and
    centred in ``samples`` samples, in memory."""
    from .speech import resample

    base, indices = _unwrap(ds)
    out = torch.empty(len(indices), 1, samples)
    for k, i in enumerate(indices):
        x, r = base.clip(i)  # type: ignore[attr-defined]
        if r is not None and r != rate:
            x = np.clip(resample(x, r, rate), -1.0, 1.0)
        out[k, 0] = torch.from_numpy(_fit(x, samples))
    labels = base.targets[torch.as_tensor(indices, dtype=torch.long)]  # type: ignore[attr-defined]
    return WaveformDataset(out, labels, sample_rate=rate, classes=classes)


def _holds_wav(root: Path) -> bool:
    """Whether ``root``, its sub-folders or theirs hold a .wav file."""
    return any(
        p.suffix.lower() in _AUDIO_EXTENSIONS and p.is_file()
        for pattern in ("*", "*/*", "*/*/*")
        for p in root.glob(pattern)
    )


# ---------------------------------------------------------------------------
# image folders


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


# ---------------------------------------------------------------------------
# CIFAR-10


def _load_cifar(root: Path, opts: _Options) -> _Loaded:
    transform = _resizer(opts.size)
    stitch = cifar10(root, train=True, transform=transform)
    test = cifar10(root, train=False, transform=transform)
    size = (opts.size, opts.size) if opts.size else (32, 32)
    words = "CIFAR-10 train batches (data_batch_1..5) and test_batch"
    return _Loaded(stitch, test, True, CIFAR10_CLASSES, "cifar10", words, size)


# ---------------------------------------------------------------------------
# .npz and .safetensors


@dataclass
class _Arrays:
    keys: set[str]
    get: Callable[[str], Tensor | np.ndarray]
    classes: list[str] | None
    where: str
    sample_rate: int | None = None  # a waveform file's rate entry


def _sample_rate(value: Any, where: str) -> int:
    """A ``sample_rate`` entry as a positive int."""
    try:
        rate = float(np.asarray(value).reshape(()).item())
    except (TypeError, ValueError):
        rate = float("nan")
    if not (rate >= 1 and rate == int(rate)):
        raise DataFileError(f"The sample_rate of {where} must be one positive integer (Hz), "
                            f"got {value!r}.")  # fmt: skip
    return int(rate)


def _read_npz(path: Path) -> _Arrays:
    import zipfile

    where = repr(str(path))
    try:
        npz = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise DataFileError(
            f"{where} is not a .npz archive of plain arrays ({exc}); pickled Python objects "
            "are never read (unpickling can run code): save numeric arrays with numpy.savez."
        ) from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataFileError(f"Cannot read {where} as a .npz file: {exc}") from exc
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DataFileError(f"{where} is a single .npy array, not a .npz archive of named arrays.")

    def get(key: str) -> np.ndarray:
        try:
            return npz[key]
        except ValueError as exc:
            raise DataFileError(
                f"Array {key!r} in {where} holds Python objects (pickled data), which are not "
                "read because unpickling can run code: save plain numeric arrays (uint8 or "
                "float images, integer labels)."
            ) from exc
        except (OSError, EOFError, zipfile.BadZipFile) as exc:
            raise DataFileError(f"Cannot read array {key!r} of {where}: {exc}") from exc

    keys = set(npz.files)
    classes = None
    for key in ("classes", "class_names"):
        if key in keys:
            arr = get(key)
            if arr.dtype.kind not in "US" or arr.ndim != 1:
                raise DataFileError(f"{key!r} in {where} must be a 1-D array of strings.")
            classes = [str(c.decode() if isinstance(c, bytes) else c) for c in arr.tolist()]
            break
    rate = _sample_rate(get("sample_rate"), where) if "sample_rate" in keys else None
    return _Arrays(keys, get, classes, where, rate)


def _read_safetensors(path: Path) -> _Arrays:
    from safetensors import SafetensorError, safe_open

    where = repr(str(path))
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise DataFileError(f"Cannot read {where} as a .safetensors file: {exc}") from exc
    classes = None
    if "classes" in meta:
        try:
            classes = json.loads(meta["classes"])
        except json.JSONDecodeError:
            classes = None
        if not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
            raise DataFileError(
                f"The 'classes' metadata of {where} must be a JSON list of strings."
            )

    def get(key: str) -> Tensor:
        try:
            with safe_open(str(path), framework="pt") as f:
                return f.get_tensor(key)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise DataFileError(f"Cannot read tensor {key!r} of {where}: {exc}") from exc

    rate = _sample_rate(meta["sample_rate"], where) if "sample_rate" in meta else None
    return _Arrays(keys, get, classes, where, rate)


def _pick_keys(
    keys: set[str], where: str, names: Sequence[str] = ("images", "x"), unit: str = "images"
) -> list[tuple[str, str | None]]:
    """[(images key, labels key or None)]: one entry, or two for a train/test split."""
    if "x_train" in keys or "x_test" in keys:
        if not {"x_train", "x_test"} <= keys:
            raise DataFileError(f"{where} has only one of 'x_train' and 'x_test'; give both.")
        has = ("y_train" in keys, "y_test" in keys)
        if has[0] != has[1]:
            raise DataFileError(
                f"{where} has only one of 'y_train' and 'y_test': give both, or neither "
                "for unlabelled images."
            )
        return [
            ("x_train", "y_train" if has[0] else None),
            ("x_test", "y_test" if has[1] else None),
        ]
    for key in names:
        if key in keys:
            return [(key, next((k for k in ("labels", "y") if k in keys), None))]
    expected = " or ".join(repr(n) for n in names)
    raise DataFileError(
        f"No {unit} in {where}: expected an array {expected} (labels, optional: 'labels' "
        "or 'y'), or 'x_train' and 'x_test' (optional 'y_train' and 'y_test'); found "
        f"{', '.join(sorted(keys)) or 'no arrays'}."
    )


def _dtype_error(key: str, dtype: object, where: str) -> DataFileError:
    return DataFileError(
        f"Images {key!r} in {where} have dtype {dtype}: expected uint8 (0-255) or float "
        "in [0, 1]; convert them first (e.g. to uint8)."
    )


def _as_images(raw: Tensor | np.ndarray, key: str, where: str) -> Tensor:
    """Validated images as a contiguous uint8 or float32 tensor (N, 3, H, W)."""
    if isinstance(raw, np.ndarray):
        if raw.dtype.kind not in "uf" or (raw.dtype.kind == "u" and raw.dtype != np.uint8):
            raise _dtype_error(key, raw.dtype, where)
        if raw.dtype.byteorder == ">":
            raw = raw.astype(raw.dtype.newbyteorder("="))
        x = torch.from_numpy(np.ascontiguousarray(raw))
    else:
        x = raw
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise _dtype_error(key, x.dtype, where)
    shape = tuple(x.shape)
    if x.dim() == 3:
        x = x.unsqueeze(1)
    elif x.dim() == 4:
        if x.shape[1] not in (1, 3):
            if x.shape[3] not in (1, 3):
                raise DataFileError(
                    f"Images {key!r} in {where} have shape {shape}: expected (N, C, H, W) or "
                    "(N, H, W, C) with 1 or 3 channels, or greyscale (N, H, W)."
                )
            x = x.permute(0, 3, 1, 2)
    else:
        raise DataFileError(
            f"Images {key!r} in {where} have shape {shape}: expected (N, C, H, W), "
            "(N, H, W, C) or greyscale (N, H, W)."
        )
    if len(x) == 0:
        raise DataFileError(f"Images {key!r} in {where} are empty (no images).")
    if x.is_floating_point():
        bad = ~torch.isfinite(x).flatten(1).all(1)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise DataFileError(
                f"Image {i} of {key!r} in {where} has NaN or infinite values "
                f"({int(bad.sum())} such image(s) in all)."
            )
        x = x.float()
        lo, hi = float(x.min()), float(x.max())
        if lo < 0 or hi > 1:
            raise DataFileError(
                f"Float images {key!r} in {where} have values in [{lo:g}, {hi:g}], but must lie "
                "in [0, 1]: scale them first (e.g. divide 0-255 values by 255), or save uint8."
            )
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x.contiguous()


def _as_labels(raw: Tensor | np.ndarray, key: str, n: int, where: str) -> Tensor:
    if isinstance(raw, Tensor):
        raw = (raw.float() if raw.dtype == torch.bfloat16 else raw).numpy()
    y = raw
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.dtype.kind not in "iu":
        raise DataFileError(f"Labels {key!r} in {where} must be integers, got dtype {y.dtype}.")
    if y.ndim != 1 or len(y) != n:
        raise DataFileError(
            f"Labels {key!r} in {where} have shape {tuple(y.shape)}; expected ({n},): one "
            "label per image."
        )
    if y.size and int(y.min()) < 0:
        raise DataFileError(f"Labels {key!r} in {where} must not be negative (min {y.min()}).")
    return torch.from_numpy(y.astype(np.int64))


def _as_waveforms(raw: Tensor | np.ndarray, key: str, where: str) -> Tensor:
    """Validated waveforms as a float32 tensor (N, T) in [-1, 1] (channels averaged)."""
    if isinstance(raw, np.ndarray):
        if raw.dtype.kind != "f" and raw.dtype != np.int16:
            raise DataFileError(f"Waveforms {key!r} in {where} have dtype {raw.dtype}: expected "
                                "float in [-1, 1] or int16 PCM.")  # fmt: skip
        raw = torch.from_numpy(np.ascontiguousarray(raw.astype(raw.dtype.newbyteorder("="))))
    x = raw
    if x.dtype == torch.int16:
        x = x.float() / 32767
    elif not x.is_floating_point():
        raise DataFileError(f"Waveforms {key!r} in {where} have dtype {x.dtype}: expected "
                            "float in [-1, 1] or int16 PCM.")  # fmt: skip
    shape = tuple(x.shape)
    if x.dim() == 3 and x.shape[1] > x.shape[2]:
        raise DataFileError(
            f"Waveforms {key!r} in {where} have shape {shape}, read as (N, channels, T) with "
            f"{shape[1]} channels of {shape[2]} samples: more channels than samples, so they "
            "are probably (N, T, channels), as soundfile reads them; transpose them with "
            "np.transpose(waveforms, (0, 2, 1))."
        )
    if x.dim() == 3:
        x = x.float().mean(1)
    elif x.dim() != 2:
        raise DataFileError(f"Waveforms {key!r} in {where} have shape {shape}: expected (N, T) "
                            "or (N, channels, T).")  # fmt: skip
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise DataFileError(f"Waveforms {key!r} in {where} are empty (shape {shape}).")
    x = x.float()
    bad = ~torch.isfinite(x).all(1)
    if bool(bad.any()):
        raise DataFileError(f"Waveform {int(bad.nonzero()[0])} of {key!r} in {where} has NaN or "
                            "infinite values.")  # fmt: skip
    lo, hi = float(x.min()), float(x.max())
    if lo < -1 or hi > 1:
        raise DataFileError(
            f"Waveforms {key!r} in {where} have values in [{lo:g}, {hi:g}], but must lie in "
            "[-1, 1]: scale them first (divide int16 PCM by 32767), or save int16."
        )
    return x.contiguous()


def _checked_classes(arrays: _Arrays, parts: list, labelled: bool) -> tuple | None:
    """The class names of labelled arrays (None without), checked against the labels."""
    classes = arrays.classes
    if classes is None or not labelled:
        return None
    top = max(int(y.max()) for _, y in parts if y is not None)
    if top >= len(classes):
        raise DataFileError(f"{arrays.where} names {len(classes)} classes but has label {top}.")
    return tuple(classes)


def _load_waveform_tensors(arrays: _Arrays, kind: str, opts: _Options) -> _Loaded:
    where = arrays.where
    plan = _pick_keys(arrays.keys, where, ("waveforms", "audio", "x"), "waveforms")
    parts = []
    for xkey, ykey in plan:
        x = _as_waveforms(arrays.get(xkey), xkey, where)
        y = None if ykey is None else _as_labels(arrays.get(ykey), ykey, len(x), where)
        parts.append((x, y))
    labelled = parts[0][1] is not None
    cls = _checked_classes(arrays, parts, labelled)

    def clips(x: Tensor, y: Tensor | None) -> _ArrayClips:
        labels = y if y is not None else torch.full((len(x),), -1, dtype=torch.long)
        return _ArrayClips(x, labels, arrays.sample_rate)

    if len(parts) == 2:
        return _Loaded(clips(*parts[0]), clips(*parts[1]), labelled, cls, kind,
                       "arrays x_train and x_test", None, True)  # fmt: skip
    ds = clips(*parts[0])
    stitch, test, words = _split_by_fraction(ds, ds.targets, opts, labelled, "clips")
    return _Loaded(stitch, test, labelled, cls, kind, words, None, True)


def _load_tensors(path: Path, arrays: _Arrays, kind: str, opts: _Options) -> _Loaded:
    if opts.audio or arrays.sample_rate is not None:
        return _load_waveform_tensors(arrays, kind, opts)
    where = arrays.where
    plan = _pick_keys(arrays.keys, where)
    parts: list[tuple[Tensor, Tensor | None]] = []
    for xkey, ykey in plan:
        x = _as_images(arrays.get(xkey), xkey, where)
        y = None if ykey is None else _as_labels(arrays.get(ykey), ykey, len(x), where)
        parts.append((x, y))
    if len(parts) == 2 and parts[0][0].shape[2:] != parts[1][0].shape[2:]:
        raise DataFileError(
            f"x_train and x_test in {where} have different image sizes "
            f"{tuple(parts[0][0].shape[2:])} and {tuple(parts[1][0].shape[2:])}."
        )
    labelled = parts[0][1] is not None
    cls = _checked_classes(arrays, parts, labelled)
    transform = _resizer(opts.size)

    def dataset(x: Tensor, y: Tensor | None) -> ImageTensorDataset:
        labels = y if y is not None else torch.full((len(x),), -1, dtype=torch.long)
        return ImageTensorDataset(x, labels, transform=transform, classes=cls)

    h, w = parts[0][0].shape[2:]
    image_size = (opts.size, opts.size) if opts.size else (int(h), int(w))
    if len(parts) == 2:
        words = "arrays x_train and x_test"
        return _Loaded(
            dataset(*parts[0]), dataset(*parts[1]), labelled, cls, kind, words, image_size
        )
    ds = dataset(*parts[0])
    stitch, test, words = _split_by_fraction(ds, ds.targets, opts, labelled)
    return _Loaded(stitch, test, labelled, cls, kind, words, image_size)


# ---------------------------------------------------------------------------
# Hugging Face datasets folders (save_to_disk), read with pyarrow only


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFileError(f"Cannot read {str(path)!r} as JSON: {exc}") from exc


def _read_arrow(path: Path) -> Any:
    """An Arrow IPC stream (or file) as a pyarrow Table, memory-mapped (no copy)."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(path))
    except (OSError, pa.ArrowException) as exc:
        raise DataFileError(f"Cannot open {str(path)!r}: {exc}") from exc
    try:
        return pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException):
        source.seek(0)
    try:
        return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise DataFileError(f"{str(path)!r} is not an Arrow IPC stream or file: {exc}") from exc


@dataclass
class _HFSplit:
    folder: Path
    files: list[Path]
    image_column: str
    labels: list[Any] | None  # ints (ClassLabel or int column) or strings
    names: list[str] | None  # ClassLabel names
    column: Any  # the image column (pyarrow ChunkedArray)


def _hf_split(folder: Path) -> _HFSplit:
    import pyarrow as pa

    state_path = folder / "state.json"
    if not state_path.is_file():
        raise DataFileError(
            f"{str(folder)!r} is not a Hugging Face datasets folder (no state.json)."
        )
    state = _read_json(state_path)
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if entries:
        names = [e.get("filename") if isinstance(e, dict) else None for e in entries]
        if not all(isinstance(n, str) and n for n in names):
            raise DataFileError(f"{str(state_path)!r}: _data_files entries need a filename.")
        files = [folder / n for n in names]  # type: ignore[operator]
    else:
        files = sorted(folder.glob("data-*.arrow"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise DataFileError(
            f"Arrow data files missing in {str(folder)!r}: {', '.join(missing) or 'none listed'}."
        )
    tables = [_read_arrow(f) for f in files]
    schema = tables[0].schema
    features: dict[str, Any] | None = None
    if (folder / "dataset_info.json").is_file():
        info = _read_json(folder / "dataset_info.json")
        features = info.get("features") if isinstance(info, dict) else None
    if not isinstance(features, dict) and schema.metadata and b"huggingface" in schema.metadata:
        try:
            meta = json.loads(schema.metadata[b"huggingface"])
            features = meta.get("info", {}).get("features")
        except (ValueError, AttributeError):
            features = None
    if not isinstance(features, dict):
        features = {}

    def typed(kind: str) -> str | None:
        return next(
            (
                k
                for k, v in features.items()
                if isinstance(v, dict) and v.get("_type") == kind and k in schema.names
            ),
            None,
        )

    image_col = typed("Image") or next((c for c in ("image", "img") if c in schema.names), None)
    if image_col is None:
        raise DataFileError(
            f"No image column in {str(folder)!r}: expected a feature of type Image or a column "
            f"named image or img; columns: {', '.join(schema.names)}."
        )
    label_col = typed("ClassLabel")
    names = None
    if label_col is not None:
        names = features[label_col].get("names")
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            names = None
    else:
        label_col = next((c for c in ("label", "labels") if c in schema.names), None)
    for t in tables[1:]:
        if image_col not in t.schema.names or (label_col and label_col not in t.schema.names):
            raise DataFileError(f"The Arrow files of {str(folder)!r} have different columns.")
    chunks = [ch for t in tables for ch in t.column(image_col).chunks]
    column = pa.chunked_array(chunks, type=schema.field(image_col).type)
    labels = None
    if label_col is not None:
        lab_type = schema.field(label_col).type
        if not (
            pa.types.is_integer(lab_type)
            or pa.types.is_string(lab_type)
            or pa.types.is_large_string(lab_type)
        ):
            raise DataFileError(
                f"Label column {label_col!r} in {str(folder)!r} has type {lab_type}: expected "
                "integers (ClassLabel) or strings."
            )
        labels = [v for t in tables for v in t.column(label_col).to_pylist()]
    return _HFSplit(folder, files, image_col, labels, names, column)


class _ArrowImageDataset(Dataset):
    """Rows of an Arrow image column, each decoded with Pillow when read."""

    def __init__(
        self,
        split: _HFSplit,
        targets: Tensor,
        root: Path,
        size: int | None,
        classes: Sequence[str] | None,
    ) -> None:
        self.files = split.files
        self.image_column = split.image_column
        self.folder = split.folder
        self.root = root
        self.targets = targets
        self.size = size
        self.classes = list(classes) if classes is not None else None
        self._column: Any = split.column

    def __getstate__(self) -> dict[str, Any]:  # worker processes map the files again
        state = self.__dict__.copy()
        state["_column"] = None
        return state

    def _col(self) -> Any:
        if self._column is None:
            import pyarrow as pa

            tables = [_read_arrow(f) for f in self.files]
            self._column = pa.chunked_array(
                [ch for t in tables for ch in t.column(self.image_column).chunks],
                type=tables[0].schema.field(self.image_column).type,
            )
        return self._column

    def _source(self, i: int) -> Path | bytes:
        value = self._col()[i].as_py()
        data, path = (
            (value.get("bytes"), value.get("path"))
            if isinstance(value, dict)
            else ((value, None) if isinstance(value, bytes) else (None, value))
        )
        if data is not None:
            return data
        if not path:
            raise DataFileError(
                f"Row {i} of {str(self.folder)!r} has no image (no bytes, no path)."
            )
        p = Path(path)
        for cand in (p,) if p.is_absolute() else (self.folder / p, self.root / p):
            if cand.is_file():
                return cand
        raise DataFileError(
            f"Row {i} of {str(self.folder)!r} has no image bytes and its file {path!r} "
            "was not found (relative paths are looked up in the dataset folder)."
        )

    def raw_size(self, i: int) -> tuple[int, int]:
        return _header_size(self._source(i), f"row {i} of {str(self.folder)!r}")

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        img = _read_rgb(self._source(index), f"row {index} of {str(self.folder)!r}")
        return _decode(img, self.size), int(self.targets[index])


def _load_hf(root: Path, opts: _Options) -> _Loaded:
    if (root / "dataset_dict.json").is_file():
        info = _read_json(root / "dataset_dict.json")
        splits = info.get("splits") if isinstance(info, dict) else None
        if not (isinstance(splits, list) and splits and all(isinstance(s, str) for s in splits)):
            raise DataFileError(f"{str(root / 'dataset_dict.json')!r} lists no splits.")
        test_name = next((s for s in _TEST_SPLITS if s in splits), None)
        if "train" in splits and test_name is not None:
            chosen = ["train", test_name]
        elif "train" in splits or len(splits) == 1:
            chosen = ["train" if "train" in splits else splits[0]]
        else:
            raise DataFileError(
                f"Cannot tell the train and test splits of {str(root)!r}: its splits are "
                f"{', '.join(splits)} (expected train and test or validation). Pass one "
                "split's folder to split it by a fraction."
            )
        parts = [_hf_split(root / s) for s in chosen]
    else:
        chosen = []
        parts = [_hf_split(root)]

    names = parts[0].names
    if len(parts) == 2 and parts[1].names is not None and names is not None:
        if parts[1].names != names:
            raise DataFileError(
                f"The ClassLabel names of splits {chosen[0]} and {chosen[1]} in {str(root)!r} "
                "differ."
            )
    names = names or (parts[1].names if len(parts) == 2 else None)
    label_lists = [p.labels for p in parts]
    labelled = all(lab is not None for lab in label_lists)
    classes: list[str] | None = None
    targets: list[Tensor] = []
    if labelled:
        values = [v for lab in label_lists for v in lab]  # type: ignore[union-attr]
        if any(isinstance(v, str) for v in values):
            classes = sorted({v for v in values if v is not None})
            index = {c: i for i, c in enumerate(classes)}
            targets = [
                torch.tensor([-1 if v is None else index[v] for v in lab], dtype=torch.long)
                for lab in label_lists  # type: ignore[union-attr]
            ]
        else:
            classes = names
            targets = [
                torch.tensor([-1 if v is None else int(v) for v in lab], dtype=torch.long)
                for lab in label_lists  # type: ignore[union-attr]
            ]
        missing = sum(int((t < 0).sum()) for t in targets)
        total = sum(len(t) for t in targets)
        if missing == total:
            labelled, classes = False, None  # every label is -1 (or null): no labels
        elif missing:
            raise DataFileError(
                f"{missing} of {total} rows in {str(root)!r} have no label (null or -1) while "
                "the others have one. Pass the folder of one fully labelled split to split it "
                "by a fraction, or remove the unlabelled rows."
            )
        elif classes is not None:
            top = max(int(t.max()) for t in targets)
            if top >= len(classes):
                raise DataFileError(
                    f"{str(root)!r} names {len(classes)} classes but has label {top}."
                )
    if not labelled:
        targets = [torch.full((len(p.column),), -1, dtype=torch.long) for p in parts]
    datasets = [_ArrowImageDataset(p, t, root, opts.size, classes) for p, t in zip(parts, targets)]
    cls = tuple(classes) if classes is not None else None
    if len(datasets) == 2:
        words = f"splits {chosen[0]} and {chosen[1]}"
        return _Loaded(datasets[0], datasets[1], labelled, cls, "hf-datasets", words, None)
    stitch, test, words = _split_by_fraction(datasets[0], targets[0], opts, labelled)
    if chosen:
        words = f"split {chosen[0]}: " + words
    return _Loaded(stitch, test, labelled, cls, "hf-datasets", words, None)
