"""Stitching: identities, invariances, objectives and the training loop."""

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import stitchlab as sl
from stitchlab import models
from stitchlab.layers import StitchShapeError
from stitchlab.objectives import FuLA, StitchOutputs, make_objective
from stitchlab.splitting import SplitError, later_points, tap_model

SELF_MODELS = {
    "resnet18": dict(width=8),
    "vgg16_bn": dict(width=8),
    "vit_tiny_patch4_32": dict(width=48),
    "small_cnn": dict(),
}


@pytest.mark.parametrize("name", list(SELF_MODELS))
@pytest.mark.parametrize("init", ["identity", "least_squares"])
def test_model_stitched_to_itself_scores_100_everywhere(name, init, images):
    torch.manual_seed(0)
    model = models.create(name, **SELF_MODELS[name]).eval()
    x, y = images[0][:32], images[1][:32]
    for point in sl.stitch_points(model):
        s = sl.stitch(model, model, point, (x, y), epochs=0, init=init, init_samples=32)
        scores = sl.evaluate(s, (x, y), model)
        assert scores["agreement"] == pytest.approx(100.0, abs=0.01), point
        assert scores["hard_agreement"] == 100.0
        if init == "least_squares":
            # a vector point wider than the 32 images (ViT's 48-wide pre_logits) leaves the
            # least squares under-determined: a small ridge replaces the exact fit there
            feat = s.front(x[:2])
            under = feat.dim() == 2 and feat.shape[1] + 1 > 32
            assert s.init_residual < (0.02 if under else 1e-3), point


def _permuted_copy(model: models.SmallCNN, block: int) -> models.SmallCNN:
    """A functionally identical copy with the channels after ``block`` permuted."""
    other = copy.deepcopy(model)
    conv, bn, _ = other.blocks[block]
    perm = torch.randperm(conv.out_channels, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        conv.weight.copy_(conv.weight[perm])
        for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
            t.copy_(t[perm])
        nxt = other.blocks[block + 1][0] if block + 1 < len(other.blocks) else other.fc
        nxt.weight.copy_(nxt.weight[:, perm])
    return other


@pytest.mark.parametrize("solver", ["least_squares", "closed_form"])
def test_permuted_copy_scores_100(solver, images):
    torch.manual_seed(0)
    model = models.create("small_cnn", width=8).eval()
    x, y = images
    # train BN statistics a little so that the copy is not trivially symmetric
    model.train()
    with torch.no_grad():
        model(x)
    model.eval()
    for block in range(3):
        other = _permuted_copy(model, block).eval()
        torch.testing.assert_close(other(x), model(x), rtol=1e-4, atol=1e-5)
        point = f"blocks.{block}"
        options = dict(objective="dm", solver="closed_form") if solver == "closed_form" else {}
        s = sl.stitch(model, other, point, (x, y), epochs=0, **options)
        assert sl.evaluate(s, (x, y), other)["agreement"] == pytest.approx(100.0, abs=0.01)
        # the stitch found the permutation: each row of the 1x1 conv is one-hot (or zero
        # for a channel that is dead on these images)
        w = s.stitch_layer.main.weight.detach().abs()
        assert torch.allclose(w.sum(1), w.max(1).values, atol=1e-3)
        assert ((w.max(1).values - 1).abs() < 1e-3).sum() >= w.shape[0] - 2


def _outputs_and_targets(model, point, x, y):
    """Identity stitch of ``model`` with itself: outputs and targets by hand."""
    later = later_points(model, point)
    front, back = sl.split(model, point, taps="later")
    a = front(x)
    logits, acts = back(a)
    out = StitchOutputs(logits, {point: a, **acts})
    ref_logits, ref_acts = tap_model(model, [point, *later])(x)
    targets = {"labels": y, "logits": ref_logits, **ref_acts}
    return out, targets, later


@pytest.mark.parametrize("name", ["slm", "dm", "fula"])
def test_objective_is_zero_at_the_optimum(name, images):
    model = models.create("small_cnn", width=8).eval()
    x, y = images
    out, targets, later = _outputs_and_targets(model, "blocks.1", x, y)
    obj = make_objective(name).bind("blocks.1", later)
    assert float(obj(out, targets)) == pytest.approx(0.0, abs=1e-6)


def test_hlm_is_cross_entropy_and_vanishes_for_confident_correct_logits():
    y = torch.tensor([0, 2, 1])
    hlm = make_objective("hlm").bind("p", [])
    confident = StitchOutputs(100 * nn.functional.one_hot(y, 3).float())
    assert float(hlm(confident, {"labels": y})) == pytest.approx(0.0, abs=1e-6)
    uniform = StitchOutputs(torch.zeros(3, 3))
    assert float(hlm(uniform, {"labels": y})) == pytest.approx(float(torch.log(torch.tensor(3.0))))


def test_objective_hand_values():
    # SLM: KL(p_g || p_s) with p_g = (0.5, 0.5), p_s = softmax(log 3, 0) = (0.75, 0.25)
    s = StitchOutputs(torch.tensor([[float(torch.log(torch.tensor(3.0))), 0.0]]))
    kl = 0.5 * torch.log(torch.tensor(0.5 / 0.75)) + 0.5 * torch.log(torch.tensor(0.5 / 0.25))
    slm = make_objective("slm").bind("p", [])
    assert float(slm(s, {"logits": torch.zeros(1, 2)})) == pytest.approx(float(kl), abs=1e-6)
    # DM: ||(1,2) - (1,1)|| / ||(1,1)|| = 1 / sqrt(2)
    dm = make_objective("dm").bind("p", [])
    out = StitchOutputs(None, {"p": torch.tensor([[1.0, 2.0]])})
    assert float(dm(out, {"p": torch.tensor([[1.0, 1.0]])})) == pytest.approx(2**-0.5)
    # FuLA: uniform mean of 1/sqrt(2) at p and 0 at q; weights (3, 1) give 3/4 of it
    out.activations["q"] = torch.ones(1, 3)
    tgt = {"p": torch.tensor([[1.0, 1.0]]), "q": torch.ones(1, 3)}
    fula = make_objective("fula").bind("p", ["q"])
    assert float(fula(out, tgt)) == pytest.approx(0.5 * 2**-0.5)
    fula_w = FuLA(weights=[3, 1]).bind("p", ["q"])
    assert float(fula_w(out, tgt)) == pytest.approx(0.75 * 2**-0.5)
    with pytest.raises(ValueError, match="not later stitch points"):
        FuLA(points=["r"]).bind("p", ["q"])


@pytest.mark.parametrize("objective", ["hlm", "slm", "dm", "fula"])
def test_gradient_reaches_only_the_stitch_layer(objective, images):
    model = models.create("small_cnn", width=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = images
    s = sl.stitch(
        model,
        model,
        "blocks.1",
        (x, y),
        objective=objective,
        epochs=1,
        batch_size=16,
        init="random",
    )
    s.train()
    out = s(x)
    nn.functional.cross_entropy(out, y).backward()
    frozen = [p for n, p in s.named_parameters() if not n.startswith("stitch_layer")]
    assert frozen and all(p.grad is None and not p.requires_grad for p in frozen)
    assert all(p.grad is not None for p in s.stitch_layer.parameters())
    # the caller's model is untouched: weights, buffers, grad flags, mode
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.requires_grad for p in model.parameters()) and model.training


def test_training_improves_on_a_bad_start_and_is_reproducible(images):
    torch.manual_seed(0)
    a = models.create("small_cnn", width=8).eval()
    x, y = images
    runs = [
        sl.stitch(
            a,
            a,
            "blocks.2",
            (x, y),
            objective="slm",
            epochs=6,
            init="random",
            batch_size=16,
            lr=1e-2,
            seed=3,
        )
        for _ in range(2)
    ]
    assert runs[0].history == runs[1].history
    assert runs[0].history[-1] < 0.5 * runs[0].history[0]


def test_cache_and_stream_give_the_same_loss_curve(images):
    model = models.create("small_cnn", width=8).eval()
    x, y = images
    kw = dict(objective="fula", epochs=2, batch_size=16, seed=1)
    cached = sl.stitch(model, model, "blocks.1", (x, y), cache=True, **kw)
    streamed = sl.stitch(model, model, "blocks.1", (x, y), cache=False, **kw)
    assert cached.cache_used and not streamed.cache_used
    assert cached.history == pytest.approx(streamed.history, rel=1e-5, abs=1e-7)
    tiny = sl.stitch(model, model, "blocks.1", (x, y), cache_budget_bytes=1000, **kw)
    assert not tiny.cache_used
    with pytest.raises(MemoryError, match="budget"):
        sl.stitch(model, model, "blocks.1", (x, y), cache=True, cache_budget_bytes=1000, **kw)


class Augmented(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.rand_like(self.x[i]), int(self.y[i])


def test_augmented_data_is_streamed_and_loaders_are_accepted(images):
    model = models.create("small_cnn", width=8).eval()
    x, y = images
    s = sl.stitch(model, model, "blocks.1", Augmented(x, y), objective="slm", epochs=1)
    assert not s.cache_used
    dl = DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    s2 = sl.stitch(model, model, "blocks.1", dl, objective="dm", epochs=1)
    assert s2.cache_used and len(s2.history) == 1


def test_closed_form_dm_beats_adam(images):
    torch.manual_seed(0)
    a = models.create("small_cnn", width=8).eval()
    torch.manual_seed(1)
    b = models.create("small_cnn", width=8).eval()
    x, y = images
    closed = sl.stitch(a, b, "blocks.2", (x, y), objective="dm", solver="closed_form")
    adam = sl.stitch(
        a, b, "blocks.2", (x, y), objective="dm", epochs=5, init="random", batch_size=64
    )
    with torch.no_grad():
        za = sl.split(b, "blocks.2")[0](x)

        def dm(s):
            return float(sl.objectives.relative_error(s.stitch_layer(s.front(x)), za))

    assert dm(closed) == pytest.approx(closed.history[0], rel=1e-4)
    assert dm(closed) < dm(adam)


def test_cnn_to_vit_and_back(images):
    torch.manual_seed(0)
    cnn = models.create("small_cnn", width=8).eval()
    vit = models.create("vit_tiny_patch4_32", width=48, depth=4).eval()
    x, y = images
    s = sl.stitch(cnn, vit, "blocks.1", (x, y), back_point="blocks.1", objective="slm", epochs=1)
    assert s.stitch_layer.prefix is not None and s(x).shape == (64, 10)
    s2 = sl.stitch(vit, cnn, "blocks.2", (x, y), back_point="blocks.2", objective="dm", epochs=1)
    assert s2(x).shape == (64, 10)
    s3 = sl.stitch(cnn, vit, "blocks.3", (x, y), back_point="pre_logits", epochs=0)
    assert s3.stitch_layer.dst.kind == "vector"


def test_bad_input_gets_clear_errors(images):
    model = models.create("small_cnn", width=8)
    x, y = images
    with pytest.raises(TypeError, match="Unknown training option.*epoch"):
        sl.stitch(model, model, "blocks.1", (x, y), epoch=3)
    with pytest.raises(ValueError, match="Unknown objective"):
        sl.stitch(model, model, "blocks.1", (x, y), objective="kl")
    with pytest.raises(ValueError, match="must be float32"):
        sl.stitch(model, model, "blocks.1", ((x * 255).byte(), y))
    with pytest.raises(SplitError, match="Valid points"):
        sl.stitch(model, model, "block.1", (x, y))
    with pytest.raises(ValueError, match="closed_form"):
        sl.stitch(model, model, "blocks.1", (x, y), objective="slm", solver="closed_form")
    vit = models.create("vit_tiny_patch4_32", width=48, depth=2)
    with pytest.raises(StitchShapeError, match="vector"):
        sl.stitch(vit, model, "pre_logits", (x, y), back_point="blocks.1", epochs=0)


def test_bn_training_mode_option_runs_streamed(images):
    model = models.create("small_cnn", width=8).eval()
    x, y = images
    s = sl.stitch(
        model,
        model,
        "blocks.1",
        (x, y),
        objective="slm",
        epochs=1,
        frozen_mode="train",
        batch_size=32,
    )
    assert not s.cache_used and not s.front.training  # eval mode after training


def test_adversarial_stitch_training_and_robust_scores(images):
    model = models.create("small_cnn", width=8).eval()
    x, y = images
    s = sl.stitch(
        model,
        model,
        "blocks.1",
        (x, y),
        objective="slm",
        epochs=1,
        batch_size=32,
        adversarial={"eps": 4 / 255, "steps": 2},
    )
    assert not s.cache_used  # attacked inputs change every step
    scores = sl.evaluate(s, (x, y), model, attack={"eps": 4 / 255, "steps": 2})
    assert {"robust_agreement", "robust_accuracy"} <= set(scores)
    assert 0 <= scores["robust_agreement"] <= 100
    # identical stitch, identity layer: under attack both models still see the same input
    ident = sl.stitch(model, model, "blocks.1", (x, y), epochs=0, init="identity")
    attacked = sl.evaluate(ident, (x, y), model, attack={"eps": 8 / 255, "steps": 3})
    assert attacked["robust_agreement"] == pytest.approx(100.0, abs=1e-3)
    # attack only the first 10 test images: same clean scores, 10 attacked
    few = sl.evaluate(ident, (x, y), model, attack={"eps": 8 / 255, "steps": 3, "samples": 10})
    assert few["robust_samples"] == 10 and attacked["robust_samples"] == len(x)
    assert few["agreement"] == attacked["agreement"]
    with pytest.raises(ValueError, match="eps, step, steps"):
        sl.stitch(model, model, "blocks.1", (x, y), adversarial={"radius": 1})
    with pytest.raises(ValueError, match="samples must be a positive integer"):
        sl.evaluate(ident, (x, y), model, attack={"samples": 0})
    with pytest.raises(ValueError, match="eps must be a number"):
        sl.evaluate(ident, (x, y), model, attack={"eps": "8/255"})
    with pytest.raises(ValueError, match="closed_form.*adversarial"):
        sl.stitch(model, model, "blocks.1", (x, y), objective="dm", solver="closed_form",
                  adversarial={"steps": 1})  # fmt: skip
