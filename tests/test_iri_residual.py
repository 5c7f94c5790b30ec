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


def test_window_shares_hand_computed():
    # one sample, two channels, 2x2 map; the window is the top-left position
    source = torch.tensor([[[[3.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]]])
    iri = torch.tensor([[[[3.0, 1.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 2.0]]]])
    window = torch.tensor([[[True, False], [False, False]]])
    w = iri_residual.window_shares(source, iri, window)
    # residual: top-left 1, top-right 1, bottom-right 4 (total 6); energy: 9 of 10
    assert float(w["residual"][0]) == pytest.approx(1 / 6)
    assert float(w["energy"][0]) == pytest.approx(9 / 10)
    assert float(w["area"][0]) == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="window"):
        iri_residual.window_shares(source, iri, window[0])


def test_marker_windows_cover_the_marker():
    from stitchlab.data import shapes
    from stitchlab.data.markers import Marked

    x, y = shapes(4, seed=0)
    data = Marked(torch.utils.data.TensorDataset(x, y), "pixel+loc", num_classes=int(y.max()) + 1)
    masks = iri_residual.marker_windows(data, 4, (8, 8), margin=0)
    for i in range(4):
        _, top, left = data.marker(i, int(y[i]), x.shape[-2], x.shape[-1])
        scale = x.shape[-2] // 8
        assert masks[i, top // scale, left // scale]
        assert 1 <= int(masks[i].sum()) <= 4  # a marker smaller than a map cell spans <= 2x2
    assert iri_residual.marker_windows(torch.utils.data.TensorDataset(x, y), 4, (8, 8)) is None
