"""How well the CPU-size back model of configs/cpu/*.toml trains: ResNet-18 width 16 on a
20,000-image subset of CIFAR-10, fast recipe (AdamW one-cycle, flip + crop), test accuracy
after every epoch on 2,000 test images.

    python ../shared/data/materialize.py /tmp/data        # once
    python validation/cpu_back_model.py --root /tmp/data --epochs 15 --out /tmp/cpu_back
"""

from __future__ import annotations

import argparse
import time

import torch

from stitchlab import models
from stitchlab.data import cifar10, subset
from stitchlab.train import fast_recipe, train_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="folder with cifar-10-batches-py/")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--out", default=None, help="resumable training folder")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    train = subset(cifar10(args.root, True), args.n_train, seed=0)
    test = subset(cifar10(args.root, False), args.n_test, seed=0)
    torch.manual_seed(0)
    model = models.create("resnet18", width=16)
    start = time.time()
    result = train_model(
        model, train, recipe=fast_recipe(epochs=args.epochs), test_data={"clean": test},
        eval_every_epoch=True, out=args.out,
    )  # fmt: skip
    print(f"total {time.time() - start:.0f} s")
    for h in result.history:
        print(h)


if __name__ == "__main__":
    main()
