"""PGD: constraints, known optimum on a linear model, determinism, adversarial training."""

import importlib.util

import pytest
import torch
from torch import nn

from stitchlab import data, models
from stitchlab.attacks import autoattack_accuracy, pgd, robust_accuracy
from stitchlab.train import accuracy_on, evaluate_classifier

EPS = 8 / 255


def _net():
    torch.manual_seed(0)
    return models.create("small_cnn", width=4).eval()


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_pgd_stays_in_the_ball_and_the_box_and_raises_the_loss(norm):
    model = _net()
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)
    x[:4] = 1.0  # at the box edge
    eps = EPS if norm == "linf" else 0.5
    adv = pgd(model, x, y, eps=eps, step=eps / 4, steps=8, norm=norm, generator=g)
    delta = (adv - x).flatten(1)
    size = delta.abs().max(1).values if norm == "linf" else delta.norm(dim=1)
    assert (size <= eps + 1e-5).all() and adv.min() >= 0 and adv.max() <= 1
    ce = nn.functional.cross_entropy
    with torch.no_grad():
        assert ce(model(adv), y) > ce(model(x), y) + 0.01


def test_pgd_finds_the_optimal_attack_on_a_linear_model():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2))
    x = 0.3 + 0.4 * torch.rand(5, 3, 2, 2)  # far from the box edges
    y = torch.tensor([0, 1, 0, 1, 1])
    w = model[1].weight.detach()
    # cross-entropy grows with the other class's margin: the L-inf optimum is a corner
    direction = torch.where(y[:, None] == 0, w[1] - w[0], w[0] - w[1])
    best = x + EPS * direction.sign().view_as(x)
    adv = pgd(model, x, y, eps=EPS, step=2 / 255, steps=10, random_start=True)
    torch.testing.assert_close(adv, best, atol=1e-6, rtol=0)
    target = 1 - y  # a targeted attack towards the other class takes the same step
    adv_t = pgd(model, x, target, eps=EPS, step=2 / 255, steps=10, targeted=True)
    torch.testing.assert_close(adv_t, best, atol=1e-6, rtol=0)


def test_pgd_is_seeded_and_leaves_the_model_alone():
    model = _net().train()
    x, y = torch.rand(8, 3, 16, 16), torch.arange(8)
    a = pgd(model, x, y, steps=3, generator=torch.Generator().manual_seed(4))
    b = pgd(model, x, y, steps=3, generator=torch.Generator().manual_seed(4))
    c = pgd(model, x, y, steps=3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert model.training and all(p.grad is None for p in model.parameters())
    with torch.no_grad():  # works inside no_grad too
        pgd(model.eval(), x, y, steps=1)
    with pytest.raises(ValueError, match="norm must be"):
        pgd(model, x, y, norm="l1")
    with pytest.raises(ValueError, match="needs labels"):
        pgd(model, x)


def test_custom_loss_for_stitching_objectives():
    model = _net()
    x = torch.rand(4, 3, 16, 16)
    target = model(x).detach()

    def drift(out, _):  # push the output away from a reference, as a stitch attack may
        return (out - target).pow(2).sum()

    g = torch.Generator().manual_seed(0)
    start = pgd(model, x, loss_fn=drift, steps=0, generator=g)  # the random start only
    adv = pgd(model, x, loss_fn=drift, steps=5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert drift(model(adv), None) > 3 * drift(model(start), None) > 0


def test_robust_accuracy_without_budget_is_the_clean_accuracy():
    model = _net()
    x, y = data.shapes(64, seed=0, size=16)
    assert robust_accuracy(model, (x, y), eps=0.0, steps=2) == pytest.approx(
        accuracy_on(model, (x, y))
    )
    scores = evaluate_classifier(model, (x, y), robust="pgd", robust_samples=32)
    assert scores["robust_samples"] == 32 and scores["robust_accuracy"] <= 100
    assert scores["robust_attack"].startswith("PGD-20 Linf eps=8/255")


@pytest.mark.skipif(importlib.util.find_spec("autoattack") is not None, reason="installed")
def test_autoattack_missing_is_a_clear_error():
    with pytest.raises(ImportError, match="AutoAttack is not installed"):
        autoattack_accuracy(_net(), (torch.rand(2, 3, 16, 16), torch.arange(2)))
