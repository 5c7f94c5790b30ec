"""Shared fixtures: tiny models with random weights and generated data (no files)."""

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture
def images():
    """64 random 32x32 RGB images in [0, 1] with labels, from a fixed seed."""
    g = torch.Generator().manual_seed(0)
    return torch.rand(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g)
