"""validation/linear_probe.py's probe: known answers and invariances."""

import pytest
import torch

from _scripts import validation_script

linear_probe = validation_script("linear_probe")


def test_rotated_and_shifted_copy_is_linearly_exact():
    g = torch.Generator().manual_seed(0)
    back = torch.randn(20, 6, 4, 4, generator=g)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g))
    front = torch.einsum("dc,nchw->ndhw", q, back) + 3.0  # rotated channels, shifted
    r = linear_probe.probe(front, back)
    assert r["ls_residual_centred"] == pytest.approx(0.0, abs=1e-6)
    assert r["channels"] == 6


def test_unrelated_front_leaves_the_whole_variance():
    g = torch.Generator().manual_seed(1)
    back = torch.randn(400, 3, 8, 8, generator=g)
    front = torch.randn(400, 2, 8, 8, generator=g)
    # 2 random regressors + bias on 25,600 positions explain almost nothing
    assert linear_probe.probe(front, back)["ls_residual_centred"] == pytest.approx(1.0, abs=0.01)


def test_effective_rank_is_the_participation_ratio():
    # channel variances 4, 4, 0, 0 (hand-computed: (4 + 4)^2 / (16 + 16) = 2)
    x = torch.tensor([[2.0, -2.0, 5.0, 0.0], [-2.0, 2.0, 5.0, 0.0]]).repeat(50, 1)
    x[:, 1] = torch.tensor([2.0, 2.0, -2.0, -2.0]).repeat(25)  # uncorrelated with channel 0
    assert linear_probe.probe(x, x)["effective_rank"] == pytest.approx(2.0, abs=1e-9)
