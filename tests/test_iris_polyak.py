"""The Polyak cap of IRI steps (``polyak``, in the default on affine fronts since
2026-12-06): each sample's step at most a fraction of the step that brings the error's
linearisation to 0, the error's known least value (docs/validation/iri_convergence.md,
"The Polyak cap on affine fronts")."""

import pytest
import torch
from torch import nn

from stitchlab.iris import IRIRecipe, generate_iris
from stitchlab.iris.front import AFFINE_RULE, _recipe_front, _STReLUModule, affine_front


def _doubler() -> nn.Sequential:
    """Point "0" is x -> 2x on one pixel (the Linear after it makes the model's logits)."""
    m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 2))
    with torch.no_grad():
        m[0].weight.fill_(2.0)
    return m


def _from_half(**kw) -> dict:
    """Options of the hand-computed paths: start 0.5 (noise of 1e-9 around the box's
    centre), constant steps of 0.1, no early stop, float32 IRIs, the exact ReLU gradient;
    ``kw`` overrides."""
    return {"final_step_size": None, "step_size": 0.1, "tolerance": None,
            "start": "scaled_noise", "start_scale": 1e-9, "precision": "float32",
            "relu_grad": "exact", **kw}  # fmt: skip


def _path(steps: int, **kw) -> float:
    """Source 0.3 (target 0.6), start 0.5 (error 0.4 / 0.6), steps of size 0.1."""
    src = torch.tensor([[0.3]])
    return float(generate_iris(_doubler(), "0", src, steps=steps, **_from_half(**kw)).iris)


@pytest.mark.parametrize("optimizer", ["adam", "sign"])
def test_capped_steps_close_a_fixed_fraction_of_the_distance(optimizer):
    """By hand: the error is |2x - 0.6| / 0.6, its gradient 2 / 0.6 in size, the step's
    direction +1 (Adam's first moment over its root second moment; the sign), so the
    Polyak step is err / slope = (2 d / 0.6) / (2 / 0.6) = d, the distance d to the source.
    A cap of 0.3 of it moves 0.3 d while that is below 0.1: d_k = 0.2 x 0.7^k. Full
    steps of 0.1 go 0.5 -> 0.4 -> 0.3; a cap of 1 on steps of 0.5 lands on the source in
    one step (and on steps of 0.1 keeps them: 0.1 < d)."""
    for k in (1, 2, 5):
        assert _path(k, optimizer=optimizer, polyak=0.3) == pytest.approx(
            0.3 + 0.2 * 0.7**k, abs=1e-6
        )
    assert _path(1, optimizer=optimizer, polyak=None) == pytest.approx(0.4, abs=1e-6)
    assert _path(1, optimizer=optimizer, polyak=1.0, step_size=0.5) == pytest.approx(
        0.3, abs=1e-6
    )
    assert _path(1, optimizer=optimizer, polyak=1.0) == pytest.approx(0.4, abs=1e-6)


@pytest.mark.parametrize("optimizer", ["adam", "sign"])
def test_capped_samples_stop_at_the_tolerance_on_their_own(optimizer):
    """Two pixels, sources 0.3 and 0.45 (targets 0.6, 0.9), both from 0.5, cap 0.3,
    tolerance 0.05: by hand d_k = d_0 x 0.7^k and err_k = 2 d_k / target. The second
    (err_3 = 0.1 x 0.343 / 0.9 = 0.038) stops after 3 steps and keeps that iterate; the
    first runs on alone (the gathered path) to err_8 = 0.0384 (err_7 = 0.055)."""
    kw = _from_half(tolerance=0.05, optimizer=optimizer, polyak=0.3)
    got = generate_iris(_doubler(), "0", torch.tensor([[0.3], [0.45]]), steps=20, **kw)
    want = torch.tensor([0.3 + 0.2 * 0.7**8, 0.45 + 0.05 * 0.7**3])
    torch.testing.assert_close(got.iris.view(-1), want, rtol=0, atol=1e-6)


def test_the_cap_never_lengthens_a_step():
    """Far from the source 0.3 x the Polyak step is longer than the step size: the step
    keeps its size (start 0.5, source 0.05: d = 0.45, 0.3 d = 0.135 > 0.1)."""
    kw = _from_half(optimizer="sign", polyak=0.3)
    x = float(generate_iris(_doubler(), "0", torch.tensor([[0.05]]), steps=1, **kw).iris)
    assert x == pytest.approx(0.4, abs=1e-6)


def _cnn(inner: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), inner,
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 64, 3)).eval()  # fmt: skip


@pytest.mark.parametrize(
    ("point", "inner", "relu_grad", "affine"),
    [
        ("2", nn.Identity(), "smooth", True),  # conv, BatchNorm, straight-through ReLU
        ("1", nn.Identity(), "exact", True),  # the pre-activation
        ("2", nn.Identity(), "exact", False),  # the exact final ReLU is not affine
        ("5", nn.Identity(), "smooth", False),  # an inner ReLU
        ("4", nn.AvgPool2d(1), "smooth", False),  # an inner ReLU before the pool
        ("3", nn.MaxPool2d(1), "smooth", False),  # a max pool
    ],
)
def test_affine_fronts_are_found_and_only_they_are_capped(point, inner, relu_grad, affine):
    model = _cnn(inner)
    rec = IRIRecipe.from_kwargs(relu_grad=relu_grad)
    front = _recipe_front(model, point, (), None, rec)
    x = torch.rand(2, 3, 8, 8)
    assert affine_front(front) is affine
    resolved = rec.for_front(front, x)
    assert (resolved.polyak == 0.3) is affine
    uncapped = IRIRecipe.from_kwargs(relu_grad=relu_grad, polyak=None).for_front(front, x)
    # where the cap does not apply, the key (and so the stored set) is the uncapped recipe's
    assert ("affine_rule" in resolved.key_dict()) is affine
    assert (resolved.key_dict() == uncapped.key_dict()) is not affine


class _Squared(nn.BatchNorm2d):
    def forward(self, x):  # not what a BatchNorm computes
        return x * x


@pytest.mark.parametrize(
    "layers",
    [
        [nn.BatchNorm2d(3, track_running_stats=False)],  # normalises by the batch
        [_Squared(3)],  # a subclass with its own forward
        [nn.Conv2d(3, 3, 1), _STReLUModule(), nn.Conv2d(3, 3, 1)],  # a ReLU inside
        [nn.Conv2d(3, 3, 1), nn.ReLU()],  # an exact ReLU
    ],
)
def test_what_is_not_affine(layers):
    assert not affine_front(nn.Sequential(*layers).eval())
    stem = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3), _STReLUModule())
    assert affine_front(stem.eval())
    hooked = nn.Conv2d(3, 3, 1)
    hooked.register_forward_hook(lambda m, i, o: o * o)
    assert not affine_front(nn.Sequential(hooked).eval())


def test_uncapped_fronts_run_as_before():
    """On a front that is not affine the default's IRIs are the uncapped ones, bit for bit."""
    torch.manual_seed(0)
    model, x = _cnn(nn.Identity()), torch.rand(4, 3, 8, 8)
    a = generate_iris(model, "5", x, steps=20, amp="off")
    b = generate_iris(model, "5", x, steps=20, amp="off", polyak=None)
    assert torch.equal(a.iris, b.iris)
    c = generate_iris(model, "2", x, steps=20, amp="off")
    d = generate_iris(model, "2", x, steps=20, amp="off", polyak=None)
    assert not torch.equal(c.iris, d.iris)  # the affine front's steps are capped


def test_polyak_options_are_checked_and_described():
    for bad in ({"polyak": 0.0}, {"polyak": 1.5}):
        with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
            IRIRecipe.from_kwargs(**bad)
    assert IRIRecipe.paper().key_dict()["polyak"] is None
    assert "affine_rule" not in IRIRecipe.paper().key_dict()
    d = IRIRecipe().key_dict()
    assert (d["polyak"], d["affine_rule"]) == (0.3, AFFINE_RULE)
    assert "Polyak step" in IRIRecipe().describe()
    assert "Polyak" not in IRIRecipe(polyak=None).describe()
