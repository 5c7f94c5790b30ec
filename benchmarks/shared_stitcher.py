"""Shared work across objectives: one Stitcher per point against one stitch() per run.

Experiment A runs 4 objectives x 2 protocols at every (pair, point). The least-squares
initialisation (on real images) and the front activations and back targets of each
protocol's training set do not depend on the objective. The baseline computes them in
every run, as 8 independent ``stitch()`` calls do; stitchlab's experiment jobs build one
:class:`~stitchlab.Stitcher` per (pair, point) and share them. Both paths train the same
stitch layers to the bit; this script checks that and prints the time of each and the
ratio, per point and in total, split into the training loops (the epochs, which no
sharing can save) and everything else.

Settings are experiment A's CPU size (configs/cpu/a_cifar10_resnet18_converged.toml):
ResNet-18 width 16, 2,000 stitching images, 500 for the initialisation, 6 epochs of
batch 128, lr 3e-3. The networks have random weights and the images and IRIs are random:
the work per run does not depend on what the weights are. IRI generation is its own job
in an experiment (shared by both paths) and is not timed here.

    python benchmarks/shared_stitcher.py [--points relu,layer2.1,layer4.1] [--n 2000]
"""

from __future__ import annotations

import argparse
import time

import torch

import stitchlab as sl
from stitchlab import models
from stitchlab.fit import TrainingConfig
from stitchlab.protocols import InvarianceAware
from stitchlab.report import markdown_table

OBJECTIVES = ["hlm", "slm", "dm", "fula"]


def _row(point: str, base: float, shared: float, train_base: float, train_shared: float):
    return {
        "point": point, "8 stitch() calls (s)": f"{base:.1f}",
        "one Stitcher (s)": f"{shared:.1f}", "speed-up": f"{base / shared:.2f}x",
        "training loops (s)": f"{train_base:.1f} / {train_shared:.1f}",
        "everything else (s)": f"{base - train_base:.1f} / {shared - train_shared:.1f}",
        "everything else, speed-up": f"{(base - train_base) / (shared - train_shared):.1f}x",
    }  # fmt: skip


def _train_seconds(fitted: dict) -> float:
    return sum(m.timings.get("train", 0.0) for m in fitted.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="relu,layer1.1,layer2.1,layer3.1,layer4.1")
    ap.add_argument("--n", type=int, default=2000, help="stitching images")
    ap.add_argument("--n-init", type=int, default=500)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    front = models.create("resnet18", width=args.width).eval()
    torch.manual_seed(1)
    back = models.create("resnet18", width=args.width).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(args.n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.n,), generator=g)
    iris = torch.rand(args.n, 3, 32, 32, generator=g)  # stands in for a stored IRI set
    settings = TrainingConfig(epochs=args.epochs, lr=3e-3, batch_size=128,
                                 init_samples=args.n_init)  # fmt: skip
    protocols = {"standard": None, "iris": iris}

    sl.stitch(front, back, "layer1.1", (x[:64], y[:64]), "slm", epochs=1)  # warm-up, untimed
    rows, totals = [], [0.0, 0.0, 0.0, 0.0]
    for point in args.points.split(","):
        # baseline: every run on its own
        t0 = time.perf_counter()
        alone = {}
        for proto, given in protocols.items():
            for objective in OBJECTIVES:
                kw = {"protocol": InvarianceAware(iris=given)} if given is not None else {}
                alone[proto, objective] = sl.stitch(front, back, point, (x, y), objective,
                                                    settings=settings, **kw)  # fmt: skip
        t_base = time.perf_counter() - t0

        # stitchlab's jobs: one Stitcher, one training set per protocol, one initialisation
        t0 = time.perf_counter()
        st = sl.Stitcher(front, back, point)
        init = st.initialise((x, y), samples=args.n_init, seed=settings.seed)
        shared = {}
        for proto, given in protocols.items():
            sset = st.collect((x, y), InvarianceAware(iris=given) if given is not None else
                              "standard")  # fmt: skip
            for objective in OBJECTIVES:
                shared[proto, objective] = st.fit(objective, sset, init=init, settings=settings)
        t_shared = time.perf_counter() - t0

        for k, m in alone.items():
            a, b = m.stitch_layer.state_dict(), shared[k].stitch_layer.state_dict()
            if m.history != shared[k].history or any(not torch.equal(a[n], b[n]) for n in a):
                raise SystemExit(f"{point} {k}: the shared run differs from the baseline")
        cells = [t_base, t_shared, _train_seconds(alone), _train_seconds(shared)]
        totals = [a + b for a, b in zip(totals, cells)]
        rows.append(_row(point, *cells))
        print(f"{point}: {t_base:.1f} s alone, {t_shared:.1f} s shared "
              f"({t_base / t_shared:.2f}x), identical stitch layers", flush=True)  # fmt: skip
    rows.append(_row("all", *totals))
    print()
    print("training loops: the epochs themselves (not shareable); everything else: copies, "
          "tracing, the least-squares initialisation, activation caches (alone / shared)")
    print(f"8 runs per point (4 objectives x 2 protocols), n={args.n}, n_init={args.n_init}, "
          f"{args.epochs} epochs, ResNet-18 width {args.width}, {args.threads} threads")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
