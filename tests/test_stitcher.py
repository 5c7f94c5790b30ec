"""The stitching life cycle: a Stitcher built once, its steps, protocols as objects, the
typed record, and shared work that changes no number."""

import dataclasses

import pytest
import torch

import stitchlab as sl
from stitchlab import models
from stitchlab.fit import TrainingConfig
from stitchlab.iris import IRIRecipe
from stitchlab.protocols import InvarianceAware, Standard, as_protocol
from stitchlab.stitched import StitchRecord

OBJECTIVES = ["hlm", "slm", "dm", "fula"]
QUICK = dict(epochs=2, batch_size=16, init_samples=24, lr=1e-2)


@pytest.fixture
def pair():
    torch.manual_seed(0)
    front = models.create("small_cnn", width=8).eval()
    torch.manual_seed(1)
    back = models.create("small_cnn", width=8).eval()
    return front, back


def _data(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def _state(model):
    return {k: v.clone() for k, v in model.stitch_layer.state_dict().items()}


def test_shared_work_gives_bit_identical_stitches(pair):
    """Four objectives on one Stitcher and StitchingSet == four independent stitch() calls."""
    front, back = pair
    data = _data()
    st = sl.Stitcher(front, back, "blocks.1")
    sset = st.collect(data)
    settings = TrainingConfig(**QUICK)
    for objective in OBJECTIVES:
        shared = st.fit(objective, sset, settings=settings)
        alone = sl.stitch(front, back, "blocks.1", data, objective, **QUICK)
        assert shared.history == alone.history, objective
        assert shared.init_residual == alone.init_residual
        for k, v in _state(alone).items():
            assert torch.equal(_state(shared)[k], v), (objective, k)
        assert shared.record.init_reused == (objective != OBJECTIVES[0])
        assert not alone.record.init_reused
    # the front ran once over the set; targets: labels with it, then logits, the stitch
    # point and (FuLA) the later points: one pass for each new target
    assert sset.passes == 4


def test_shared_iris_protocol_matches_stitch(pair):
    front, back = pair
    data = _data(32)
    recipe = IRIRecipe(steps=20)
    proto = InvarianceAware(recipe=recipe, allow_flagged=True)
    st = sl.Stitcher(front, back, "blocks.1")
    iris = st.collect(data, proto, seed=3)
    assert iris.protocol == "iris" and iris.iri_quality is not None
    init = st.initialise(data, samples=24, seed=3)
    for objective in ("slm", "dm"):
        shared = st.fit(objective, iris, init=init, settings=TrainingConfig(**QUICK, seed=3))
        alone = sl.stitch(front, back, "blocks.1", data, objective, protocol=proto, seed=3,
                          **QUICK)  # fmt: skip
        assert shared.history == alone.history
        assert shared.protocol == "iris" and shared.record.init_reused
        assert shared.iri_quality.median_error == alone.iri_quality.median_error


def test_initialise_is_least_squares_and_shared(pair):
    front, back = pair
    x, y = _data(32)
    st = sl.Stitcher(front, front, "blocks.2")
    init = st.initialise((x, y), samples=32)
    assert init.residual < 1e-3 and init.samples == 32  # a model onto itself: exact
    assert st.initialise((x, y), samples=32) is init  # same tensors, new tuple: shared
    assert st.initialise((x, y), samples=16) is not init
    model = st.fit("slm", (x, y), epochs=0, init_samples=32)
    assert st.evaluate(model, (x, y))["agreement"] == pytest.approx(100.0, abs=0.01)
    assert model.record.init_reused


def test_record_is_typed_and_frozen(pair):
    front, back = pair
    model = sl.Stitcher(front, back, "blocks.1").fit("dm", _data(), **QUICK)
    rec = model.record
    assert isinstance(rec, StitchRecord)
    assert rec.objective == "dm" and rec.protocol == "standard" and rec.cache_used
    assert len(rec.history) == 2 and len(rec.step_losses) == 2 * 3
    assert rec.settings.epochs == 2 and set(rec.timings) == {"init", "cache", "train"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.objective = "slm"


def test_misuse_is_refused_with_a_clear_error(pair):
    front, back = pair
    data = _data()
    a = sl.Stitcher(front, back, "blocks.1")
    b = sl.Stitcher(front, back, "blocks.2")
    with pytest.raises(ValueError, match="another Stitcher"):
        b.fit("slm", a.collect(data))
    with pytest.raises(TypeError, match="already has its protocol"):
        a.fit("slm", a.collect(data), protocol="iris")
    with pytest.raises(ValueError, match="runs on cpu"):
        a.fit("slm", data, device="meta")
    with pytest.raises(ValueError, match="protocol must be Standard"):
        as_protocol("invariant")
    with pytest.raises(ValueError, match="branches must be"):
        InvarianceAware(branches="sideways")
    with pytest.raises(TypeError, match="TrainingConfig"):
        a.fit("slm", data, settings={"epochs": 1})
    with pytest.raises(RuntimeError, match="setup"):
        _ = sl.Stitcher(front, back, "blocks.1").num_classes


def test_the_callers_models_and_rng_are_untouched(pair):
    front, back = pair
    before = [p.clone() for p in front.parameters()]
    state = torch.get_rng_state()
    st = sl.Stitcher(front, back, "blocks.1")
    st.fit("slm", st.collect(_data()), **QUICK)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(front.parameters(), before))
    assert all(p.requires_grad for p in front.parameters())


def test_train_mode_fits_do_not_change_the_shared_networks(pair):
    front, back = pair
    data = _data()
    st = sl.Stitcher(front, back, "blocks.1")
    ref = st.fit("slm", data, **QUICK)
    before = st.evaluate(ref, data)
    trained = st.fit("slm", data, frozen_mode="train", **QUICK)
    assert trained.cache_used is False  # streamed: BatchNorm sees batches
    assert st.evaluate(ref, data) == before  # the Stitcher's networks kept their statistics
    assert trained.front is not ref.front


def test_standard_protocol_object_and_names_agree(pair):
    front, back = pair
    data = _data()
    by_name = sl.stitch(front, back, "blocks.1", data, "slm", protocol="standard", **QUICK)
    by_object = sl.stitch(front, back, "blocks.1", data, "slm", protocol=Standard(), **QUICK)
    assert by_name.history == by_object.history


def test_scores_on_front_activations_equal_scores_on_the_data(pair):
    front, back = pair
    data, test = _data(), _data(70, seed=3)
    st = sl.Stitcher(front, back, "blocks.1")
    acts = st.front_activations(test, batch_size=32)
    assert len(acts) == 70 and torch.equal(acts.labels, test[1])
    assert st.front_activations(test, budget_bytes=1) is None  # over the budget: none
    with torch.no_grad():
        torch.testing.assert_close(acts.activations, st.front_prefix(test[0]), rtol=0, atol=1e-6)
        ref = back(test[0])
    for objective in ("slm", "dm"):
        model = st.fit(objective, data, **QUICK)
        on_data = st.evaluate(model, test, ref, batch_size=32)
        assert st.evaluate(model, acts, ref, batch_size=32) == on_data
    with pytest.raises(TypeError, match="logits"):
        st.evaluate(model, acts, back)
    with pytest.raises(ValueError, match="attack"):
        st.evaluate(model, acts, ref, attack={"eps": 0.1})
    other = sl.Stitcher(front, back, "blocks.1")
    with pytest.raises(ValueError, match="another Stitcher"):
        other.evaluate(other.fit("slm", data, **QUICK), acts, ref)
    trained = st.fit("slm", data, frozen_mode="train", **QUICK)  # its own front copy
    with pytest.raises(ValueError, match="not fitted by this one"):
        st.evaluate(trained, acts, ref)
