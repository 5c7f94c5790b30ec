"""validation/iri_alternatives.py's loop: its default reproduces generate_iris, and its
source-gated variants run (the page's table of variants depends on both)."""

import pytest
import torch
from torch import nn

from _scripts import validation_script
from stitchlab import generate_iris
from stitchlab._memory_format import mode

alternatives = validation_script("iri_alternatives")


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
    )  # fmt: skip
    for m in net:
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def test_default_variant_reproduces_generate_iris():
    net = _net()
    x = torch.rand(6, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    # with the smooth inner gradient, beta2 0.95 and no outward momentum the loop is the
    # default's in pixels without its exact tail, switch, cap or float32 tail
    pixels = {"precondition": "none", "exact_relu_steps": 0, "exact_relu_mismatch": None,
              "polyak": None, "amp": "auto", "float32_steps": 0, "float32_below": None,
              "keep_converged": False}  # fmt: skip
    v3 = {"smooth": (0.3, 0.05), "b2": 0.95, "project": True}
    for recipe, kw in ((pixels, v3),):
        with mode("0"):  # both in NCHW, so the two loops round alike
            ref = generate_iris(net, "5", x, steps=30, seed=0, **recipe)
            front = alternatives.annealable_front(net, "5")
            med, p90, rms = alternatives.adam_variant(front, x, steps=30, **kw)
        assert med == pytest.approx(float(ref.rel_error.median()), abs=1e-4)
        assert p90 == pytest.approx(float(ref.rel_error.quantile(0.9)), abs=1e-4)
        assert med < 0.5  # it optimised: 30 steps from uniform noise


@pytest.mark.parametrize(
    "kw",
    [{"gate": "union"}, {"gate": "source"}, {"nesterov": True}, {"project": True},
     {"weight": ("location", 0.5)}, {"weight": ("unit", 1.0)}, {"ema": 0.9},
     {"restart": "value"}, {"restart": "gradient", "b1": 0.95}, {"smooth": (0.3, 0.05)},
     {"smooth": (0.3, 0.0), "hard": True}],
)  # fmt: skip
def test_variants_run_and_leave_the_front_plain(kw):
    net = _net()
    x = torch.rand(4, 3, 12, 12, generator=torch.Generator().manual_seed(2))
    front = alternatives.annealable_front(net, "5")
    med, p90, rms = alternatives.adam_variant(front, x, steps=10, **kw)
    assert 0 <= med <= p90 and rms > 0
    assert alternatives._GATE["mode"] is None and not alternatives._GATE["masks"]
    assert alternatives._SMOOTH["c"] is None and not alternatives._SMOOTH["taus"]
    # the same front afterwards is the plain surrogate again
    med2, *_ = alternatives.adam_variant(front, x, steps=10)
    med3, *_ = alternatives.adam_variant(alternatives.annealable_front(net, "5"), x, steps=10)
    assert med2 == med3


def test_residual_weight_hand_computed():
    # channel energies 1 and 9, mean 5: weights 1/6 and 1/14, normalised to mean 1
    target = torch.tensor([[[[1.0, -1.0]], [[3.0, 3.0]]]])
    w = alternatives._residual_weight(target, "channel", 1.0)
    assert w.flatten().tolist() == pytest.approx([1.4, 0.6])
    assert alternatives._residual_weight(target, "unit", 0.0).flatten().tolist() == [1.0] * 4
