"""Stitch layers and the least-squares solver, with hand-computed answers."""

import pytest
import torch

from stitchlab.layers import (
    ActivationSpec,
    LeastSquares,
    StitchLayer,
    StitchShapeError,
    fit_least_squares,
)


def _toy_fit(lo: float) -> tuple[float, float]:
    """docs/method.md section 3: fit g(x) = x from f(x) = 2|x - 0.25| + 2 on [lo, 1]."""
    x = torch.linspace(lo, 1.0, 100_001, dtype=torch.float64)[:, None]
    f = 2 * (x - 0.25).abs() + 2
    layer = StitchLayer(ActivationSpec("vector", (1,)), ActivationSpec("vector", (1,)))
    fit_least_squares(layer, [(f, x)])
    return layer.main.weight.item(), layer.main.bias.item()


def test_toy_forward_only_fit():
    w, b = _toy_fit(0.25)
    assert w == pytest.approx(0.5, abs=1e-6) and b == pytest.approx(-0.75, abs=1e-6)


def test_toy_forward_backward_fit():
    w, b = _toy_fit(0.0)
    assert w == pytest.approx(0.59, abs=0.005) and b == pytest.approx(-1.06, abs=0.005)


def test_least_squares_recovers_an_affine_map_and_reports_zero_residual():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 6, generator=g, dtype=torch.float64)
    w, b = torch.randn(3, 6, generator=g, dtype=torch.float64), torch.randn(3, generator=g)
    ls = LeastSquares(6, 3)
    for chunk in range(0, 500, 37):  # streamed in uneven batches
        ls.add(x[chunk : chunk + 37], x[chunk : chunk + 37] @ w.T + b)
    w_hat, b_hat, res = ls.solve()
    torch.testing.assert_close(w_hat, w)
    torch.testing.assert_close(b_hat, b.double())
    assert res < 1e-6


def test_residual_matches_direct_computation():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(200, 4, generator=g), torch.randn(200, 2, generator=g)
    ls = LeastSquares(4, 2)
    ls.add(x, y)
    w, b, res = ls.solve()
    direct = torch.linalg.norm(x.double() @ w.T + b - y.double()) / torch.linalg.norm(y.double())
    assert res == pytest.approx(float(direct), rel=1e-6)


def test_rank_deficient_inputs_are_fine():
    x = torch.randn(100, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x = torch.cat([x, torch.zeros(100, 2, dtype=torch.float64)], 1)  # two dead channels
    y = x[:, :3] * 2
    ls = LeastSquares(5, 3)
    ls.add(x, y)
    w, b, res = ls.solve()
    assert res < 1e-6 and torch.all(w[:, 3:] == 0)
    w2, _, res2 = ls.solve(ridge=1e-3)
    assert res2 < 1e-2


def _random_affine_conv(a, cout, hw=None):
    torch.manual_seed(3)
    w, b = torch.randn(cout, a.shape[1]), torch.randn(cout)
    if hw is not None:
        a = torch.nn.functional.interpolate(a, size=hw, mode="bilinear", align_corners=False)
    return torch.einsum("nchw,oc->nohw", a, w) + b[None, :, None, None]


@pytest.mark.parametrize("hw", [(8, 8), (4, 4), (16, 16)])
def test_conv_to_conv_fits_exactly_with_resize(hw):
    a = torch.randn(40, 5, 8, 8)
    z = _random_affine_conv(a, 7, hw)
    layer = StitchLayer(ActivationSpec.of(a), ActivationSpec.of(z))
    res = fit_least_squares(layer, [(a[:20], z[:20]), (a[20:], z[20:])])
    assert res < 1e-4
    torch.testing.assert_close(layer(a), z, rtol=1e-4, atol=1e-4)


def test_tokens_to_tokens_per_token_linear():
    a = torch.randn(30, 17, 8)  # class token + 4x4 grid
    lin = torch.nn.Linear(8, 12)
    z = lin(a).detach()
    layer = StitchLayer(ActivationSpec.of(a, 1), ActivationSpec.of(z, 1))
    assert layer.same_tokens and layer.prefix is None
    assert fit_least_squares(layer, [(a, z)]) < 1e-4
    torch.testing.assert_close(layer(a), z, rtol=1e-4, atol=1e-4)


def test_conv_to_tokens_and_back_shapes():
    conv = torch.randn(6, 16, 8, 8)
    tokens = torch.randn(6, 17, 24)
    c2t = StitchLayer(ActivationSpec.of(conv), ActivationSpec.of(tokens, 1))
    assert c2t(conv).shape == tokens.shape and c2t.prefix is not None
    fit_least_squares(c2t, [(conv, tokens)])
    t2c = StitchLayer(ActivationSpec.of(tokens, 1), ActivationSpec.of(conv))
    assert t2c(tokens).shape == conv.shape
    # grid tokens of an exact affine image of the conv map are recovered exactly
    w = torch.randn(24, 16)
    grid = torch.einsum("nchw,dc->nhwd", conv, w).reshape(6, 64, 24)
    target = torch.cat([grid.mean(1, keepdim=True), grid], 1)
    spec_t = ActivationSpec.of(target, 1)
    layer = StitchLayer(ActivationSpec.of(conv), spec_t)
    fit_least_squares(layer, [(conv, target)])
    torch.testing.assert_close(layer(conv)[:, 1:], grid, rtol=1e-3, atol=1e-3)


def test_to_vector_uses_pooled_features():
    conv = torch.randn(50, 4, 3, 3)
    z = conv.mean((2, 3)) @ torch.randn(4, 5)
    layer = StitchLayer(ActivationSpec.of(conv), ActivationSpec.of(z))
    assert fit_least_squares(layer, [(conv, z)]) < 1e-5


def test_unbridgeable_shapes_name_both():
    with pytest.raises(StitchShapeError, match=r"NC 64 .*NCHW 8x4x4"):
        StitchLayer(ActivationSpec("vector", (64,)), ActivationSpec("conv", (8, 4, 4)))
    with pytest.raises(StitchShapeError, match="neither"):
        ActivationSpec.of(torch.zeros(2, 3, 4, 5, 6))


def test_identity_init_needs_equal_formats():
    spec = ActivationSpec("conv", (4, 5, 5))
    layer = StitchLayer(spec, spec)
    layer.init_identity()
    a = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(layer(a), a)
    with pytest.raises(StitchShapeError):
        StitchLayer(spec, ActivationSpec("conv", (3, 5, 5))).init_identity()


@pytest.mark.parametrize(
    ("src_layout", "dst_layout", "hw"),
    [("NHWC", "NHWC", (8, 8)), ("NHWC", "NCHW", (8, 8)), ("NCHW", "NHWC", (4, 4)),
     ("NHWC", "NHWC", (16, 16))],
)  # fmt: skip
def test_channels_last_maps_are_stitched_over_channels(src_layout, dst_layout, hw):
    """A channels-last map gives the same layer as its channels-first permutation."""
    a = torch.randn(40, 5, 8, 8)  # NCHW reference
    z = _random_affine_conv(a, 7, hw)
    a_in = a.permute(0, 2, 3, 1) if src_layout == "NHWC" else a
    z_in = z.permute(0, 2, 3, 1) if dst_layout == "NHWC" else z
    src = ActivationSpec.of(a_in, layout=src_layout)
    dst = ActivationSpec.of(z_in, layout=dst_layout)
    assert src.channels == 5 and dst.channels == 7 and dst.grid == hw
    layer = StitchLayer(src, dst)
    assert fit_least_squares(layer, [(a_in, z_in)]) < 1e-4
    torch.testing.assert_close(layer(a_in), z_in, rtol=1e-4, atol=1e-4)
    ref = StitchLayer(ActivationSpec.of(a), ActivationSpec.of(z))
    ref.load_state_dict(layer.state_dict())
    out = ref(a)
    out = out.permute(0, 2, 3, 1) if dst_layout == "NHWC" else out
    torch.testing.assert_close(layer(a_in), out)


def test_channels_last_to_tokens_and_vector():
    a = torch.randn(12, 4, 4, 6)  # NHWC
    spec = ActivationSpec.of(a, layout="NHWC")
    tokens = torch.randn(12, 17, 10)
    t = StitchLayer(spec, ActivationSpec.of(tokens, 1))
    assert t(a).shape == tokens.shape
    v = StitchLayer(spec, ActivationSpec.of(torch.randn(12, 3)))
    torch.testing.assert_close(v.design_rows(a, torch.zeros(12, 3))[0][0], a.mean((1, 2)))


def test_sequences_are_stitched_over_channels_with_length_resize():
    a = torch.randn(30, 4, 50)  # NCL
    w, b = torch.randn(6, 4), torch.randn(6)
    z_full = torch.einsum("ncl,oc->nol", a, w) + b[None, :, None]
    z = torch.nn.functional.interpolate(z_full[:, :, None], size=(1, 25), mode="bilinear",
                                        align_corners=False)[:, :, 0]  # fmt: skip
    src, dst = ActivationSpec.of(a, layout="NCL"), ActivationSpec.of(z, layout="NCL")
    assert (src.kind, src.channels, src.grid, dst.grid) == ("seq", 4, (1, 50), (1, 25))
    layer = StitchLayer(src, dst)
    assert fit_least_squares(layer, [(a, z)]) < 1e-4
    torch.testing.assert_close(layer(a), z, rtol=1e-4, atol=1e-4)


def test_least_squares_is_scale_free():
    """Features of magnitude 1e-7 (deep random nets) fit as well as unit ones.

    The map is exact, so the solution must be too (to 1e-9 relative). The residual is
    computed from the normal equations (``yty - 2 w.xty + w.xtx.w``), whose cancellation
    leaves a floor of about sqrt(float64 eps) ~ 1.5e-8 relative: it must be at that floor.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, dtype=torch.float64, generator=gen)
    w_true = torch.randn(6, 3, dtype=torch.float64, generator=gen)
    y = x @ w_true + 0.5
    for scale in (1e-7, 1.0, 1e4):
        ls = LeastSquares(6, 3)
        ls.add(x * scale, y)
        w, b, res = ls.solve()
        torch.testing.assert_close(w.T * scale, w_true, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(b, torch.full((3,), 0.5, dtype=torch.float64),
                                   rtol=1e-9, atol=1e-9)
        assert res < 1e-6, (scale, res)
