"""Your own ``nn.Module``: split it at named points and stitch two trained copies.

What it shows: a small hand-written CNN (any ``nn.Module`` that torch.fx can trace works
the same way) is cut exactly at the outputs of its named blocks (``stitchlab.split``:
``back(front(x)) == model(x)``), then two copies trained from different seeds are stitched
with one :class:`stitchlab.Stitcher` per point: every objective under the standard
protocol and under invariance-aware stitching (IRIs), scored with ``stitchlab.evaluate``
against the back. The self-stitch (the back into itself, one ``stitchlab.stitch`` call
with the least-squares stitch alone, ``epochs=0``) is the identity check: it scores 100.

Run it (generated shapes, no download)::

    python examples/own_module.py
    python examples/own_module.py --smoke      # tiny sizes: a few seconds
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
import torch
from torch import nn

import stitchlab as sl
from stitchlab import data, train
from stitchlab.fit import TrainingConfig


class Block(nn.Module):
    """Conv-BN-ReLU twice, downsampling by ``stride``."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(x)))


class MyNet(nn.Module):
    """A stem, three named blocks, global pooling and a linear classifier."""

    def __init__(self, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1), nn.ReLU())
        self.early = Block(width, width, 1)
        self.middle = Block(width, 2 * width, 2)
        self.late = Block(2 * width, 4 * width, 2)
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = self.late(self.middle(self.early(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Train two ``MyNet`` s, stitch them at every block, print and return the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes (a few seconds)")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--n-train", type=int, default=3000, help="generated training images")
    p.add_argument("--n-stitch", type=int, default=1000, help="stitching images")
    p.add_argument("--n-test", type=int, default=1000, help="test images")
    p.add_argument("--epochs", type=int, default=6, help="epochs of the two base models")
    p.add_argument("--stitch-epochs", type=int, default=6)
    p.add_argument(
        "--iri-steps",
        type=int,
        default=None,
        help="IRI optimisation steps (default: stitchlab's recipe)",
    )
    p.add_argument(
        "--points",
        nargs="+",
        default=None,
        help="stitch points (default: every point stitch_points gives)",
    )
    p.add_argument(
        "--allow-flagged",
        action="store_true",
        help="train on IRIs that miss the quality limits (the smoke sizes do)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.allow_flagged = True
        args.width, args.n_train, args.n_stitch, args.n_test = 4, 96, 32, 32
        args.epochs, args.stitch_epochs, args.iri_steps = 1, 1, 3
        args.points = args.points or ["middle", "late"]
    torch.manual_seed(0)
    start = time.time()

    x, y = data.shapes(args.n_train, seed=0)  # generated: 10 shapes, 32x32
    test = data.shapes(args.n_test, seed=1)
    stitching = (x[: args.n_stitch], y[: args.n_stitch])
    front, back = MyNet(args.width), MyNet(args.width)
    for seed, net in enumerate((front, back)):
        torch.manual_seed(seed)
        net.load_state_dict(MyNet(args.width).state_dict())  # its own random start
        train.train_classifier(net, (x, y), epochs=args.epochs, seed=seed)

    points = sl.stitch_points(back)  # the outputs of the named blocks
    print("stitch points:", points)
    probe = test[0][:8]
    for point in points:  # exact cuts: back(front(x)) is the model's own output
        head, tail = sl.split(back, point)
        with torch.no_grad():
            gap = (tail(head(probe)) - back(probe)).abs().max().item()
        print(f"split at {point}: max |back(front(x)) - model(x)| = {gap:.1e}")

    # the identity check: the least-squares stitch of the back into itself scores 100
    self_stitch = sl.stitch(back, back, points[1], stitching, objective="slm", epochs=0)
    own = sl.evaluate(self_stitch, test, back)
    rows = [{"pair": "self", "point": points[1], "protocol": "standard", "objective": "-",
             "agreement": own["agreement"], "hard": own["hard_agreement"]}]  # fmt: skip

    recipe = sl.IRIRecipe() if args.iri_steps is None else sl.IRIRecipe(steps=args.iri_steps)
    protocols = [sl.Standard(), sl.InvarianceAware(recipe=recipe, allow_flagged=args.allow_flagged)]
    settings = TrainingConfig(epochs=args.stitch_epochs)
    for point in args.points or points:
        st = sl.Stitcher(front, back, point)  # one per point: the work is shared
        init = st.initialise(stitching)
        for protocol in protocols:
            training_set = st.collect(stitching, protocol)
            for objective in ("hlm", "slm", "dm", "fula"):
                model = st.fit(objective, training_set, init=init, settings=settings)
                scores = st.evaluate(model, test)
                rows.append({"pair": "cross-seed", "point": point, "protocol": protocol.name,
                             "objective": objective, "agreement": scores["agreement"],
                             "hard": scores["hard_agreement"]})  # fmt: skip
    table = pd.DataFrame(rows)
    wide = table[table.pair == "cross-seed"].pivot_table(
        index=["point", "protocol"], columns="objective", values="agreement", sort=False
    )
    print(
        f"\nself-stitch at {points[1]} (least squares): agreement {own['agreement']:.1f}%, "
        f"equal decisions {own['hard_agreement']:.1f}%"
    )
    print("cross-seed agreement with the back (%):")
    print(wide.round(1).to_string())
    print(f"({time.time() - start:.0f} s)")
    return table


if __name__ == "__main__":
    main()
