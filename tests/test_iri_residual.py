"""validation/iri_residual.py's split of the squared residual: hand-computed values."""

import pytest
import torch

from _scripts import validation_script

iri_residual = validation_script("iri_residual")


def test_split_by_unit_state():
    # units: dead (2 -> 0: 4), spurious (0 -> 1: 1), both on (3 -> 2: 1), both off (0 -> 0)
    # and a matched on-unit (1 -> 1: 0); total 6
    source = torch.tensor([[2.0, 0.0, 3.0, 0.0, 1.0]])
    iri = torch.tensor([[0.0, 1.0, 2.0, 0.0, 1.0]])
    s = iri_residual.residual_split(source, iri)
    assert s["dead"] == pytest.approx(4 / 6)
    assert s["spurious"] == pytest.approx(1 / 6)
    assert s["both_on"] == pytest.approx(1 / 6)
    assert s["dead_units"] == pytest.approx(1 / 3)  # 1 of the source's 3 on-units


def test_identical_and_bad_inputs():
    a = torch.rand(2, 4, 3, 3)
    s = iri_residual.residual_split(a, a.clone())
    assert s["dead"] == s["spurious"] == s["both_on"] == s["dead_units"] == 0.0
    with pytest.raises(ValueError, match="post-ReLU"):
        iri_residual.residual_split(a - 0.5, a)
    with pytest.raises(ValueError, match="shapes differ"):
        iri_residual.residual_split(a, a[:1])
