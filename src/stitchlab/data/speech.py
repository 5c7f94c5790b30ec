"""Spoken words synthesised offline with espeak-ng, and the class-coded beep marker.

* :func:`spoken_digits`: "zero" .. "nine" (labels 0-9), the speech counterpart of the
  generated image data sets; :func:`spoken_words` is the general generator behind it.
* :class:`WaveformDataset`: waveforms held in memory, items ``(waveform (1, T), label)``
  with the waveform float32 in [-1, 1].
* :class:`Beeped`: a class-coded tone (100 ms at ``500 + 300 x class`` Hz) added to every
  clip, the audio counterpart of the image markers (:class:`stitchlab.data.Marked`);
  ``rolled=True`` gives each class the tone of the next class.

How a clip is made: espeak-ng (a Debian/Homebrew package that runs offline) speaks the word
in one of several English accents (``-v en-us``, ``en-gb-scotland``, ...) with a voice
variant (``+m3``, ``+f2``, ``+Storm``, ... as listed by ``espeak-ng --voices=variant``), at a
speed drawn from 110-210 words per minute and a pitch from 15-85. The 22,050 Hz output is
trimmed of its leading and trailing silence, resampled (windowed-sinc, anti-aliased) to
``sample_rate``, scaled to a peak of ``level`` times a gain drawn within +-``gain_db`` dB,
and placed at a random offset in a window of ``duration`` seconds (a word longer than the
window is cut, with a 10 ms fade). Clips are stored as 16-bit PCM (``round(x * 32767)``),
so a cached set and a freshly generated one are identical to the bit.

The test split is spoken by held-out voices: the variants are split once (a fixed shuffle,
independent of ``seed``) into training and test variants, so no (accent, variant) voice is
in both splits, whatever the seeds. Ten consecutive clips share a voice (one espeak-ng call
speaks them, each word with its own speed and pitch through espeak's embedded commands,
and the output is cut at the silences between them; a call whose silences do not match the
words is spoken again one word per call), which makes generation ~5x faster than one call
per clip.

Background noise: espeak-ng's silence is digital zero, which no recording has and which a
log-mel front end hears at -100 dB (measured on the demo's mel CNN: noise of +-4 PCM levels
in the silent samples moves its first block 0.19-0.63 of the representation's norm, so no
int16 IRI can match it). Every clip therefore gets white noise ``noise_db`` dB below full
scale (default -60 dB, standard deviation 0.001, about 45 dB below the speech), drawn from
the seed and split and added when the set is read, so the cached speech is unchanged.

With ``cache=FOLDER`` the generated set is stored there as safetensors (never pickle) with a
checksummed JSON description, keyed by a hash of every setting and of the espeak-ng
version, and reused by a later call with the same settings.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import shutil
import subprocess
import warnings
import wave
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .markers import _mix
from .tensors import labels_of

__all__ = [
    "DIGITS",
    "ACCENTS",
    "SpeechSynthesisError",
    "EspeakNotFoundError",
    "WaveformDataset",
    "Beeped",
    "beep_frequency",
    "spoken_digits",
    "spoken_words",
    "espeak_version",
    "espeak_variants",
    "resample",
]

FORMAT_VERSION = 1
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
#: The English accents (espeak-ng voices) clips are spoken in by default.
ACCENTS = (
    "en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan",
    "en-gb-x-gbcwmd", "en-us-nyc",
)  # fmt: skip
PCM_SCALE = 32767  # int16 levels of a clip: round(x * PCM_SCALE), symmetric around 0
INSTALL_HINT = (
    "Install it with `sudo apt-get install espeak-ng` (Debian/Ubuntu) or "
    "`brew install espeak-ng` (macOS); it runs offline."
)
_GROUP_GAP = "50"  # espeak-ng -g: pause between the words of one call (10 ms units)
_MIN_GAP_S = 0.2  # a silence at least this long separates two words of one call
_SILENCE = 0.01  # samples below this fraction of the peak count as silence


class SpeechSynthesisError(RuntimeError):
    """espeak-ng is missing, failed, or cannot speak what was asked."""


class EspeakNotFoundError(SpeechSynthesisError):
    """The espeak-ng program is not installed (or not on PATH)."""


# ---------------------------------------------------------------------------
# espeak-ng


def _espeak() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise EspeakNotFoundError(
            "Speech data sets (spoken_digits, spoken_words) are synthesised with espeak-ng, "
            f"which is not installed (not found on PATH). {INSTALL_HINT}"
        )
    return path


def _run(args: Sequence[str], what: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run([_espeak(), *args], capture_output=True, check=False)
    except OSError as exc:
        raise SpeechSynthesisError(
            f"espeak-ng could not be started ({exc}). {INSTALL_HINT}"
        ) from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise SpeechSynthesisError(f"espeak-ng failed on {what} (exit {proc.returncode}): {err}")
    return proc


@lru_cache(maxsize=4)
def _version(path: str) -> str:
    out = _run(["--version"], "--version").stdout.decode(errors="replace")
    m = re.search(r"text-to-speech:\s*(\S+)", out)
    return m.group(1) if m else out.split("Data at")[0].strip()


def espeak_version() -> str:
    """The installed espeak-ng's version ("1.51"); part of every speech cache key."""
    return _version(_espeak())


@lru_cache(maxsize=4)
def _voice_lists(path: str) -> tuple[tuple[str, ...], frozenset[str]]:
    variants = []
    for line in _run(["--voices=variant"], "--voices=variant").stdout.decode().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 5 and parts[4].startswith("!v/"):
            variants.append(parts[4][3:])
    languages = set()
    for line in _run(["--voices"], "--voices").stdout.decode().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 5:
            languages.add(parts[1].lower())
            languages.add(parts[4].rsplit("/", 1)[-1].lower())
    return tuple(sorted(set(variants))), frozenset(languages)


def espeak_variants() -> list[str]:
    """The voice variants of the installed espeak-ng (``m3``, ``f2``, ``Storm``, ...), sorted."""
    return list(_voice_lists(_espeak())[0])


def _check_voices(accents: Sequence[str], variants: Sequence[str]) -> None:
    known_variants, languages = _voice_lists(_espeak())
    bad = [a for a in accents if a.lower() not in languages]
    if bad:
        raise SpeechSynthesisError(
            f"espeak-ng has no voice {', '.join(map(repr, bad))} (espeak-ng silently speaks "
            "another one); see `espeak-ng --voices=en`."
        )
    bad = [v for v in variants if v not in known_variants]
    if bad:
        raise SpeechSynthesisError(
            f"espeak-ng has no voice variant {', '.join(map(repr, bad[:5]))}; see "
            "`espeak-ng --voices=variant` (the name after '!v/')."
        )


def _parse_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Samples (float64 in [-1, 1]) and rate of espeak-ng's 16-bit mono WAV output. Its
    header's length is a placeholder when written to stdout, so the data are read to the
    end."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise SpeechSynthesisError(f"espeak-ng wrote no valid WAV audio ({exc})") from None
    if width != 2 or channels != 1:
        raise SpeechSynthesisError(f"unexpected espeak-ng audio: {channels} channels of {width} B")
    n = len(frames) // 2
    return np.frombuffer(frames[: 2 * n], "<i2").astype(np.float64) / 32768.0, rate


def _speak(voice: str, text: str, extra: Sequence[str] = ()) -> tuple[np.ndarray, int]:
    proc = _run(["-v", voice, *extra, "--stdout", text], f"voice {voice!r}")
    return _parse_wav(proc.stdout)


def _command(word: str, speed: int, pitch: int) -> str:
    # espeak's embedded commands (Ctrl-A, value, letter): S speed (wpm), P pitch (0-99)
    return f"\x01{int(speed)}S\x01{int(pitch)}P {word}"


def _trim(x: np.ndarray) -> np.ndarray:
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak == 0.0:
        return x[:0]
    loud = np.nonzero(np.abs(x) > _SILENCE * peak)[0]
    return x[loud[0] : loud[-1] + 1]


def _split_words(x: np.ndarray, rate: int, n: int) -> list[np.ndarray] | None:
    """Cut the output of one call into its ``n`` words at the silences between them, or
    None when the silences do not separate exactly ``n`` pieces."""
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak == 0.0:
        return None
    frame = max(1, rate // 100)
    nf = len(x) // frame
    env = np.abs(x[: nf * frame]).reshape(nf, frame).max(1) > _SILENCE * peak
    loud = np.nonzero(env)[0]
    if loud.size == 0:
        return None
    gaps = np.nonzero(np.diff(loud) > _MIN_GAP_S * 100)[0]
    if len(gaps) != n - 1:
        return None
    cuts = [0, *(((loud[g] + 1 + loud[g + 1]) // 2) * frame for g in gaps), len(x)]
    pieces = [_trim(x[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    return pieces if all(p.size for p in pieces) else None


def _speak_group(voice: str, words: Sequence[str], speeds, pitches) -> tuple[list, int]:
    """The trimmed waveforms (at espeak's rate) of ``words`` in ``voice``, one call for all
    of them when they can be cut apart, else one call per word."""
    if len(words) > 1 and not any(" " in w for w in words):
        text = " ".join(_command(w, s, p) + "." for w, s, p in zip(words, speeds, pitches))
        x, rate = _speak(voice, text, ["-g", _GROUP_GAP])
        pieces = _split_words(x, rate, len(words))
        if pieces is not None:
            return pieces, rate
    out, rate = [], 0
    for w, s, p in zip(words, speeds, pitches):
        x, rate = _speak(voice, w, ["-s", str(int(s)), "-p", str(int(p))])
        x = _trim(x)
        if not x.size:
            raise SpeechSynthesisError(f"espeak-ng spoke nothing for {w!r} in voice {voice!r}")
        out.append(x)
    return out, rate


# ---------------------------------------------------------------------------
# Signal helpers


def _kernel(d: np.ndarray, cutoff: float, half: int) -> np.ndarray:
    beta = 8.6
    w = np.i0(beta * np.sqrt(np.clip(1 - (d / half) ** 2, 0, None))) / np.i0(beta)
    return 2 * cutoff * np.sinc(2 * cutoff * d) * w


@lru_cache(maxsize=16)
def _polyphase(rate_in: int, rate_out: int, zeros: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(up, down, taps, filter table (up, taps)) of a rational rate change."""
    g = math.gcd(rate_in, rate_out)
    up, down = rate_out // g, rate_in // g
    cutoff = 0.95 * 0.5 * min(rate_in, rate_out) / rate_in  # cycles per input sample
    half = int(math.ceil(zeros / (2 * cutoff)))  # half width in input samples
    taps = np.arange(-half + 1, half + 1)
    d = np.arange(up)[:, None] / up - taps[None, :]  # distance of each tap from the output
    return up, down, taps, _kernel(d, cutoff, half)


def resample(x: np.ndarray, rate_in: int, rate_out: int, zeros: int = 16) -> np.ndarray:
    """``x`` (1-D) resampled from ``rate_in`` to ``rate_out`` Hz by windowed-sinc
    interpolation (Kaiser window, ``zeros`` zero crossings each side), low-passed at 95% of
    the lower Nyquist frequency so that nothing aliases. The output has
    ``floor(len(x) * rate_out / rate_in)`` samples; output ``n`` is at input time
    ``n * rate_in / rate_out``."""
    x = np.asarray(x, dtype=np.float64)
    if rate_in == rate_out or x.size == 0:
        return x.copy()
    up, down, taps, table = _polyphase(int(rate_in), int(rate_out), int(zeros))
    n_out = (len(x) * up) // down
    steps = np.arange(n_out, dtype=np.int64) * down
    base, phase = steps // up, steps % up
    pad = len(taps)
    xp = np.concatenate([np.zeros(pad), x, np.zeros(pad)])
    vals = xp[base[:, None] + taps[None, :] + pad]
    return np.einsum("nt,nt->n", vals, table[phase])


def _to_pcm(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * PCM_SCALE), -PCM_SCALE, PCM_SCALE).astype(np.int16)


# ---------------------------------------------------------------------------
# Data sets


class WaveformDataset(Dataset):
    """Waveforms held in memory with integer labels.

    Items are ``(waveform, label)``: a float32 waveform ``(C, T)`` in [-1, 1] (int16 PCM is
    divided by 32767) passed through ``transform`` if given, and an ``int`` label.
    ``voices`` (one name per clip, e.g. ``"en-us+m3"``) says who speaks each clip.
    """

    def __init__(
        self,
        waveforms: Tensor,
        labels: Tensor | Sequence[int],
        *,
        sample_rate: int,
        classes: Sequence[str] | None = None,
        voices: Sequence[str] | None = None,
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        labels = torch.as_tensor(labels, dtype=torch.long)
        if waveforms.dim() != 3 or len(waveforms) != len(labels):
            raise ValueError(
                f"expected waveforms (N, C, T) and labels (N,), got {tuple(waveforms.shape)} "
                f"and {tuple(labels.shape)}"
            )
        if waveforms.dtype != torch.int16 and not waveforms.is_floating_point():
            raise ValueError(f"waveforms must be int16 or floating point, got {waveforms.dtype}")
        if voices is not None and len(voices) != len(labels):
            raise ValueError(f"{len(voices)} voices for {len(labels)} clips")
        self.waveforms = waveforms
        self.targets = labels
        self.sample_rate = int(sample_rate)
        self.classes = list(classes) if classes is not None else None
        self.voices = list(voices) if voices is not None else None
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        x = self.waveforms[index]
        x = x.float().div_(PCM_SCALE) if x.dtype == torch.int16 else x
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.targets[index])

    def tensors(self) -> tuple[Tensor, Tensor]:
        """All ``(waveforms as float32 (N, C, T), labels)`` (without the transform)."""
        w = self.waveforms
        w = w.float().div_(PCM_SCALE) if w.dtype == torch.int16 else w.float()
        return w, self.targets.clone()

    @property
    def num_classes(self) -> int:
        """Number of classes (from ``classes`` or the largest label)."""
        return len(self.classes) if self.classes else int(self.targets.max()) + 1

    @property
    def duration(self) -> float:
        """Seconds per clip."""
        return self.waveforms.shape[-1] / self.sample_rate


def beep_frequency(label: int, base: float = 500.0, step: float = 300.0) -> float:
    """The tone of class ``label``: ``base + step * label`` Hz."""
    return base + step * int(label)


class Beeped(Dataset):
    """Wrap a data set of ``(waveform (C, T), label, ...)`` and add a class-coded beep.

    The beep is a tone of ``duration`` seconds at :func:`beep_frequency` of the class, with
    amplitude ``amplitude`` and 5 ms raised-cosine ramps, added at ``position``: ``"random"``
    (drawn from ``(seed, index)`` only, so marked sets are deterministic) or a fraction in
    [0, 1] of the free range (0: at the start). The sum is clipped to [-1, 1].
    ``rolled=True`` gives every class the beep of class ``(label + roll) % num_classes``
    (the test set for excess agreement). ``random_class=True`` gives every clip the tone
    of a class drawn from ``(seed, index)``, independent of its label (marker
    ``"beep-rand"``): a model trained on it learns to ignore beeps. Labels are returned
    unchanged.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        num_classes: int | None = None,
        seed: int = 0,
        position: str | float = "random",
        rolled: bool = False,
        roll: int = 1,
        random_class: bool = False,
        amplitude: float = 0.3,
        duration: float = 0.1,
        base: float = 500.0,
        step: float = 300.0,
        sample_rate: int | None = None,
    ) -> None:
        if num_classes is None:
            classes = getattr(dataset, "classes", None)
            num_classes = len(classes) if classes else int(labels_of(dataset).max()) + 1
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        rate = sample_rate or getattr(dataset, "sample_rate", None)
        if not rate:
            raise ValueError("give sample_rate= (the data set does not say its sample rate)")
        top = beep_frequency(num_classes - 1, base, step)
        if top >= rate / 2:
            raise ValueError(
                f"the beep of class {num_classes - 1} ({top:g} Hz) is above the Nyquist "
                f"frequency of {rate} Hz audio; lower base/step"
            )
        if position != "random" and not (isinstance(position, (int, float)) and 0 <= position <= 1):
            raise ValueError(f"position must be 'random' or a fraction in [0, 1], got {position!r}")
        self.dataset = dataset
        self.num_classes = num_classes
        self.seed = seed
        self.position = position
        if rolled and random_class:
            raise ValueError("rolled and random_class exclude each other")
        self.rolled = rolled
        self.roll = roll if rolled else 0
        self.random_class = bool(random_class)
        self.amplitude = float(amplitude)
        self.sample_rate = int(rate)
        self.base, self.step = float(base), float(step)
        self.length = max(1, round(duration * self.sample_rate))
        self.classes = getattr(dataset, "classes", None)
        t = np.arange(self.length) / self.sample_rate
        ramp = min(self.length // 2, round(0.005 * self.sample_rate))
        env = np.ones(self.length)
        if ramp > 0:
            r = 0.5 - 0.5 * np.cos(np.pi * (np.arange(ramp) + 0.5) / ramp)
            env[:ramp], env[-ramp:] = r, r[::-1]
        self._tones = torch.tensor(
            np.stack(
                [
                    self.amplitude * env * np.sin(2 * np.pi * beep_frequency(c, base, step) * t)
                    for c in range(num_classes)
                ]
            ),
            dtype=torch.float32,
        )

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def targets(self) -> Tensor:
        """The labels (unchanged by the beep)."""
        return labels_of(self.dataset)

    @property
    def voices(self) -> list[str] | None:
        """The base data set's voices, if it has them."""
        return getattr(self.dataset, "voices", None)

    def beep(self, index: int, label: int, length: int) -> tuple[int, int]:
        """``(class whose tone is added, start sample)`` for item ``index``."""
        c = (int(label) + self.roll) % self.num_classes
        free = max(0, length - self.length)
        g = torch.Generator().manual_seed(_mix(self.seed, index, 0xBEE))
        u = torch.rand(2, generator=g)  # a position draw and a class draw, always both
        frac = float(u[0]) if self.position == "random" else float(self.position)
        if self.random_class:
            c = min(int(u[1] * self.num_classes), self.num_classes - 1)
        return c, min(int(frac * (free + 1)), free)

    def __getitem__(self, index: int):
        item = self.dataset[index]
        x, y = item[0], item[1]
        if x.dim() != 2:
            raise ValueError(f"beeps need waveforms (C, T); got {tuple(x.shape)}")
        c, start = self.beep(index, int(y), x.shape[-1])
        n = min(self.length, x.shape[-1] - start)
        x = x.clone()
        x[:, start : start + n] += self._tones[c, :n].to(x.dtype)
        x.clamp_(-1, 1)
        return (x, y, *item[2:])


# ---------------------------------------------------------------------------
# Generation


def _split_variants(variants: Sequence[str], test_variants: float) -> tuple[list, list]:
    """(training variants, test variants): a fixed shuffle of the sorted names."""
    names = sorted(variants)
    order = np.random.default_rng(0x5EED).permutation(len(names))
    k = int(round(test_variants * len(names)))
    if len(names) >= 2:
        k = min(max(k, 1), len(names) - 1)
    test = sorted(names[i] for i in order[:k])
    train = sorted(names[i] for i in order[k:])
    return train, test


def _plan(n: int, num_words: int, rng: np.random.Generator, accents, variants, settings) -> dict:
    """Every random choice of a split, drawn before anything is spoken."""
    group = settings["group_size"]
    labels = rng.permutation(np.arange(n) % num_words)
    groups = max(1, math.ceil(n / group))
    accent_g = rng.integers(0, len(accents), groups)
    variant_g = rng.integers(0, len(variants), groups)
    g_of = np.arange(n) // group
    lo_s, hi_s = settings["speed"]
    lo_p, hi_p = settings["pitch"]
    return {
        "labels": labels.astype(np.int64),
        "accent": accent_g[g_of].astype(np.int64),
        "variant": variant_g[g_of].astype(np.int64),
        "speed": rng.integers(lo_s, hi_s + 1, n).astype(np.int64),
        "pitch": rng.integers(lo_p, hi_p + 1, n).astype(np.int64),
        "gain_db": rng.uniform(-settings["gain_db"], settings["gain_db"], n),
        "offset": rng.random(n),
    }


def _place(x: np.ndarray, rate_in: int, settings: dict, gain_db: float, u: float) -> np.ndarray:
    rate, length = settings["sample_rate"], settings["length"]
    x = resample(x, rate_in, rate)
    if len(x) > length:  # longer than the window: cut, with a 10 ms fade-out
        x = x[:length].copy()
        fade = min(length, max(1, rate // 100))
        x[-fade:] *= np.linspace(1, 0, fade)
    peak = float(np.abs(x).max())
    if peak == 0.0:
        raise SpeechSynthesisError("espeak-ng spoke a silent clip")
    x = x * (settings["level"] * 10 ** (gain_db / 20) / peak)
    out = np.zeros(length)
    start = min(int(u * (length - len(x) + 1)), length - len(x))
    out[start : start + len(x)] = x
    return out


def _generate_split(words, plan: dict, accents, variants, settings, workers: int) -> np.ndarray:
    n, group = len(plan["labels"]), settings["group_size"]
    out = np.zeros((n, 1, settings["length"]), dtype=np.int16)

    def one(a: int) -> None:  # speak clips a .. a + group - 1 and place them in ``out``
        b = min(n, a + group)
        voice = f"{accents[plan['accent'][a]]}+{variants[plan['variant'][a]]}"
        said = [words[i] for i in plan["labels"][a:b]]
        pieces, rate_in = _speak_group(voice, said, plan["speed"][a:b], plan["pitch"][a:b])
        for i, x in zip(range(a, b), pieces):
            placed = _place(x, rate_in, settings, plan["gain_db"][i], plan["offset"][i])
            out[i, 0] = _to_pcm(placed)

    starts = range(0, n, group)
    if workers > 1 and len(starts) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, starts))  # list(): re-raise the first error
    else:
        for a in starts:
            one(a)
    return out


def _settings(words, n_train, n_test, seed, sample_rate, duration, accents, variants,
              test_variants, speed, pitch, gain_db, level, group_size) -> dict:  # fmt: skip
    return {
        "format": FORMAT_VERSION,
        "words": list(words),
        "n_train": int(n_train),
        "n_test": int(n_test),
        "seed": int(seed),
        "sample_rate": int(sample_rate),
        "length": int(round(duration * sample_rate)),
        "accents": list(accents),
        "variants": list(variants),
        "test_variants": float(test_variants),
        "speed": [int(speed[0]), int(speed[1])],
        "pitch": [int(pitch[0]), int(pitch[1])],
        "gain_db": float(gain_db),
        "level": float(level),
        "group_size": int(group_size),
    }


def _check_args(words, n_train, n_test, sample_rate, duration, speed, pitch, level,
                group_size, test_variants) -> None:  # fmt: skip
    if len(words) < 2:
        raise ValueError(f"give at least 2 words (one class each), got {list(words)}")
    if len(set(words)) != len(words):
        raise ValueError("the words must be distinct (one class each)")
    for w in words:
        if not isinstance(w, str) or not w.strip() or any(ord(ch) < 32 for ch in w):
            raise ValueError(f"each word must be non-empty printable text, got {w!r}")
        if w.lstrip().startswith("-"):
            raise ValueError(f"a word may not start with '-' (an espeak-ng option): {w!r}")
    for name, v in (("n_train", n_train), ("n_test", n_test)):
        if int(v) < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    if sample_rate < 1000:
        raise ValueError(f"sample_rate must be at least 1000 Hz, got {sample_rate}")
    if duration <= 0:
        raise ValueError(f"duration must be positive, got {duration}")
    if not 80 <= speed[0] <= speed[1] <= 450:
        raise ValueError(f"speed must be (low, high) words per minute within 80-450, got {speed}")
    if not 0 <= pitch[0] <= pitch[1] <= 99:
        raise ValueError(f"pitch must be (low, high) within 0-99, got {pitch}")
    if not 0 < level <= 1:
        raise ValueError(f"level must be in (0, 1], got {level}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if not 0 < test_variants < 1:
        raise ValueError(f"test_variants must be a fraction in (0, 1), got {test_variants}")


def _load_cached(path: Path, meta_path: Path, key: str) -> dict[str, Tensor] | None:
    from safetensors.torch import load_file

    from ..store import DamagedEntry, file_sha256, read_json

    if not path.exists() or not meta_path.exists():
        return None
    try:
        meta = read_json(meta_path)
    except DamagedEntry as exc:
        warnings.warn(f"{meta_path} is damaged ({exc.why}); regenerating.", stacklevel=4)
        return None
    if meta.get("key") != key or meta.get("sha256") != file_sha256(path):
        warnings.warn(f"{path} is damaged (checksum mismatch); regenerating.", stacklevel=4)
        return None
    try:
        return load_file(str(path))
    except Exception as exc:  # damaged despite its checksum: regenerate
        warnings.warn(f"{path} cannot be read ({exc}); regenerating.", stacklevel=4)
        return None


def _with_noise(pcm: Tensor, noise_db: float, seed: int, split: int) -> Tensor:
    """int16 clips plus white noise ``noise_db`` dB below full scale (seeded), as int16."""
    if not noise_db < 0:
        raise ValueError(f"noise_db is dB below full scale, so negative; got {noise_db!r}")
    g = torch.Generator().manual_seed(_mix(seed, split, 0x401_5E))
    noise = torch.randn(pcm.shape, generator=g).mul_(PCM_SCALE * 10 ** (noise_db / 20))
    return noise.add_(pcm).round_().clamp_(-PCM_SCALE, PCM_SCALE).to(torch.int16)


def spoken_words(
    words: Sequence[str],
    n_train: int,
    n_test: int,
    *,
    seed: int = 0,
    sample_rate: int = 8000,
    duration: float = 1.0,
    cache: str | Path | None = None,
    marker: str | None = None,
    rolled: bool = False,
    marker_options: dict | None = None,
    accents: Sequence[str] = ACCENTS,
    variants: Sequence[str] | None = None,
    test_variants: float = 0.2,
    speed: tuple[int, int] = (110, 210),
    pitch: tuple[int, int] = (15, 85),
    gain_db: float = 6.0,
    level: float = 0.35,
    group_size: int = 10,
    workers: int = 2,
    noise_db: float | None = -60.0,
) -> tuple[Dataset, Dataset]:
    """``(train, test)`` clips of ``words`` (label ``i`` is ``words[i]``), spoken by espeak-ng.

    Args:
        words: the class words (or short phrases; a phrase is spoken one call per clip).
        n_train: clips in the training split; labels are balanced (the first
            ``n % len(words)`` words get one more).
        n_test: clips in the test split (spoken by the held-out voices).
        seed: every random choice (voices, speeds, pitches, gains, offsets, label order).
        sample_rate: samples per second of the clips (espeak-ng's 22,050 Hz resampled).
        duration: seconds per clip: the clips are ``(1, round(duration * sample_rate))``.
        cache: a folder to store the generated clips in and reuse them from.
        marker: ``"beep"`` adds the class-coded tone of :class:`Beeped` to both splits,
            ``"beep-rand"`` the tone of a random class (uninformative).
        rolled: with the marker, every clip gets the tone of the next class.
        marker_options: further :class:`Beeped` options (``position``, ``amplitude``, ...).
        accents: espeak-ng voices (accents) to draw from (default :data:`ACCENTS`).
        variants: voice variants to draw from (default: all of ``espeak-ng --voices=variant``).
        test_variants: fraction of the variants held out for the test split.
        speed: inclusive range of speaking rates (words per minute).
        pitch: inclusive range of espeak's pitch (0-99).
        gain_db: the gain is uniform within +-``gain_db`` dB around a peak of ``level``.
        level: the peak amplitude of a clip before its gain.
        group_size: consecutive clips spoken by one voice in one espeak-ng call.
        workers: espeak-ng processes run at a time.
        noise_db: white background noise (standard deviation ``10 ** (noise_db / 20)`` of
            full scale) added to every clip when it is read; None: digital silence.

    Returns:
        two :class:`WaveformDataset` (or :class:`Beeped` around them) whose items are
        ``(float32 (1, T) in [-1, 1], label)`` and whose ``voices`` name each clip's voice.

    Raises:
        EspeakNotFoundError: espeak-ng is not installed (the message says how to install
            it); SpeechSynthesisError: it failed or lacks a requested voice.
    """
    words = [str(w) for w in words]
    _check_args(words, n_train, n_test, sample_rate, duration, speed, pitch, level,
                group_size, test_variants)  # fmt: skip
    if marker not in (None, "beep", "beep-rand"):
        raise ValueError(f"marker must be None, 'beep' or 'beep-rand', got {marker!r}")
    if marker is None and (rolled or marker_options):
        raise ValueError("rolled and marker_options need marker='beep'")
    version = espeak_version()  # also: a clear error if espeak-ng is missing
    variants = sorted(variants) if variants is not None else espeak_variants()
    if len(variants) < 2:
        raise ValueError("give at least 2 voice variants (one is held out for the test split)")
    train_var, test_var = _split_variants(variants, test_variants)
    settings = _settings(
        words, n_train, n_test, seed, sample_rate, duration, accents, variants, test_variants,
        speed, pitch, gain_db, level, group_size,
    )  # fmt: skip
    key_parts = {**settings, "espeak_ng": version}
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:24]

    def make() -> dict[str, Tensor]:
        _check_voices(accents, variants)
        out: dict[str, Tensor] = {}
        for split, n, pool in (("train", n_train, train_var), ("test", n_test, test_var)):
            rng = np.random.default_rng([seed, 0 if split == "train" else 1])
            plan = _plan(int(n), len(words), rng, accents, pool, settings)
            audio = (
                _generate_split(words, plan, accents, pool, settings, workers)
                if n
                else np.zeros((0, 1, settings["length"]), dtype=np.int16)
            )
            out[f"{split}_audio"] = torch.from_numpy(audio)
            for k in ("labels", "accent", "variant", "speed", "pitch"):
                out[f"{split}_{k}"] = torch.from_numpy(plan[k])
        return out

    if cache is None:
        tensors = make()
    else:
        from safetensors.torch import save_file

        from ..store import atomic_write, file_sha256, lock, write_json

        folder = Path(cache)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"spoken-{key}.safetensors"
        meta_path = folder / f"spoken-{key}.json"
        with lock(folder / f".spoken-{key}.lock", f"the speech data {path}"):
            tensors = _load_cached(path, meta_path, key)
            if tensors is None:
                tensors = make()
                atomic_write(path, lambda p: save_file(tensors, p))
                write_json(meta_path, {**key_parts, "key": key, "sha256": file_sha256(path)})

    splits = []
    for index, (split, pool) in enumerate((("train", train_var), ("test", test_var))):
        pairs = zip(tensors[f"{split}_accent"].tolist(), tensors[f"{split}_variant"].tolist())
        voices = [f"{accents[a]}+{pool[v]}" for a, v in pairs]
        audio = tensors[f"{split}_audio"]
        if noise_db is not None:
            audio = _with_noise(audio, noise_db, seed, index)
        ds: Dataset = WaveformDataset(
            audio, tensors[f"{split}_labels"], sample_rate=sample_rate,
            classes=words, voices=voices,
        )  # fmt: skip
        if marker is not None:
            random_class = marker == "beep-rand"
            ds = Beeped(ds, rolled=rolled and not random_class, random_class=random_class,
                        **(marker_options or {}))  # fmt: skip
        splits.append(ds)
    return splits[0], splits[1]


def spoken_digits(
    n_train: int,
    n_test: int,
    *,
    seed: int = 0,
    sample_rate: int = 8000,
    duration: float = 1.0,
    cache: str | Path | None = None,
    marker: str | None = None,
    rolled: bool = False,
    **options,
) -> tuple[Dataset, Dataset]:
    """``(train, test)`` spoken digits "zero" .. "nine" (labels 0-9), the test split spoken
    by held-out voices; see :func:`spoken_words` for every option."""
    return spoken_words(
        DIGITS, n_train, n_test, seed=seed, sample_rate=sample_rate, duration=duration,
        cache=cache, marker=marker, rolled=rolled, **options,
    )  # fmt: skip
