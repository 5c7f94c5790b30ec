"""Where the IRIs of coloured-MNIST networks start: the default recipe from uniform noise,
the default from another image of the batch (``start="image"``), and the signed steps the
coloured-MNIST page was first measured with, on a digit and a colour network (small_cnn,
width 16, 2 epochs on 3,000 images), at blocks.0-3 on 64 correlated test images
(docs/iri_zoo.md, "Coloured MNIST: noise or image starts")::

    python ../shared/data/materialize.py /tmp/data
    python validation/coloured_mnist_iris.py --data-root /tmp/data
"""

from __future__ import annotations

import argparse
import time

import torch

from stitchlab import generate_iris, models
from stitchlab.data import coloured_mnist

RECIPES = {
    "default, noise start": {},
    "default, image start": {"start": "image"},
    "signed (page's first run)": {"preset": "paper", "steps": 100, "step_size": 16 / 255,
                                  "final_step_size": 0.5 / 255, "start": "image"},
}  # fmt: skip


def _sample(root: str, variant: str, n: int, train: bool, seed: int):
    ds = coloured_mnist(root, variant, train=train)
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:n]
    xs, ys = zip(*(ds[int(i)] for i in idx))
    return torch.stack(xs), torch.tensor(ys)


def _train(x, y) -> torch.nn.Module:
    torch.manual_seed(0)
    m = models.create("small_cnn", num_classes=10, width=16)
    opt = torch.optim.Adam(m.parameters(), 3e-3)
    for _ in range(2):
        for i in range(0, len(x), 128):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x[i : i + 128]), y[i : i + 128]).backward()
            opt.step()
    return m.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True, help="folder with MNIST/raw/")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sources, _ = _sample(args.data_root, "correlated", 64, train=False, seed=1)
    print("| network | point | recipe | median / p90 | null | CPU s |\n|---|---|---|---|---|---|")
    for variant in ("digit", "colour"):
        net = _train(*_sample(args.data_root, variant, 3000, train=True, seed=0))
        for point in ("blocks.0", "blocks.1", "blocks.2", "blocks.3"):
            for name, recipe in RECIPES.items():
                t0 = time.process_time()
                r = generate_iris(net, point, sources, **recipe)
                e = r.rel_error
                print(f"| {variant} | {point} | {name} | {e.median():.3f} / "
                      f"{e.quantile(0.9):.3f} | {r.null_error.median():.2f} | "
                      f"{time.process_time() - t0:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
