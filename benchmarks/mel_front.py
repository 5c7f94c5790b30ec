"""Audio IRI speed: the mel CNN's DFT-as-conv1d front end against ``torch.stft``, same run.

Baseline: the same ``mel_cnn`` with its log-mel front end computed by ``torch.stft``
(complex FFT, Hann window, centred, reflect padding), the implementation stitchlab had
before. Measured: stitchlab's ``LogMel`` (one strided ``conv1d`` with the windowed DFT
rows). Both give the same log-mel to float32 rounding (printed). Per stitch point: the
seconds of ``generate_iris`` with the ``audio`` preset in samples (``stft_window=0``; the
benchmark was measured with the earlier audio preset, audio-v1, at commit 14a97ef) on the
same clips, the same steps and the same seed, and the ratio.

    python benchmarks/mel_front.py [--width 16] [--clips 160] [--steps 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch
from torch import Tensor, nn

from stitchlab import models
from stitchlab.iris import generate_iris


class StftLogMel(nn.Module):
    """The baseline front end: ``torch.stft`` power spectrum, mel filters, log."""

    def __init__(self, like: nn.Module) -> None:
        super().__init__()
        self.n_fft, self.hop = like.n_fft, like.hop
        self.register_buffer("window", torch.hann_window(like.n_fft), persistent=False)
        self.register_buffer("filters", like.filters.clone(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        spec = torch.stft(x.flatten(0, 1), self.n_fft, self.hop, window=self.window,
                          center=True, return_complex=True)  # fmt: skip
        power = spec.real.pow(2) + spec.imag.pow(2)
        return torch.log(torch.matmul(self.filters, power) + 1e-6).unsqueeze(1)


def _clips(n: int, t: int, seed: int = 0) -> Tensor:
    """Quiet harmonic bursts with a noise floor (stand-ins for speech)."""
    g = torch.Generator().manual_seed(seed)
    time_ = torch.arange(t) / 8000
    f0 = 100 + 150 * torch.rand(n, 1, 1, generator=g)
    x = sum(torch.sin(2 * math.pi * k * f0 * time_) / k for k in range(1, 6))
    env = torch.exp(-(((time_ - 0.5 * t / 8000) / 0.1) ** 2))
    return (0.3 * x * env + 0.003 * torch.randn(n, 1, t, generator=g)).clamp(-1, 1)


def measure(width: int = 16, clips: int = 160, steps: int = 20) -> list[dict]:
    """Per point: seconds of IRI generation with each front end, and their ratio."""
    torch.manual_seed(0)
    model = models.create("mel_cnn", width=width).eval()
    baseline = copy.deepcopy(model)
    baseline.front = StftLogMel(model.front)
    x = _clips(clips, 8000)
    with torch.no_grad():
        diff = float((model.front(x) - baseline.front(x)).abs().max())
    rows = []
    for point in model.stitchlab_points:
        timings = {}
        for name, net in (("torch.stft", baseline), ("conv1d DFT", model)):
            generate_iris(net, point, x[:8], steps=2, preset="audio", stft_window=0)  # warm-up
            t0 = time.perf_counter()
            generate_iris(net, point, x, steps=steps, preset="audio", stft_window=0,
                          batch_size=clips,
                          tolerance=0.0)  # fmt: skip
            timings[name] = time.perf_counter() - t0
        rows.append({
            "point": point, "clips x steps": clips * steps,
            "torch.stft s": f"{timings['torch.stft']:.2f}",
            "conv1d DFT s": f"{timings['conv1d DFT']:.2f}",
            "speed-up": f"{timings['torch.stft'] / timings['conv1d DFT']:.2f}x",
            "max |log-mel diff|": f"{diff:.1e}",
        })  # fmt: skip
    return rows


def main() -> None:
    """Print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--clips", type=int, default=160)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = measure(args.width, args.clips, args.steps)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
