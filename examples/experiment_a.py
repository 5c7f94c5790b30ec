"""Experiment A at CPU size, from its config file.

What it shows: an experiment is a config file (``configs/cpu/a_cifar10_resnet18.toml``:
ResNet-18s of width 16 on CIFAR-10; identical, cross-seed and cross-bias pairs, where the
cross-bias front learnt a pixel shortcut; five points, four objectives, both protocols).
The script reads it with ``stitchlab.experiments.load_config`` (every key, type and
range checked before anything runs), runs it with ``run_experiment`` (base models, IRI
sets and stitch runs, each stored under a key of what determines it, so a rerun resumes)
and prints SLM's agreement per pair, point and protocol from ``results.csv``. The
finding to look for: standard stitching calls the shortcut front similar to the clean
back, invariance-aware stitching does not.

Full size (CIFAR-10 in ``$STITCHLAB_DATA/cifar-10-batches-py``; hours on a CPU, where the
three base models train 10 epochs on 50,000 images; its results: docs/validation/a.md)::

    STITCHLAB_DATA=/data python examples/experiment_a.py --out runs/a
    python examples/experiment_a.py --smoke    # a tiny generated CIFAR-10, seconds

``--smoke`` writes a tiny CIFAR-10 folder of random images to a temporary directory and
shrinks the config (a few images, width-4 networks, one epoch, two points, 3 IRI steps
with the quality limits relaxed); everything else is the config as written.
The same run from the command line: ``stitchlab run CONFIG --out runs/a``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

from stitchlab.experiments import load_config, run_experiment

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cpu" / "a_cifar10_resnet18.toml"


def write_cifar(root: Path, per_batch: int) -> Path:
    """A CIFAR-10 folder of random images in its standard layout (the reader's format)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, (per_batch, 3 * 32 * 32), dtype=np.uint8)
        labels = [int(v) for v in np.arange(per_batch) % 10]
        with open(folder / name, "wb") as f:
            pickle.dump({"data": images, "labels": labels}, f, protocol=4)
    return root


def smoke_size(raw: dict, root: Path) -> dict:
    """The config at the smallest sizes it allows, reading the CIFAR-10 folder ``root``."""
    raw["data"].update(root=str(root), n_train=60, n_test=20)
    for model in raw["models"].values():
        model["options"] = {**model.get("options", {}), "width": 4}
        model["recipe"] = {**model.get("recipe", {}), "epochs": 1, "batch_size": 32}
    raw["stitch"].update(points=raw["stitch"]["points"][1:3], n_stitch=20, n_init=20,
                         training={"epochs": 1, "batch_size": 10})  # fmt: skip
    raw["iris"].update(steps=3, threshold=10.0, min_null_ratio=1e-6)
    raw["run"] = {"threads": 1}
    return raw


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run experiment A (or another config) and print SLM's agreement table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, generated data")
    p.add_argument("--config", default=str(CONFIG), help="an experiment config (TOML)")
    p.add_argument("--out", default="runs/a", help="output folder (results.csv, store/)")
    args = p.parse_args(argv)
    start = time.time()
    tmp = None
    raw = tomllib.loads(Path(args.config).read_text())
    if args.smoke:
        tmp = tempfile.TemporaryDirectory()
        raw = smoke_size(raw, write_cifar(Path(tmp.name) / "cifar", per_batch=12))
        args.out = str(Path(tmp.name) / "run")
    elif "$STITCHLAB_DATA" in str(raw["data"].get("root")) and not os.environ.get("STITCHLAB_DATA"):
        p.error("set STITCHLAB_DATA to the folder holding cifar-10-batches-py (or --smoke)")
    experiment = load_config(raw)  # checked completely before anything runs
    print(f"{experiment.name}: {experiment.description}")
    run_experiment(experiment, args.out, progress=not args.smoke)
    results = pd.read_csv(Path(args.out) / "results.csv")
    slm = results[results.objective == "slm"]
    table = slm.pivot_table(index=["pair", "point"], columns="protocol", values="agreement",
                            sort=False)  # fmt: skip
    print("\nSLM agreement with the back (%), by protocol:")
    print(table.round(1).to_string())
    print(f"{len(results)} result rows in {args.out}/results.csv "
          f"({time.time() - start:.0f} s)")  # fmt: skip
    if tmp is not None:
        tmp.cleanup()
    return results


if __name__ == "__main__":
    main()
