"""Helpers shared by the validation scripts (run as scripts, so this folder is on sys.path)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import torch
from torch import nn

from stitchlab.experiments.datasets import stitch_data
from stitchlab.experiments.jobs import load_model


def script_commit() -> str:
    """The short commit of the checkout the validation scripts are in."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip


def pair_family(pair: str) -> str:
    """A pair's family: its name without a trailing front number (``cross-seed2`` is a
    ``cross-seed`` front), as configs with several fronts per family name their pairs."""
    return pair.rstrip("0123456789")


def model_and_images(
    raw: dict, store: Path, name: str, n: int, config: str = "the config"
) -> tuple[nn.Module, torch.Tensor]:
    """A named model of a config (from its store) and its first ``n`` stitching images,
    with the model's marker (as its IRIs are made); a clear error for an unknown name."""
    if name not in raw["models"]:
        raise SystemExit(f"no model {name!r} in {config}; it has {sorted(raw['models'])}")
    model = load_model(raw, store, name)
    data = stitch_data(raw, raw["models"][name]["marker"])
    return model, torch.stack([data[i][0] for i in range(min(n, len(data)))])


def model_study_args(doc: str, extra=None) -> argparse.Namespace:
    """The arguments of the scripts that study named models of a config at its points
    (config, --store, --models, --n, --preset, --threads); ``extra(parser)`` adds more.
    Sets torch's thread count."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--models", required=True, help="comma-separated model names of the config")
    ap.add_argument("--n", type=int, default=32, help="stitching images (default 32)")
    ap.add_argument("--preset", choices=["default", "paper"], default="default")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args
