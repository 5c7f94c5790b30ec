"""The model-zoo tier: torchvision and timm architectures, random weights, small inputs.

For each model and a spread of its default stitch points:

* the split is exact (``back(front(x)) == model(x)``);
* the caller's tensors are untouched (the back never overwrites its input);
* taps equal the activations at their points (in-place ops after a point do not leak);
* tracing twice works and leaves the model unchanged;
* the detected layout is the true one, and the **twin test** passes: a copy of the model
  with an orthogonal channel map M inserted at the point (and M^-1 after it) computes
  the same function, and least-squares stitching of the model into its twin recovers M
  with a residual of ~0. A wrong layout (NHWC read as NCHW) cannot pass it.

The whole tier takes about a minute on 2 cores; the three largest models are marked
``slow`` (CI runs them with ``pytest -m slow``).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import stitchlab as sl
from stitchlab.splitting import PRE_LOGITS, TracedModel

timm = pytest.importorskip("timm")
tvm = pytest.importorskip("torchvision.models")


def _tv_swin_small():
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[2, 2], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                           window_size=[4, 4], num_classes=10)  # fmt: skip


def _tv_maxvit_small():
    from torchvision.models.maxvit import MaxVit

    return MaxVit(input_size=(64, 64), stem_channels=16, partition_size=4,
                  block_channels=[16, 32], block_layers=[1, 1], head_dim=8,
                  stochastic_depth_prob=0.0, num_classes=10)  # fmt: skip


def _tv_vit_small():
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                             hidden_dim=32, mlp_dim=64, num_classes=10)  # fmt: skip


def _timm(name, **kw):
    return lambda: timm.create_model(name, num_classes=10, **kw)


# id: (constructor, input side, channels-last maps?, slow?)
ZOO = {
    "tv_resnet18": (lambda: tvm.resnet18(num_classes=10), 32, False, False),
    "tv_mobilenet_v3_small": (lambda: tvm.mobilenet_v3_small(num_classes=10), 32, False, False),
    "tv_efficientnet_b0": (lambda: tvm.efficientnet_b0(num_classes=10), 32, False, False),
    "tv_regnet_y_400mf": (lambda: tvm.regnet_y_400mf(num_classes=10), 32, False, False),
    "tv_vit_small": (_tv_vit_small, 32, False, False),
    "tv_swin_small": (_tv_swin_small, 32, True, False),
    "tv_maxvit_small": (_tv_maxvit_small, 64, False, False),
    "timm_swin_small": (_timm("swin_tiny_patch4_window7_224", img_size=32, patch_size=2,
                              window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 2)),
                        32, True, False),  # fmt: skip
    "timm_deit_tiny": (_timm("deit_tiny_patch16_224", img_size=32, patch_size=8, depth=2),
                       32, False, False),  # fmt: skip
    "timm_deit_distilled": (_timm("deit_tiny_distilled_patch16_224", img_size=32,
                                  patch_size=8, depth=2), 32, False, False),  # fmt: skip
    "timm_mobilenetv3": (_timm("mobilenetv3_small_050"), 32, False, False),
    "timm_regnet": (_timm("regnetx_002"), 32, False, False),
    "timm_convnext_atto": (_timm("convnext_atto"), 32, False, False),
    "timm_levit": (_timm("levit_128s", img_size=64), 64, False, False),
    # full-size models (the last three are the slow tier)
    "tv_resnet50": (lambda: tvm.resnet50(num_classes=10), 32, False, False),
    "tv_vgg11_bn": (lambda: tvm.vgg11_bn(num_classes=10), 32, False, True),
    "tv_densenet121": (lambda: tvm.densenet121(num_classes=10), 32, False, False),
    "tv_convnext_tiny": (lambda: tvm.convnext_tiny(num_classes=10), 32, False, False),
    "tv_swin_t": (lambda: tvm.swin_t(num_classes=10), 64, True, False),
    "timm_resnet18": (_timm("resnet18"), 32, False, False),
    "timm_efficientnet_b0": (_timm("efficientnet_b0"), 32, False, True),
    # timm's MaxViT blocks run their attention channels last (PartitionAttentionCl)
    "timm_maxvit": (_timm("maxvit_rmlp_pico_rw_256", img_size=64), 64,
                    lambda p: ".attn_" in p, True),  # fmt: skip
}


def _build(name: str):
    ctor, side, channels_last, _ = ZOO[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ctor().eval()
    return model, side, channels_last


def _true_layout(point: str, shape: tuple[int, ...], channels_last) -> str:
    """The layout the test knows each family to have (not the detector's answer)."""
    last = channels_last(point) if callable(channels_last) else channels_last
    return {2: "NC", 3: "NLC", 4: "NHWC" if last else "NCHW"}[len(shape)]


def _channel_axis(layout: str) -> int:
    return {"NC": 1, "NLC": 2, "NCL": 1, "NCHW": 1, "NHWC": 3}[layout]


class ChannelMap(nn.Module):
    """Multiplies the channel axis by a fixed matrix (a leaf for the tracer)."""

    def __init__(self, matrix: torch.Tensor, axis: int) -> None:
        super().__init__()
        self.register_buffer("matrix", matrix)
        self.axis = axis

    def forward(self, x):  # noqa: D102
        y = torch.movedim(x, self.axis, -1) @ self.matrix.T
        return torch.movedim(y, -1, self.axis)


class Twin(nn.Module):
    """``back(M^-1 (M front(x)))``: the same function, with M at the point ``map``."""

    def __init__(self, front, back, matrix, axis) -> None:
        super().__init__()
        self.front, self.back = front, back
        self.map = ChannelMap(matrix, axis)
        self.unmap = ChannelMap(matrix.T.contiguous(), axis)  # orthogonal: M^-1 = M^T

    def forward(self, x):  # noqa: D102
        return self.back(self.unmap(self.map(self.front(x))))


def _orthogonal(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return q.float()


def _spread(points: list[str], k: int) -> list[str]:
    if len(points) <= k:
        return points
    idx = sorted({round(i * (len(points) - 1) / (k - 1)) for i in range(k)})
    return [points[i] for i in idx]


def _rows(shape: tuple[int, ...], layout: str, n: int) -> int:
    per_sample = math.prod(shape[1:]) // shape[_channel_axis(layout)]
    return n * per_sample


def _check_model(name: str) -> None:
    model, side, channels_last = _build(name)
    x = torch.rand(48, 3, side, side, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (48,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = {id(m): set(m.__dict__) for m in model.modules()}
    tm = TracedModel(model)
    tm2 = TracedModel(model)  # tracing twice works and sees the same model
    assert tm.points() == tm2.points()
    assert {id(m): set(m.__dict__) for m in model.modules()} == attrs
    points = tm.points()
    assert len(points) >= 2, points
    formats = tm.formats(x[:3], points)
    usable = [p for p in points if formats[p].spec is not None]
    assert usable, {p: f.problem for p, f in formats.items()}
    chosen = _spread(usable, 4)
    with torch.no_grad():
        ref = model(x[:4])
        acts = {}
        for p in chosen:
            front, back = tm.split(p)
            a = front(x[:4])
            kept = a.clone()
            out = back(a)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4, msg=f"split at {p}")
            assert torch.equal(a, kept), f"the back overwrote its input at {p}"
            acts[p] = kept
        logits, taps = tm.tap(chosen)(x[:4])
        torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
        for p in chosen:
            torch.testing.assert_close(taps[p], acts[p], rtol=1e-5, atol=1e-5, msg=f"tap {p}")
        _, back = tm.split(chosen[0], taps="later")
        _, later = back(acts[chosen[0]].clone())
        for p in chosen[1:]:
            if p in later:
                torch.testing.assert_close(later[p], acts[p], rtol=1e-4, atol=1e-4)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed"
    # layouts and the twin test
    twins = 0
    for p in chosen:
        spec, shape = formats[p].spec, formats[p].shape
        assert spec.layout == _true_layout(p, shape, channels_last), (p, spec)
        if _rows(shape, spec.layout, len(x)) < 2 * (spec.channels + 1):
            continue  # too few rows to identify M: the fit would be exact for any layout
        _twin_test(model, tm, p, spec, x, y)
        twins += 1
    assert twins >= 1, f"no point of {name} had enough rows for the twin test"


def _twin_test(model, tm, point, spec, x, y, layouts=None) -> float:
    axis = _channel_axis(spec.layout)
    m = _orthogonal(spec.channels, seed=sum(map(ord, point)))
    front, back = tm.split(point)
    twin = Twin(front, back, m, axis).eval()
    with torch.no_grad():
        torch.testing.assert_close(twin(x[:4]), model(x[:4]), rtol=1e-3, atol=1e-3)
    s = sl.stitch(model, twin, point, (x, y), back_point="map", epochs=0,
                  init_samples=len(x), leaf_modules=(ChannelMap,), layouts=layouts)  # fmt: skip
    if layouts is None:
        assert s.init_residual < 1e-3, f"{point}: residual {s.init_residual}"
        w, b = s.stitch_layer.main.weight.detach(), s.stitch_layer.main.bias.detach()
        if s.stitch_layer.src == s.stitch_layer.dst:  # the map itself, on the used span
            a = front(x).detach()
            a = torch.movedim(a, axis, -1).reshape(-1, spec.channels)
            torch.testing.assert_close(a @ w.T + b, a @ m.T, rtol=1e-3, atol=1e-3)
    return float(s.init_residual)


@pytest.mark.parametrize("name", [k for k, v in ZOO.items() if not v[3]])
def test_zoo(name):
    _check_model(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [k for k, v in ZOO.items() if v[3]])
def test_zoo_slow(name):
    _check_model(name)


def test_twin_test_catches_a_wrong_layout():
    """Reading Swin's channels-last maps as NCHW fails the twin test (residual ~1)."""
    model, side, _ = _build("tv_swin_small")
    tm = TracedModel(model)
    point = "features.1"
    x = torch.rand(48, 3, side, side, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (48,))
    spec = tm.formats(x[:3], [point])[point].spec
    assert spec.layout == "NHWC" and spec.channels == 16
    right = _twin_test(model, tm, point, spec, x, y)
    wrong = _twin_test(model, tm, point, spec, x, y, layouts={point: "NCHW", "map": "NCHW"})
    assert right < 1e-4 and wrong > 0.3, (right, wrong)


def test_layers_command_shows_channels_last(capsys):
    from stitchlab.cli import main

    assert main(["layers", "swin_t", "--input-size", "64"]) == 0  # torchvision's, named
    out = capsys.readouterr().out
    assert out.startswith("torchvision:swin_t: ")
    assert "features.1.0" in out and "NHWC 16x16x96 (96 channels)" in out
    assert main(["layers", "timm:swin_tiny_patch4_window7_224", "--input-size", "224"]) == 0
    out = capsys.readouterr().out
    assert "layers.0.blocks.0" in out and "NHWC 56x56x96 (96 channels)" in out
    assert PRE_LOGITS in out


def test_cnn_into_channels_last_swin_and_back():
    """NCHW -> NHWC and NHWC -> NCHW stitches build, fit and run (cross-architecture)."""
    swin, side, _ = _build("tv_swin_small")
    cnn, _, _ = _build("tv_resnet18")
    x = torch.rand(32, 3, side, side, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 10, (32,))
    s = sl.stitch(cnn, swin, "layer2.0", (x, y), back_point="features.1", epochs=1,
                  objective="slm")  # fmt: skip
    assert (s.stitch_layer.src.layout, s.stitch_layer.dst.layout) == ("NCHW", "NHWC")
    assert s.stitch_layer.dst.channels == 16 and s(x[:2]).shape == (2, 10)
    s2 = sl.stitch(swin, cnn, "features.1", (x, y), back_point="layer2.0", epochs=0)
    assert (s2.stitch_layer.src.layout, s2.stitch_layer.dst.layout) == ("NHWC", "NCHW")
    assert s2.stitch_layer.src.channels == 16 and s2(x[:2]).shape == (2, 10)
