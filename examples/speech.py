"""Speech: stitching a log-mel CNN and a raw-waveform CNN on spoken digits.

What it shows: stitchlab's two speech models (``mel_cnn``: a log-mel front end inside the
network, then Conv2d blocks over (mel, time); ``wave_cnn``: Conv1d blocks on the raw
waveform) trained on spoken digits "zero" .. "nine", stitched at a block:

* the mel back into itself by the least-squares stitch alone (the identity: it scores 100);
* a mel front of another seed into the mel back (cross-seed);
* the mel front into the waveform back (a map over mel x time into a sequence over time).

Each stitch is trained under the standard protocol and under invariance-aware stitching,
whose IRIs are waveforms (the ``audio`` IRI preset: Adam in short-time Fourier
coordinates). docs/speech.md has what the speech demo measured.

Full size: the clips are synthesised offline by espeak-ng (``apt-get install espeak-ng``)
and cached (``--cache``)::

    python examples/speech.py --cache speech-cache
    python examples/speech.py --smoke     # generated tones instead of speech, seconds

``--smoke`` uses generated waveforms (a class-coded tone in noise, half a second at
8 kHz) and narrow models, so it needs neither espeak-ng nor time.
"""

from __future__ import annotations

import argparse
import math
import time

import pandas as pd
import torch

import stitchlab as sl
from stitchlab import data, models, train
from stitchlab.fit import TrainingConfig


def tones(n: int, seed: int, rate: int = 8000, seconds: float = 0.5) -> tuple:
    """``n`` clips ``(n, 1, T)`` in [-1, 1]: class ``k`` is a tone of 300 + 150 k Hz with
    a random phase and level, in white noise; and the labels."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    t = torch.arange(int(rate * seconds)) / rate
    freq = (300 + 150 * labels.float())[:, None]
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    level = 0.2 + 0.3 * torch.rand(n, 1, generator=g)
    x = level * torch.sin(2 * math.pi * freq * t + phase)
    x = x + 0.05 * torch.randn(x.shape, generator=g)
    return x.clamp(-1, 1).unsqueeze(1), labels


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Train three speech models, stitch them, print and return the agreement table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="generated tones, tiny models")
    p.add_argument("--cache", help="folder to keep the synthesised clips in")
    p.add_argument("--n-train", type=int, default=3000)
    p.add_argument("--n-test", type=int, default=500)
    p.add_argument("--n-stitch", type=int, default=1000)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--epochs", type=int, default=10, help="epochs of the speech models")
    p.add_argument("--stitch-epochs", type=int, default=6)
    p.add_argument("--point", default="blocks.2", help="blocks.0 .. blocks.3")
    p.add_argument("--iri-steps", type=int, help="IRI steps (default: the audio preset's)")
    p.add_argument(
        "--allow-flagged",
        action="store_true",
        help="train on IRIs that miss the quality limits (the smoke sizes do)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.allow_flagged = True
        args.n_train, args.n_test, args.n_stitch, args.width = 96, 24, 32, 4
        args.epochs, args.stitch_epochs, args.iri_steps = 1, 1, 3
    start = time.time()

    if args.smoke:
        train_set, test = tones(args.n_train, seed=0), tones(args.n_test, seed=1)
        x, y = train_set
    else:  # spoken by espeak-ng voices; the test split by held-out voices
        train_set, test = data.spoken_digits(args.n_train, args.n_test, cache=args.cache)
        x, y = train_set.tensors()
    stitching = (x[: args.n_stitch], y[: args.n_stitch])

    nets = {}
    for name, arch, seed in (("mel", "mel_cnn", 0), ("mel-seed1", "mel_cnn", 1),
                             ("wave", "wave_cnn", 2)):  # fmt: skip
        torch.manual_seed(seed)
        nets[name] = models.create(arch, width=args.width)
        train.train_classifier(nets[name], train_set, epochs=args.epochs, seed=seed)

    options = {"preset": "audio"} | ({"steps": args.iri_steps} if args.iri_steps else {})
    iris = sl.InvarianceAware(recipe=sl.IRIRecipe.from_kwargs(**options),
                              allow_flagged=args.allow_flagged)  # fmt: skip
    settings = TrainingConfig(epochs=args.stitch_epochs)
    identity = TrainingConfig(epochs=0)  # the least-squares stitch alone
    rows = []
    for pair, front, back in (("mel -> mel (least squares)", "mel", "mel"),
                              ("mel seed 1 -> mel", "mel-seed1", "mel"),
                              ("mel -> wave", "mel", "wave")):  # fmt: skip
        st = sl.Stitcher(nets[front], nets[back], args.point)
        init = st.initialise(stitching)
        for protocol in [sl.Standard()] + ([] if front == back else [iris]):
            model = st.fit("slm", st.collect(stitching, protocol), init=init,
                           settings=settings if front != back else identity)  # fmt: skip
            scores = st.evaluate(model, test)
            rows.append({"pair": pair, "point": args.point, "protocol": protocol.name,
                         "agreement": scores["agreement"], "hard": scores["hard_agreement"],
                         "back accuracy": scores["reference_accuracy"]})  # fmt: skip
    table = pd.DataFrame(rows)
    print("SLM agreement with the back on held-out clips (%; hard: equal decisions):")
    print(table.round(1).to_string(index=False))
    print(f"({time.time() - start:.0f} s)")
    return table


if __name__ == "__main__":
    main()
