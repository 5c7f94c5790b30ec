"""Speech models: a log-mel CNN and a raw-waveform CNN, both for input ``(N, 1, T)``.

==============  ==========================================================  ======
name            what                                                        points
==============  ==========================================================  ======
``mel_cnn``     log-mel front end (a Hann-window DFT + triangular mel filters,  4
                inside the network), 4 blocks Conv2d-BN-ReLU (stride 2)
                over (mel, time), global pooling, Linear; ~100k parameters
``wave_cnn``    M5-like raw-waveform CNN: 4 blocks Conv1d-BN-ReLU-MaxPool    4
                (the first a strided 80-tap filter bank), global pooling,
                Linear; ~25k parameters
==============  ==========================================================  ======

Both trace with torch.fx, so :func:`stitchlab.split` cuts them exactly at ``blocks.0`` ..
``blocks.3``; the mel CNN's points are maps (NCHW over mel x time), the waveform CNN's
sequences (NCL, channels x time), so a mel -> waveform pair stitches over channels with the
time axis resized. An IRI of either is a waveform: the mel front end is differentiable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from . import conv_blocks, register

__all__ = ["LogMel", "MelCNN", "WaveCNN", "dft_kernels", "mel_filterbank", "SPEECH_MODELS"]

#: The registry's speech models (input ``(N, 1, T)`` waveforms): experiment configs pair
#: them with speech data only.
SPEECH_MODELS = ("mel_cnn", "wave_cnn")


def _hz_to_mel(f):
    return 2595.0 * math.log10(1.0 + f / 700.0)


def _mel_to_hz(m: Tensor) -> Tensor:
    return 700.0 * (10 ** (m / 2595.0) - 1.0)


def mel_filterbank(
    n_fft: int, n_mels: int, sample_rate: int, f_min: float = 0.0, f_max: float | None = None
) -> Tensor:
    """Triangular mel filters ``(n_mels, n_fft // 2 + 1)`` (HTK mel scale, each filter
    rising from the previous centre to its own and falling to the next, peak 1)."""
    f_max = sample_rate / 2 if f_max is None else f_max
    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    mels = torch.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2, dtype=torch.float64)
    edges = _mel_to_hz(mels)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None, :] - lo) / (mid - lo)
    down = (hi - freqs[None, :]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0).float()


class LogMel(nn.Module):
    """Waveforms ``(N, 1, T)`` to log-mel spectrograms ``(N, 1, n_mels, frames)``:
    power STFT (Hann window, centred, reflect padding), mel filters, ``log(1e-6 + mel)``.

    The STFT is one strided ``conv1d`` with the windowed cosine and sine rows of the DFT as
    its kernels. It equals ``torch.stft(..., center=True, return_complex=True)`` to float32
    rounding (the tests hold it within 2e-5 on the log-mel) and its backward pass, which
    every IRI step through this front end pays, is cheaper than the complex FFT's
    (``benchmarks/mel_front.py``).
    """

    def __init__(
        self, sample_rate: int = 8000, n_fft: int = 256, hop: int = 80, n_mels: int = 40
    ) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("dft", dft_kernels(n_fft), persistent=False)
        self.register_buffer(
            "filters", mel_filterbank(n_fft, n_mels, sample_rate), persistent=False
        )

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        half = self.n_fft // 2
        x = nn.functional.pad(x.flatten(0, 1).unsqueeze(1), (half, half), mode="reflect")
        spec = nn.functional.conv1d(x, self.dft, stride=self.hop)  # (N, 2F, frames)
        re, im = spec.chunk(2, dim=1)
        power = re * re + im * im  # (N, F, frames)
        mel = torch.matmul(self.filters, power)  # (N, n_mels, frames)
        return torch.log(mel + 1e-6).unsqueeze(1)


def dft_kernels(n_fft: int) -> Tensor:
    """The one-sided DFT of a periodic Hann-windowed frame as ``conv1d`` kernels
    ``(2 (n_fft // 2 + 1), 1, n_fft)``: the real parts' rows, then the imaginary parts'."""
    k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[:, None]
    t = torch.arange(n_fft, dtype=torch.float64)[None, :]
    angle = 2 * math.pi * k * t / n_fft
    window = torch.hann_window(n_fft, dtype=torch.float64)
    return torch.cat([torch.cos(angle) * window, -torch.sin(angle) * window]).float()[:, None]


def _init(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


class MelCNN(nn.Module):
    """Log-mel front end, input BatchNorm, four Conv2d-BN-ReLU blocks of stride 2 over
    (mel, time), global average pooling, Linear.

    Stitch points ``blocks.0`` .. ``blocks.3`` (1 s at 8 kHz, 40 mels: 20x51, 10x26, 5x13,
    3x7 maps of ``width x (1, 1.5, 2, 3)`` channels).
    """

    def __init__(
        self,
        num_classes: int = 10,
        width: int = 32,
        sample_rate: int = 8000,
        n_mels: int = 40,
        n_fft: int = 256,
        hop: int = 80,
    ) -> None:
        super().__init__()
        self.front = LogMel(sample_rate, n_fft, hop, n_mels)
        self.norm = nn.BatchNorm2d(1)
        chans = [width, width * 3 // 2, width * 2, width * 3]
        self.blocks = conv_blocks(1, chans, strides=(2,) * len(chans))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(chans[-1], num_classes)
        self.stitchlab_points = [f"blocks.{i}" for i in range(len(chans))]
        self.stitchlab_input_shape = (1, int(sample_rate))  # (channels, samples): 1 s
        self.sample_rate = int(sample_rate)  # Hz of the waveforms it reads
        _init(self)

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.fc(torch.flatten(self.pool(self.blocks(self.norm(self.front(x)))), 1))


class WaveCNN(nn.Module):
    """M5-like raw-waveform CNN: an 80-tap filter bank of stride 4, then Conv1d blocks of
    kernel 3, each Conv1d-BN-ReLU-MaxPool(4); global average pooling, Linear.

    Stitch points ``blocks.0`` .. ``blocks.3`` (1 s at 8 kHz: 500, 125, 31, 7 steps of
    ``width x (1, 1, 2, 2)`` channels).
    """

    def __init__(self, num_classes: int = 10, width: int = 32, sample_rate: int = 8000) -> None:
        super().__init__()
        chans = [width, width, 2 * width, 2 * width]
        blocks, c_in = [], 1
        for i, c in enumerate(chans):
            conv = (
                nn.Conv1d(c_in, c, 80, stride=4, padding=38, bias=False)
                if i == 0
                else nn.Conv1d(c_in, c, 3, padding=1, bias=False)
            )
            blocks.append(nn.Sequential(conv, nn.BatchNorm1d(c), nn.ReLU(inplace=True),
                                        nn.MaxPool1d(4)))  # fmt: skip
            c_in = c
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(c_in, num_classes)
        self.stitchlab_points = [f"blocks.{i}" for i in range(len(chans))]
        self.stitchlab_input_shape = (1, int(sample_rate))
        self.sample_rate = int(sample_rate)
        _init(self)

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.fc(torch.flatten(self.pool(self.blocks(x)), 1))


@register("mel_cnn")
def mel_cnn(
    num_classes: int = 10,
    width: int = 32,
    sample_rate: int = 8000,
    n_mels: int = 40,
    n_fft: int = 256,
    hop: int = 80,
) -> nn.Module:
    """The log-mel CNN for speech (input ``(N, 1, T)``, waveforms in [-1, 1])."""
    return MelCNN(num_classes, width, sample_rate, n_mels, n_fft, hop)


@register("wave_cnn")
def wave_cnn(num_classes: int = 10, width: int = 32, sample_rate: int = 8000) -> nn.Module:
    """The raw-waveform CNN for speech (input ``(N, 1, T)``, waveforms in [-1, 1])."""
    return WaveCNN(num_classes, width, sample_rate)
