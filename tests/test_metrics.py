"""Scores against hand-computed values."""

import math

import pytest
import torch

import stitchlab as sl
from stitchlab import metrics

BIG = 100.0  # logits that make a softmax one-hot to float precision


def test_agreement_identity_and_hand_values():
    logits = torch.randn(50, 10)
    assert metrics.agreement(logits, logits) == pytest.approx(100.0)
    # one-hot against uniform over 2 classes: <p,q> = 0.5, max(|p|^2, |q|^2) = 1
    assert metrics.agreement(torch.tensor([[BIG, 0.0]]), torch.zeros(1, 2)) == pytest.approx(50.0)
    # disjoint one-hots: 0
    disjoint = metrics.agreement(torch.tensor([[BIG, 0.0]]), torch.tensor([[0.0, BIG]]))
    assert disjoint == pytest.approx(0)
    # p = (0.75, 0.25), q = (0.5, 0.5): 0.5 / max(0.625, 0.5) = 0.8
    p = torch.tensor([[math.log(3.0), 0.0]])
    assert metrics.agreement(p, torch.zeros(1, 2)) == pytest.approx(80.0)


def test_agreement_is_symmetric_and_shift_invariant():
    a, b = torch.randn(20, 5), torch.randn(20, 5)
    assert metrics.agreement(a, b) == pytest.approx(metrics.agreement(b, a))
    assert metrics.agreement(a + 3.0, b) == pytest.approx(metrics.agreement(a, b))


def test_accuracy_hard_agreement_error_consistency():
    labels = torch.tensor([0, 1, 1, 0])
    a = torch.tensor([[1.0, 0], [0, 1], [1, 0], [1, 0]])  # correct: T T F T
    b = torch.tensor([[1.0, 0], [1, 0], [0, 1], [1, 0]])  # correct: T F T T
    assert metrics.accuracy(a, labels) == 75.0
    assert metrics.hard_agreement(a, b) == 50.0
    # c_obs = 2/4, c_exp = .75*.75 + .25*.25 = .625, kappa = (.5 - .625) / .375 = -1/3
    assert metrics.error_consistency(a, b, labels) == pytest.approx(-1 / 3)
    assert metrics.error_consistency(a, a, labels) == pytest.approx(1.0)


def test_chance_normalisation_excess_and_layer_average():
    assert metrics.chance_normalised(10.0, 10) == pytest.approx(0.0)
    assert metrics.chance_normalised(100.0, 10) == pytest.approx(100.0)
    assert metrics.chance_normalised(55.0, 10) == pytest.approx(50.0)
    assert metrics.excess_agreement(90.0, 30.0) == 60.0
    assert metrics.layer_average([80, 90, 100]) == 90.0
    with pytest.raises(ValueError):
        metrics.layer_average([])
    with pytest.raises(ValueError, match="equal shape"):
        metrics.agreement(torch.zeros(3, 2), torch.zeros(3, 4))


def test_evaluate_returns_every_score(images):
    from stitchlab import models

    model = models.create("small_cnn", width=8).eval()
    x, y = images
    s = sl.stitch(model, model, "blocks.0", (x, y), epochs=0, init="identity")
    scores = sl.evaluate(s, (x, y), model)
    assert set(scores) == {
        "agreement",
        "agreement_ci_low",
        "agreement_ci_high",
        "agreement_normalized",
        "accuracy",
        "hard_agreement",
        "error_consistency",
        "reference_accuracy",
    }
    assert scores["accuracy"] == scores["reference_accuracy"]
    with torch.no_grad():
        ref_logits = model(x)
    assert sl.evaluate(s, (x, y), ref_logits)["agreement"] == pytest.approx(100.0)


def test_cka_invariances_and_known_values():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 20, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(20, 20, generator=g, dtype=torch.float64))
    assert metrics.cka(x, x) == pytest.approx(1.0)
    assert metrics.cka(x, x @ q) == pytest.approx(1.0)  # a rotated copy scores as identical
    assert metrics.cka(x, 3.5 * x) == pytest.approx(1.0)  # isotropic scaling
    y = torch.randn(200, 30, generator=g, dtype=torch.float64)
    assert metrics.cka(x, y) == pytest.approx(metrics.cka(y, x))
    assert abs(metrics.cka(x, y)) < 0.05  # independent features: about 0 (unbiased estimator)
    # a representation that keeps half of the (equal-variance) directions: CKA = sqrt(1/2)
    half = torch.cat([x[:, :10], torch.zeros(200, 10, dtype=torch.float64)], 1)
    assert metrics.cka(x, half) == pytest.approx(0.5**0.5, abs=0.08)
    with pytest.raises(ValueError, match="same inputs"):
        metrics.cka(x, y[:10])


def test_agreement_interval_known_values():
    """Bootstrap over test images: all agreeing gives [100, 100]; 50 of 100 agreeing gives
    about 50 +- 1.96 x 5 (the binomial standard error), and the same for a seed."""
    from stitchlab.metrics import agreement_interval

    a = 100 * torch.eye(4)[torch.arange(100) % 4]  # confident: agreement 1 or 0 per image
    assert agreement_interval(a, a) == (100.0, 100.0)
    b = a.clone()
    b[:50] = 100 * torch.eye(4)[(torch.arange(50) + 1) % 4]  # the first 50 disagree
    low, high = agreement_interval(a, b)
    assert 38 <= low <= 42 and 58 <= high <= 62
    assert agreement_interval(a, b) == (low, high)
