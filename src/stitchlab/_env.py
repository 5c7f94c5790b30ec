"""What stitchlab's speed choices (memory format, BatchNorm folding) share: their
environment switches, and the trial that keeps a faster variant only when its outputs
agree with the plain one's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

#: largest relative difference between a faster variant's outputs and the plain ones on
#: the trial samples
AGREEMENT = 1e-4


@contextmanager
def env(name: str, value: str) -> Iterator[None]:
    """Run the block with the environment variable ``name`` set to ``value``, restoring
    it (or its absence) afterwards."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def switch(name: str) -> str:
    """The setting of the switch ``name``: ``"auto"`` (unset or auto), ``"on"`` (1, on,
    true, yes) or ``"off"`` (0, off, false, no); a clear error for anything else."""
    value = os.environ.get(name, "auto").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    if value in ("1", "on", "true", "yes"):
        return "on"
    if value != "auto":
        raise ValueError(f"{name} must be auto, 1 or 0, got {value!r}")
    return "auto"


def outputs_agree(reference, out) -> bool:
    """Whether two outputs (tensors, or tuples / lists / dicts of them, as a back suffix
    with taps returns) have the same structure and every tensor is finite and within a
    relative difference of :data:`AGREEMENT` of the reference's."""
    if isinstance(reference, Tensor):
        return (
            isinstance(out, Tensor)
            and out.shape == reference.shape
            and bool(torch.isfinite(out).all())
            and float((out.float() - reference.float()).norm())
            <= AGREEMENT * max(float(reference.float().norm()), 1e-12)
        )
    if isinstance(reference, (tuple, list)):
        return (
            type(out) is type(reference)
            and len(out) == len(reference)
            and len(reference) > 0
            and all(outputs_agree(r, o) for r, o in zip(reference, out))
        )
    if isinstance(reference, dict):
        return (
            isinstance(out, dict)
            and out.keys() == reference.keys()
            and all(outputs_agree(reference[k], out[k]) for k in reference)
        )
    return False
