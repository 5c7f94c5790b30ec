"""Environment switches of stitchlab's speed choices (memory format, BatchNorm folding)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


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
