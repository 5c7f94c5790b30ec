"""The smooth gradient through saturating nonlinearities and max-pooling.

Under ``relu_grad="smooth"`` a ReLU6 / Hardtanh / Hardsigmoid / Hardswish module and a
max-pooling of non-overlapping windows keep their exact forward; their backward is the
smoothed one, which becomes the exact gradient as the width goes to 0 and passes gradient
where the exact one is zero (a saturated unit, a window's non-maximum).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stitchlab.iris import generate_iris
from stitchlab.iris.front import _frozen_front
from stitchlab.iris.smooth import _smooth_relus_of, _SmoothModule, _SmoothSaturatingFn

MODULES = [nn.ReLU6(), nn.Hardtanh(), nn.Hardsigmoid(), nn.Hardswish(), nn.ReLU6(inplace=True),
           nn.MaxPool2d(2)]  # fmt: skip


def _front(mod: nn.Module, width: float, floor: float = 0.0):
    net = nn.Sequential(nn.Conv2d(3, 3, 1), mod, nn.Identity(), nn.Flatten())
    torch.manual_seed(0)
    nn.init.normal_(net[0].weight, std=2.0)
    front = _frozen_front(net.eval(), "2", relu_grad="smooth", relu_width=width,
                          relu_floor=floor)  # fmt: skip
    return net, front, _smooth_relus_of(front)


def _grads(mod, width, floor=0.0):
    net, front, smooth = _front(mod, width, floor)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 3
    with torch.no_grad(), smooth.recording():
        front(x)
    xa = x.clone().requires_grad_(True)
    smooth.step(None)
    y = front(xa)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    (smooth_grad,) = torch.autograd.grad(y, xa, g)
    xb = x.clone().requires_grad_(True)
    (exact,) = torch.autograd.grad(net[1](net[0](xb)), xb, g)
    exact_y = net[:2](x)
    smooth.off()
    return y.detach(), exact_y.detach(), smooth_grad, exact


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: repr(m))
def test_forward_is_exact_and_the_gradient_tends_to_the_exact_one(mod):
    y, exact_y, g, exact = _grads(mod, width=1e-6)
    assert torch.equal(y, exact_y)
    assert torch.allclose(g, exact, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mod", MODULES[:4] + MODULES[5:], ids=lambda m: repr(m))
def test_the_smooth_gradient_reaches_saturated_units(mod):
    _, _, g, exact = _grads(mod, width=0.3, floor=0.05)
    dead = exact == 0
    assert bool(dead.any())
    assert bool((g[dead] != 0).any())  # some gradient where the exact one has none


def test_modules_inside_leaf_modules_are_treated():
    class Block(nn.Module):  # a leaf module holding its activation, as timm's BatchNormAct2d
        def __init__(self):
            super().__init__()
            self.conv, self.act = nn.Conv2d(3, 4, 3, padding=1), nn.ReLU6()

        def forward(self, x):
            return self.act(self.conv(x))

    net = nn.Sequential(Block(), Block().requires_grad_(False), nn.Flatten())
    net[1].conv = nn.Conv2d(4, 4, 3, padding=1)
    front = _frozen_front(net.eval(), "1", leaf_modules=(Block,), relu_grad="smooth")
    assert sum(isinstance(m, _SmoothModule) for m in front.modules()) == 2
    x = torch.rand(4, 3, 32, 32)
    res = generate_iris(net, "1", x, steps=20, exact_relu_steps=0, leaf_modules=(Block,))
    assert res.rel_error.shape == (4,)
    exact = generate_iris(net, "1", x, steps=20, exact_relu_steps=0, leaf_modules=(Block,),
                          relu_grad="exact")
    assert not torch.equal(res.iris, exact.iris)  # the smooth gradient changed the descent


def _ramp_slope(kind: str, lo: float, hi: float, values: list[float], exact) -> list[float]:
    x = torch.tensor(values).view(1, 1, 1, -1).requires_grad_(True)
    inv_width = torch.full((1, 1, 1, 1), math.pi)  # w = 1 / pi: ramps of width 2 pi w = 2
    y = _SmoothSaturatingFn.apply(x, inv_width, kind, lo, hi, 0.05, exact)
    (g,) = torch.autograd.grad(y.sum(), x)
    return g.flatten().tolist()


def test_the_clamps_slope_has_ramps_of_width_2_pi_w_by_hand():
    # ReLU6, ramps of width 2: the slope ramps from 0 to 1 over [-1, 1] and back over [5, 7], at
    # least the floor 0.05
    got = _ramp_slope("clamp", 0.0, 6.0, [-2.0, -0.5, 0.5, 3.0, 6.5, 8.0], nn.ReLU6())
    assert got == pytest.approx([0.05, 0.25, 0.75, 1.0, 0.25, 0.05])
    got = _ramp_slope("hardsigmoid", -3.0, 3.0, [-3.5, 0.0, 2.0], nn.Hardsigmoid())
    assert got == pytest.approx([0.25 / 6, 1 / 6, 1 / 6])


def test_the_hardswish_slope_by_hand():
    # h(x) + x s(x) / 6 (s: ramps over [-4, -2] and [2, 4]), plus the floor at and below -3
    got = _ramp_slope("hardswish", -3.0, 3.0, [-5.0, -3.0, 0.0, 3.0, 5.0], nn.Hardswish())
    assert got == pytest.approx([0.05, -0.25 + 0.05, 0.5, 1.0 + 0.25, 1.0])


KEYED = [(nn.ReLU6(), True), (nn.Hardswish(), True), (nn.ReLU(), False), (nn.MaxPool2d(2), False)]


@pytest.mark.parametrize(("act", "named"), KEYED)
def test_a_stored_sets_key_names_the_saturating_slope_where_the_front_has_one(act, named):
    from stitchlab.iris.smooth import SATURATING_RULE
    from stitchlab.iris.store import _iris_set_key

    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), act, nn.Conv2d(4, 4, 1), nn.ReLU(),
                        nn.Flatten())  # fmt: skip
    data = (torch.rand(4, 3, 8, 8), torch.zeros(4, dtype=torch.long))
    args = (net.eval(), "3", data, 0, 128, None, "cpu", (), None)
    parts = _iris_set_key(*args, {})[4]
    assert parts.get("saturating") == (SATURATING_RULE if named else None)
    # the exact gradient never runs the smooth slope: no rule in its key
    assert "saturating" not in _iris_set_key(*args, {"relu_grad": "exact"})[4]
