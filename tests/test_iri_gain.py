"""validation/iri_gain.py's steepness measure: known answers on hand-built fronts."""

import math

import pytest
import torch
from torch import nn

from _scripts import validation_script

iri_gain = validation_script("iri_gain")


def test_identity_front_moves_by_the_noise_rms():
    # f(x) = x at x = 0.5 everywhere (no clamping): ||d|| / ||x|| = (eps / sqrt(3)) / 0.5
    x = torch.full((8, 3, 32, 32), 0.5)
    eps = 4 / 255
    got = iri_gain.relative_change(nn.Identity(), x, eps)
    assert got == pytest.approx(eps / math.sqrt(3) / 0.5, rel=0.02)


def test_scaling_a_front_leaves_its_relative_change_and_a_gain_multiplies_it():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 3, 16, 16, generator=g) * 0.5 + 0.25
    conv = nn.Conv2d(3, 4, 3, padding=1)
    base = iri_gain.relative_change(conv, x, 1 / 255)
    assert base > 0

    class Scaled(nn.Module):  # the output times 7: the same relative change
        def forward(self, z):
            return 7 * conv(z)

    assert iri_gain.relative_change(Scaled(), x, 1 / 255) == pytest.approx(base, rel=1e-5)

    class Steeper(nn.Module):  # the same mean output, twice the response to a change
        def forward(self, z):
            return conv(2 * z - x)

    assert iri_gain.relative_change(Steeper(), x, 1 / 255) == pytest.approx(2 * base, rel=1e-4)
