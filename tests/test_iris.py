"""Identically represented inputs: known answers, quality, storage, protocol."""

import warnings

import pytest
import torch
from torch import nn

import stitchlab as sl
from stitchlab import models
from stitchlab.data import shapes
from stitchlab.iris import IRIError, IRIRecipe, IRISet, generate_iris, generate_iris_set
from stitchlab.train import train_classifier

# signed-step recipes (the paper's optimiser with a decaying step)
DECAY = dict(preset="paper", step_size=4 / 255, final_step_size=0.2 / 255)  # fine convergence
FAST = dict(preset="paper", step_size=8 / 255, final_step_size=0.5 / 255)  # few steps


@pytest.fixture(scope="module")
def trained():
    """A small CNN trained for a few seconds on generated shapes, and its data."""
    torch.manual_seed(0)
    x, y = shapes(800, seed=0)
    model = models.create("small_cnn", width=8)
    train_classifier(model, (x, y), epochs=2, seed=0)
    return model.eval(), x, y


def test_invertible_first_layer_gives_back_the_source():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Flatten(), nn.Linear(3 * 8 * 8, 2))
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor([[1.0, 0.5, 0], [0, 1, 0.3], [0.2, 0, 1]])[:, :, None, None])
    x = torch.rand(8, 3, 8, 8)
    r = generate_iris(m, "0", x, steps=200, **DECAY)
    assert float((r.iris - x).abs().max()) <= 1 / 255  # within uint8 quantisation
    assert float(r.rel_error.median()) < 0.01


def test_ignored_channel_stays_unrelated_to_the_source():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 2))
    with torch.no_grad():
        m[0].weight[:, 2] = 0  # the first layer ignores the blue channel
    x = torch.rand(8, 3, 8, 8)
    r = generate_iris(m, "0", x, steps=200, **DECAY)
    used = (r.iris[:, :2] - x[:, :2]).abs().mean()
    ignored = r.iris[:, 2].flatten() - 0.5, x[:, 2].flatten() - 0.5
    corr = torch.corrcoef(torch.stack(ignored))[0, 1]
    assert float(used) < 2 / 255
    assert abs(float(corr)) < 0.1
    assert float(r.pixel_rms.median()) > 0.1  # the ignored channel is far from the source
    # the ignored channel never moved from its noise start: same seed, zero steps
    start = generate_iris(m, "0", x, steps=0)
    torch.testing.assert_close(r.iris[:, 2], start.iris[:, 2])


def test_trained_network_iris_beat_the_noise_start(trained):
    model, x, _ = trained
    start = generate_iris(model, "blocks.0", x[:32], steps=0)
    iris = generate_iris(model, "blocks.0", x[:32], preset="paper")  # 200 x 1/255
    assert float(iris.rel_error.median()) < 0.25 * float(start.rel_error.median())
    assert float(iris.iris.min()) >= 0 and float(iris.iris.max()) <= 1
    q = iris.quality()
    assert not q.flagged and q.median_error == pytest.approx(float(iris.rel_error.median()))


def test_deterministic_for_a_seed_and_runs_only_the_prefix(trained):
    model, x, _ = trained
    calls = []
    handle = model.fc.register_forward_hook(lambda *_: calls.append(1))
    a = generate_iris(model, "blocks.1", x[:16], steps=5, seed=3)
    checks = len(calls)  # the split's self-check: the whole model on 2 samples, a few times
    b = generate_iris(model, "blocks.1", x[:16], steps=5, seed=3)
    c = generate_iris(model, "blocks.1", x[:16], steps=40, seed=4)
    handle.remove()
    assert checks <= 4 and len(calls) == 3 * checks  # the steps run the prefix only
    assert torch.equal(a.iris, b.iris) and not torch.equal(a.iris, c.iris)


def test_options_box_start_optimizer_tolerance(trained):
    model, x, _ = trained
    xn = x[:16] * 2 - 1  # normalised inputs in [-1, 1]
    r = generate_iris(model, "blocks.0", xn, steps=3, box=(-1, 1))
    assert float(r.iris.min()) >= -1 and float(r.iris.max()) <= 1 and float(r.iris.min()) < 0
    with pytest.raises(ValueError, match="outside the box"):
        generate_iris(model, "blocks.0", xn, steps=1)
    for kw in (
        dict(optimizer="adam", step_size=0.02),
        dict(optimizer="sign", step_size=1 / 255),
        dict(start="image"),
    ):
        res = generate_iris(model, "blocks.0", x[:16], steps=10, **kw)
        assert res.iris.shape == x[:16].shape
    counted = []
    h = model.blocks[0][0].register_forward_hook(lambda m, i, o: counted.append(i[0].shape[0]))
    generate_iris(model, "blocks.0", x[:16], steps=50, tolerance=0.9, **DECAY)
    h.remove()
    assert sum(counted) < 50 * 16  # samples stopped early
    with pytest.raises(TypeError, match="Unknown IRI option"):
        generate_iris(model, "blocks.0", x[:4], stepz=3)


def test_iri_set_resumes_to_identical_bytes_and_checks_files(trained, tmp_path):
    model, x, y = trained
    data = (x[:96], y[:96])
    kw = dict(steps=4, batch_size=16, chunk_size=32, threshold=10.0)  # 4 steps: poor IRIs
    straight = generate_iris_set(model, "blocks.1", data, tmp_path / "a", **kw)

    class Killed(Exception):
        pass

    def kill_after_first(i, n):
        if i == 0:
            raise Killed

    with pytest.raises(Killed):
        generate_iris_set(model, "blocks.1", data, tmp_path / "b", on_chunk=kill_after_first, **kw)
    with pytest.raises(IRIError, match="incomplete"):
        IRISet(next((tmp_path / "b").iterdir()))
    finished = []
    resumed = generate_iris_set(
        model, "blocks.1", data, tmp_path / "b", on_chunk=lambda i, n: finished.append(i), **kw
    )
    assert finished == [1, 2]  # chunk 0 was reused
    for i in range(straight.num_chunks):
        name = f"chunk_{i:05d}.safetensors"
        assert (straight.root / name).read_bytes() == (resumed.root / name).read_bytes()
    assert straight.root.name == resumed.root.name  # same key
    assert len(resumed) == 96 and resumed[5][1] == int(y[5])
    torch.testing.assert_close(
        resumed.images()[:16], generate_iris(model, "blocks.1", x[:16], steps=4).iris
    )

    # a damaged chunk is refused on load and regenerated on the next run
    path = resumed.root / "chunk_00001.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(IRIError, match="damaged"):
        IRISet(resumed.root)
    with pytest.warns(UserWarning, match="damaged"):
        again = generate_iris_set(model, "blocks.1", data, tmp_path / "b", **kw)
    assert path.read_bytes() == (straight.root / "chunk_00001.safetensors").read_bytes()
    assert again.quality.n == 96

    # another recipe is another key
    other = generate_iris_set(model, "blocks.1", data, tmp_path / "b", **{**kw, "steps": 5})
    assert other.root != resumed.root


@pytest.fixture(scope="module")
def iris_blocks2(trained):
    """IRIs of 256 stitching images at blocks.2, stitchlab's default recipe."""
    model, x, _ = trained
    return generate_iris(model, "blocks.2", x[:256])


@pytest.mark.parametrize("objective", ["slm", "dm", "fula"])
def test_identical_stitching_under_iris_scores_about_100(trained, iris_blocks2, objective):
    model, x, y = trained
    assert not iris_blocks2.quality().flagged
    s = sl.stitch(
        model,
        model,
        "blocks.2",
        (x[:256], y[:256]),
        objective=objective,
        protocol=sl.InvarianceAware(iris=iris_blocks2),
        epochs=2,
    )
    assert s.protocol == "iris" and s.iri_quality is not None
    assert sl.evaluate(s, (x[256:512], y[256:512]), model)["agreement"] > 98.0


def test_iris_protocol_inputs_variants_and_refusals(trained, tmp_path):
    model, x, y = trained
    data = (x[:64], y[:64])
    iris = generate_iris(model, "blocks.1", data[0])
    for branches in ("front", "back"):
        s = sl.stitch(
            model,
            model,
            "blocks.1",
            data,
            objective="slm",
            protocol=sl.InvarianceAware(iris=iris, branches=branches),
            epochs=1,
        )
        assert sl.evaluate(s, data, model)["agreement"] > 90
    s = sl.stitch(
        model, model, "blocks.1", data, objective="hlm",
        protocol=sl.InvarianceAware(iris=iris.iris), epochs=1,
    )  # fmt: skip
    assert s.iri_quality is None
    cached = sl.stitch(
        model,
        model,
        "blocks.1",
        data,
        objective="dm",
        protocol=sl.InvarianceAware(cache=tmp_path, recipe=IRIRecipe(steps=3), allow_flagged=True),
        epochs=0,
    )
    assert cached.iri_quality.flagged  # 3 steps cannot converge
    with pytest.raises(IRIError, match=r"InvarianceAware\(allow_flagged=True\)"):
        sl.stitch(
            model,
            model,
            "blocks.1",
            data,
            protocol=sl.InvarianceAware(cache=tmp_path, recipe=IRIRecipe(steps=3)),
            epochs=0,
        )
    with pytest.raises(ValueError, match="one IRI per image"):
        sl.stitch(model, model, "blocks.1", data,
                  protocol=sl.InvarianceAware(iris=iris.iris[:10]))  # fmt: skip
    for old in ("iris", "iris_cache", "iris_options", "allow_flagged_iris"):  # went to the protocol
        with pytest.raises(TypeError, match=r"protocol=InvarianceAware\(\.\.\.\)"):
            sl.stitch(model, model, "blocks.1", data, **{old: iris})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate_iris_set(model, "blocks.1", data, tmp_path / "ok")


def test_default_recipe_converges_where_the_papers_does_not(trained):
    """stitchlab's recipe (Adam, decaying, gradient through the final ReLU, tolerance) is
    at most 0.05 and at least as close as the paper's at every point of a trained net."""
    model, x, _ = trained
    for point in ("blocks.0", "blocks.1", "blocks.2", "blocks.3"):
        ours = generate_iris(model, point, x[:32]).quality()
        paper = generate_iris(model, point, x[:32], preset="paper").quality()
        assert ours.median_error <= 0.05 and ours.median_error <= paper.median_error, point
        assert not ours.flagged and ours.null_ratio > 10


def test_straight_through_relu_is_exact_forward_and_identity_backward():
    from stitchlab.iris.front import straight_through_relu

    x = torch.tensor([-1.0, 0.5, 2.0], requires_grad=True)
    y = straight_through_relu(x)
    assert torch.equal(y, torch.tensor([0.0, 0.5, 2.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))  # the dead unit gets a gradient too
    # on a net whose point is a ReLU output, the reported error is the exact one
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 2))
    xs = torch.rand(8, 3, 8, 8)
    r = generate_iris(m, "1", xs, steps=30)  # the smooth gradient: the final ReLU straight through
    with torch.no_grad():
        t, f = m[1](m[0](xs)), m[1](m[0](r.iris))
    exact = (f - t).flatten(1).norm(dim=1) / t.flatten(1).norm(dim=1)
    torch.testing.assert_close(r.rel_error, exact, rtol=1e-4, atol=1e-5)


def test_removed_presets_and_options_are_refused_by_name():
    """The earlier defaults and the options no preset used are gone: naming one is a clear
    error that says what to do, never a silently different recipe."""
    from stitchlab.iris import PRESETS, IRIRecipe

    assert sorted(PRESETS) == ["audio", "default", "paper"]
    for old in ("v1", "v3", "v7", "audio-v1"):
        with pytest.raises(ValueError, match=f"preset '{old}' was an earlier default"):
            IRIRecipe.from_kwargs(preset=old)
    for name, value in (("optimizer", "lbfgs"), ("optimizer", "l2"),
                        ("relu_grad", "surrogate"), ("relu_grad", "straight_through"),
                        ("start", "blur")):  # fmt: skip
        with pytest.raises(ValueError, match=f"{name}='{value}' .* has been removed"):
            IRIRecipe.from_kwargs(**{name: value})
    for name, value in (("relu_slope", 0.1), ("history", 20), ("colour_basis", "opponent"),
                        ("polyak_fronts", "all"), ("adam_beta2", 0.999),
                        ("drop_outward_momentum", False)):  # fmt: skip
        with pytest.raises(TypeError, match=f"IRI option '{name}' .* has been removed"):
            IRIRecipe.from_kwargs(**{name: value})
    with pytest.raises(TypeError, match="optimizer"):  # not through the constructor either
        IRIRecipe(optimizer="lbfgs").validate()


def test_quality_is_judged_against_the_null():
    from stitchlab.iris import IRIQuality

    # two images whose representations are 1 apart (relative): errors of 0.05 are 20x
    err, rms = torch.tensor([0.05, 0.05]), torch.zeros(2)
    q = IRIQuality.of(err, rms, threshold=0.5, null_error=torch.tensor([1.0, 1.0]))
    assert q.null_ratio == pytest.approx(20.0) and not q.flagged
    q = IRIQuality.of(err * 4, rms, threshold=0.5, null_error=torch.tensor([1.0, 1.0]))
    assert q.flagged and "5.0x closer" in q.why_flagged and "5x closer" in str(q)
    nan = IRIQuality.of(torch.tensor([float("nan"), 0.1]), rms, threshold=0.5)
    assert nan.flagged and "not finite" in nan.why_flagged
    # the null measured by generate_iris: the next image's representation in the batch
    m = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.Linear(3, 2))
    x = torch.rand(2, 1, 2, 2)
    r = generate_iris(m, "1", x, steps=1)
    with torch.no_grad():
        t = m[1](m[0](x))
    expected = (t.roll(-1, 0) - t).norm(dim=1) / t.norm(dim=1)
    torch.testing.assert_close(r.null_error, expected)


def test_iri_agreement_hand_computed():
    """A model that reads only pixel 0: IRIs that change pixel 1 leave it at 100; flipping
    pixel 0 of one IRI in four gives 75 (softmax one-hot to e^-100)."""
    from stitchlab.evaluation import iri_agreement

    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([[50.0, 0.0], [-50.0, 0.0]]))
    src = torch.tensor([[1.0, 0.3], [-1.0, 0.1], [1.0, -0.7], [-1.0, 0.9]]).view(4, 1, 1, 2)
    labels = torch.tensor([0, 1, 0, 1])
    iris = src.clone()
    iris[..., 1] = torch.tensor([-0.5, 0.5, 2.0, -2.0]).view(4, 1, 1)
    same = iri_agreement(model, (iris, labels), (src, labels))
    assert same["agreement"] == pytest.approx(100.0, abs=1e-9)
    assert same["hard_agreement"] == 100.0
    iris[2, ..., 0] = -1.0
    one_off = iri_agreement(model, (iris, labels), (src, labels))
    assert one_off["agreement"] == pytest.approx(75.0, abs=1e-9)
    assert one_off["hard_agreement"] == 75.0
    assert one_off["agreement_ci_low"] <= 75.0 <= one_off["agreement_ci_high"]
    # the null pairs each source with another (seed 0: 0-2, 1-0, 2-3, 3-1); two of the
    # four pairs have the same class, so the model agrees on half of them
    assert one_off["null_agreement"] == pytest.approx(50.0, abs=1e-9)
    with pytest.raises(ValueError, match="3 IRIs for 4 source images"):
        iri_agreement(model, (iris[:3], labels[:3]), (src, labels))


def test_recipe_describe_names_every_choice():
    """The one-line description the report shows (hand-written expected text)."""
    from stitchlab.iris import IRIRecipe

    assert IRIRecipe().describe() == (
        "270 adam steps 0.1 -> 0.01 (beta2 0.95, no momentum out of the box, whitened by "
        "the first convolution where the front starts with one, each at most 0.3 x its "
        "Polyak step on fronts affine up to the final ReLU) from uniform noise over "
        "the box, ReLU gradient smooth inside (sigmoid of width 0.3 x the source's sd, at "
        "least 0.05; exact in the last 90 steps; exact once at most 10% of every inner "
        "ReLU's units differ in state from the source's), straight through at the output, "
        "per-sample tolerance 0.01, box (0, "
        "1), stored as uint8, in bfloat16 on CUDA, the last 30 in float32 and all once the "
        "batch's median is below 0.02, float32 elsewhere"
    )
    assert "whitened by the first convolution) from" in IRIRecipe(
        precondition="first_layer", polyak=None
    ).describe()
    assert IRIRecipe.paper().describe() == (
        "200 sign steps 1/255 from uniform noise over the box, exact ReLU gradient, no "
        "early stop, box (0, 1), stored as uint8, in float32"
    )
    quiet = IRIRecipe(start="scaled_noise", start_scale=0.1, step_size=0.03)
    assert "from Gaussian noise (sd 0.1) around the box centre" in quiet.describe()
    assert "0.03 -> 0.01" in quiet.describe()


def test_iris_command_prints_quality_and_recipe(tmp_path, capsys):
    from stitchlab.cli import main

    code = main(["iris", "small_cnn", "blocks.0", "--cache", str(tmp_path), "--random-init",
                 "--n", "8", "--steps", "2", "--preset", "paper"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "relative error median" in out
    assert "recipe: 2 sign steps 1/255 from uniform noise over the box, exact ReLU gradient" in out
