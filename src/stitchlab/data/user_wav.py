"""Audio clips: uncompressed PCM ``.wav`` files read with the standard library's
:mod:`wave`, and clips held as arrays, resampled and centred into waveforms."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .speech import WaveformDataset
from .tensors import DataFileError
from .user_common import _unwrap

_AUDIO_EXTENSIONS = (".wav",)


_CONVERT = (
    "Only uncompressed PCM WAV (8, 16, 24 or 32-bit integer samples) is read; convert it, "
    "e.g. `ffmpeg -i IN -c:a pcm_s16le OUT.wav` or `sox IN -b 16 -e signed-integer OUT.wav`."
)


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
