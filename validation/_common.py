"""Helpers shared by the validation scripts (run as scripts, so this folder is on sys.path)."""

from __future__ import annotations

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
