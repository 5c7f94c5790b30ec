"""The default IRI recipe's smooth inner ReLU gradient, its switch to the exact one, Adam's
second moment decay 0.95 and no momentum pushing a pixel out of the box."""

import math

import pytest
import torch
from torch import nn

from stitchlab.iris import IRIRecipe, generate_iris
from stitchlab.iris.front import _frozen_front
from stitchlab.iris.smooth import _smooth_relus_of


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _net() -> nn.Sequential:
    """x -> relu(x + b) -> relu(w . h): an inner ReLU on two units, a final ReLU."""
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1, bias=False), nn.ReLU(),
                      nn.Linear(1, 2))  # fmt: skip
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(2))
        m[0].bias.fill_(-0.5)
        m[2].weight.copy_(torch.tensor([[2.0, -1.0]]))
    return m


def _conv_net() -> nn.Sequential:
    """Two convolutions with ReLUs (the first inner at point "3"), then a 1x1 head."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 1),
                         nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()  # fmt: skip


def _spy_steps(monkeypatch) -> list[tuple]:
    """Record ``(exact, measure, rows)`` of every :meth:`_SmoothReLUs.step` call."""
    from stitchlab.iris import smooth

    calls = []
    step = smooth._SmoothReLUs.step

    def spy(self, rows, exact=False, measure=None):
        calls.append((exact, measure, None if rows is None else rows.tolist()))
        step(self, rows, exact, measure)

    monkeypatch.setattr(smooth._SmoothReLUs, "step", spy)
    return calls


def test_smooth_relu_gradient_is_a_sigmoid_of_the_sources_width():
    """Backward of an inner ReLU: max(floor, sigmoid(z / (width x sd of the source's
    pre-activation))), per sample; the final ReLU passes the gradient; the forward is exact.
    Hand-computed: source 0 has pre-activation (0.3, -0.3), sd (unbiased) 0.3 sqrt(2);
    source 1 has (0.4, -0.4), sd 0.4 sqrt(2)."""
    m = _net()
    front = _frozen_front(m, "3", relu_grad="smooth", relu_width=0.3, relu_floor=0.05)
    smooth = _smooth_relus_of(front)
    assert smooth is not None
    sources = torch.tensor([[0.8, 0.2], [0.9, 0.1]])
    with torch.no_grad(), smooth.recording():
        front(sources)
    x = torch.tensor([[0.4, 0.45], [0.4, -0.5]])  # pre-activations (-0.1, -0.05), (-0.1, -1.0)
    for rows, expect_rows in ((None, (0, 1)), (torch.tensor([1, 0]), (1, 0))):
        smooth.step(rows)
        xi = x.clone().requires_grad_(True)
        out = front(xi)
        with torch.no_grad():
            torch.testing.assert_close(out, m[:4](x))  # the forward is the model's
        out.sum().backward()
        for i, src in enumerate(expect_rows):
            w = 0.3 * (0.3, 0.4)[src] * math.sqrt(2)
            z = (float(x[i, 0]) - 0.5, float(x[i, 1]) - 0.5)
            expect = [2.0 * max(0.05, _sigmoid(z[0] / w)), -1.0 * max(0.05, _sigmoid(z[1] / w))]
            torch.testing.assert_close(xi.grad[i], torch.tensor(expect), rtol=1e-5, atol=1e-7)
    # the second input's unit 2 (z = -1.0) is far below: the floor passes 0.05 of the gradient
    assert float(xi.grad[1, 1]) == pytest.approx(-0.05)
    # without a floor the backward is the sigmoid alone (one fused kernel)
    front0 = _frozen_front(m, "3", relu_grad="smooth", relu_width=0.3, relu_floor=0.0)
    smooth0 = _smooth_relus_of(front0)
    with torch.no_grad(), smooth0.recording():
        front0(sources[1:])
    smooth0.step(None)
    xi = x[1:].clone().requires_grad_(True)
    front0(xi).sum().backward()
    w = 0.3 * 0.4 * math.sqrt(2)
    expect = [2.0 * _sigmoid(-0.1 / w), -1.0 * _sigmoid(-1.0 / w)]
    torch.testing.assert_close(xi.grad[0], torch.tensor(expect), rtol=1e-5, atol=1e-8)
    # outside a step (measurement) the ReLUs are plain ones
    smooth0.off()
    xi = x[1:].clone().requires_grad_(True)
    front0(xi).sum().backward()
    assert torch.equal(xi.grad, torch.zeros(1, 2))


def test_smooth_relu_keeps_the_activations_dtype():
    """Under bfloat16 (autocast on a GPU) the kept tensor is bfloat16, not a float32 copy
    promoted by the float32 widths, and the gradient is max(floor, sigmoid(z * inv)) to
    bfloat16's precision; an in-place ReLU overwrites its input as the model's does."""
    from stitchlab.iris.smooth import _SmoothReLUFn

    z = torch.linspace(-3.0, 3.0, 13).reshape(1, 13, 1, 1).repeat(2, 1, 1, 1)
    inv = torch.tensor([2.0, 0.5]).reshape(2, 1, 1, 1)  # float32, per sample
    expect = torch.clamp_min(torch.sigmoid(z * inv), 0.05)
    for inplace in (False, True):
        x = z.to(torch.bfloat16).requires_grad_(True)
        h = x.clone()  # a non-leaf, as a conv's output, so in place is allowed
        out = _SmoothReLUFn.apply(h, inv, 0.05, inplace)
        assert out.dtype == torch.bfloat16
        assert torch.equal(out, z.to(torch.bfloat16).clamp_min(0))
        assert (out.data_ptr() == h.data_ptr()) == inplace
        kept = out.grad_fn.saved_tensors[0]
        assert kept.dtype == torch.bfloat16
        out.backward(torch.ones_like(out))
        torch.testing.assert_close(x.grad.float(), expect, rtol=1e-2, atol=1e-3)
    # float32 stays float32 and exact to float32's precision
    x = z.clone().requires_grad_(True)
    _SmoothReLUFn.apply(x.clone(), inv, 0.05, False).sum().backward()
    torch.testing.assert_close(x.grad, expect, rtol=1e-6, atol=1e-7)


def test_exact_steps_take_the_exact_inner_relu_gradient():
    """A step with ``exact=True`` (the recipe's last ``exact_relu_steps``) backpropagates
    the exact ReLU gradient at the inner ReLUs (0 where the unit is off, 1 where on, by
    hand on _net: inner pre-activations (-0.1, -0.05) and (-0.1, -1.0) are all off, so the
    gradient is 0), the final ReLU still straight through; the forward is the same."""
    m = _net()
    front = _frozen_front(m, "3", relu_grad="smooth", relu_width=0.3, relu_floor=0.05)
    smooth = _smooth_relus_of(front)
    with torch.no_grad(), smooth.recording():
        front(torch.tensor([[0.8, 0.2], [0.9, 0.1]]))
    x = torch.tensor([[0.4, 0.45], [0.4, -0.5], [0.7, 0.3]])  # the third: (0.2, -0.2)
    smooth.step(torch.tensor([0, 1, 0]), exact=True)
    xi = x.clone().requires_grad_(True)
    out = front(xi)
    with torch.no_grad():
        torch.testing.assert_close(out, m[:4](x))
    out.sum().backward()
    # the final ReLU (output 2 * 0.2 = 0.4 > 0, and 0 where the inner units are off) passes
    # the gradient; the inner ones pass 1 where on (unit 1 of the third input), 0 elsewhere
    assert torch.equal(xi.grad, torch.tensor([[0.0, 0.0], [0.0, 0.0], [2.0, 0.0]]))
    smooth.step(None)  # and the next plain step is smooth again
    xi = x[:1].clone().requires_grad_(True)
    front(xi).sum().backward()
    assert float(xi.grad[0, 0]) > 0.05


def test_exact_relu_steps_run_the_last_steps_exact(monkeypatch):
    """Of 10 steps with exact_relu_steps=4, the first 6 are smooth and the last 4 exact;
    exact_relu_steps=0 is the smooth gradient to the last step (as the audio preset)."""
    calls = _spy_steps(monkeypatch)
    torch.manual_seed(0)
    net = _conv_net()
    x = torch.rand(2, 3, 6, 6)
    generate_iris(net, "3", x, steps=10, exact_relu_steps=4, tolerance=None)
    assert [c[0] for c in calls] == [False] * 6 + [True] * 4
    calls.clear()
    generate_iris(net, "3", x, steps=10, exact_relu_steps=0, exact_relu_mismatch=None,
                  tolerance=None)
    assert [c[0] for c in calls] == [False] * 10
    assert IRIRecipe().exact_relu_steps == 90
    assert IRIRecipe().key_dict()["exact_relu_steps"] == 90
    assert IRIRecipe.from_kwargs(preset="audio").exact_relu_steps == 0
    assert "exact in the last 90 steps" in IRIRecipe().describe()
    assert "exact in the last" not in IRIRecipe(exact_relu_steps=0).describe()
    with pytest.raises(ValueError, match="exact_relu_steps"):
        IRIRecipe.from_kwargs(exact_relu_steps=-1)


def test_smooth_keeps_in_place_relus_in_place():
    from stitchlab import models

    net = models.create("resnet18", width=4).eval()
    front = _frozen_front(net, "layer2.1", relu_grad="smooth")
    smooth = _smooth_relus_of(front)
    calls = [n for n in front.graph.nodes if getattr(n.target, "__self__", None) is smooth]
    assert len(calls) == 8 and all(n.args[1] is True for n in calls)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad(), smooth.recording():
        torch.testing.assert_close(front(x), net.layer2[1](net.layer2[0](
            net.layer1(net.relu(net.bn1(net.conv1(x)))))))  # fmt: skip
    assert len(smooth.inv_widths) == 8 and smooth.inv_widths[0].shape == (2, 4, 1, 1)


def test_preset_keys_name_every_field():
    """A stored set's key is the whole resolved recipe (store format 4)."""
    from stitchlab.iris.front import AFFINE_RULE

    d = IRIRecipe().key_dict()
    assert (d["steps"], d["relu_grad"], d["relu_width"], d["relu_floor"]) == (
        270, "smooth", 0.3, 0.05)  # fmt: skip
    assert d["affine_rule"] == AFFINE_RULE and set(d) - {"affine_rule"} == set(
        IRIRecipe().as_dict())  # fmt: skip
    paper = IRIRecipe.paper().key_dict()
    assert (paper["optimizer"], paper["amp"], paper["tolerance"], paper["polyak"]) == (
        "sign", "off", None, None)  # fmt: skip
    assert "affine_rule" not in paper
    for bad in ({"relu_width": 0.0}, {"relu_floor": 1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            IRIRecipe.from_kwargs(**bad)
    assert "smooth" in IRIRecipe().describe() and "beta2 0.95" in IRIRecipe().describe()
    # the audio preset: the image default's loop in STFT coordinates
    a = IRIRecipe.from_kwargs(preset="audio").key_dict()
    assert (a["stft_window"], a["relu_grad"], a["precision"]) == (256, "smooth", "int16")


def test_outward_momentum_is_dropped():
    """One pixel, identity front, source 0.02, start at the box centre, constant Adam steps
    of 0.1: the pixel overshoots below 0 and is clipped. The momentum that pushed it out is
    dropped, so the next step moves it back up (towards 0.02); with Adam's momentum kept
    it would stay on the edge for several steps."""
    m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 2))
    with torch.no_grad():
        m[0].weight.fill_(1.0)
    src = torch.tensor([[0.02]])

    kw = dict(final_step_size=None, tolerance=None, start="scaled_noise", start_scale=1e-9,
              precision="float32", relu_grad="exact", polyak=None)  # fmt: skip (full steps)
    path = [float(generate_iris(m, "0", src, steps=k, **kw).iris) for k in range(1, 11)]
    first = path.index(0.0)  # the step that clipped the pixel
    assert path[: first] == sorted(path[: first], reverse=True)  # on its way down
    assert path[first + 1] > 0.0  # moved back up at once


def test_smooth_width_without_a_map_uses_the_samples_units():
    """A 1x1 map gives no spread over the map: the width comes from the sample's units
    (here the two channels, as in the hand-computed case above); one unit alone gives a
    finite, nearly exact gradient, never NaN."""
    conv = nn.Sequential(nn.Conv2d(2, 2, 1), nn.ReLU(), nn.Conv2d(2, 1, 1, bias=False), nn.ReLU(),
                         nn.Flatten(), nn.Linear(1, 2))  # fmt: skip
    with torch.no_grad():
        conv[0].weight.copy_(torch.eye(2).view(2, 2, 1, 1))
        conv[0].bias.fill_(-0.5)
        conv[2].weight.copy_(torch.tensor([2.0, -1.0]).view(1, 2, 1, 1))
    front = _frozen_front(conv, "3", relu_grad="smooth", relu_width=0.3, relu_floor=0.05)
    smooth = _smooth_relus_of(front)
    with torch.no_grad(), smooth.recording():
        front(torch.tensor([[0.8, 0.2]]).view(1, 2, 1, 1))
    smooth.step(None)
    xi = torch.tensor([[0.4, 0.45]]).view(1, 2, 1, 1).requires_grad_(True)
    front(xi).sum().backward()
    w = 0.3 * 0.3 * math.sqrt(2)
    expect = torch.tensor([2.0 * _sigmoid(-0.1 / w), -1.0 * _sigmoid(-0.05 / w)])
    torch.testing.assert_close(xi.grad.flatten(), expect, rtol=1e-5, atol=1e-7)
    one = nn.Sequential(nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 2))
    r = generate_iris(one, "3", torch.rand(4, 1), steps=5)
    assert torch.isfinite(r.rel_error).all()


def _rgb_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).eval()  # fmt: skip


def test_a_converged_sample_keeps_the_iterate_that_met_the_tolerance():
    """One pixel, identity front, source 0.37, start 0.5, signed steps of 0.1, tolerance
    0.1 (by hand: 0.5 -> 0.4, error 0.081, below the tolerance). The sample stops there and
    keeps 0.4; with keep_converged=False (the audio preset) it also takes that iteration's
    step, to 0.3 (error 0.189, above the tolerance it had met)."""
    m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 2))
    with torch.no_grad():
        m[0].weight.fill_(1.0)
    src = torch.tensor([[0.37]])

    def final(**kw) -> float:
        kw = {"optimizer": "sign", "step_size": 0.1, "final_step_size": None,
              "tolerance": 0.1, "start": "scaled_noise", "start_scale": 1e-9,
              "precision": "float32", "relu_grad": "exact", "steps": 20, "polyak": None,
              **kw}  # fmt: skip (full steps: this front is affine, see test_iris_polyak.py)
        return float(generate_iris(m, "0", src, **kw).iris)

    assert final() == pytest.approx(0.4, abs=1e-6)
    assert final(keep_converged=False) == pytest.approx(0.3, abs=1e-6)
    assert final(tolerance=None) == pytest.approx(0.3, abs=1e-6)  # no stop: 0.4, 0.3, ... 0.3
    assert IRIRecipe().key_dict()["keep_converged"] is True


def test_mismatch_is_the_share_of_units_in_another_state_than_the_sources():
    """Hand-computed on _net: the sources' inner pre-activations are (0.3, -0.3) and (-0.3,
    0.4), so their states are (on, off) and (off, on). The inputs below give (-0.1, -0.05)
    and (-0.1, -1.0): all off, so one unit differs in each sample (2 of 4 units). The input
    (0.7, 0.3) gives (0.2, -0.2), source 0's states: both units differ from source 1's and
    none from source 0's, so the rows a step runs on decide."""
    front = _frozen_front(_net(), "3", relu_grad="smooth", relu_width=0.3, relu_floor=0.05)
    smooth = _smooth_relus_of(front)
    with torch.no_grad(), smooth.recording(keep_states=True):
        front(torch.tensor([[0.8, 0.2], [0.2, 0.9]]))
    assert [s.tolist() for s in smooth.source_on] == [[[True, False], [False, True]]]
    x = torch.tensor([[0.4, 0.45], [0.4, -0.5]])
    smooth.step(None, measure=0.1)
    front(x.clone().requires_grad_(True))
    assert smooth.mismatch() == 0.5
    for rows, expect in (([1], 1.0), ([0], 0.0)):
        smooth.step(torch.tensor(rows), measure=0.1)
        front(torch.tensor([[0.7, 0.3]], requires_grad=True))
        assert smooth.mismatch() == expect
    smooth.off()  # the sources' states are released with the batch
    assert smooth.source_on == []
    for kw in ({}, {"exact": True, "measure": 0.1}):  # nothing measured
        smooth.step(None, **kw)
        front(x.clone().requires_grad_(True))
        assert smooth.mismatch() == math.inf


def test_the_exact_gradient_comes_at_the_first_check_at_or_below_the_mismatch(monkeypatch):
    """Checks come every MISMATCH_EVERY smooth steps (t = 9, 19, ...); at the first whose
    mismatch is at most exact_relu_mismatch, every later step is exact. Scripted mismatches
    0.5 then 0.1 (the threshold itself): steps 0-19 smooth, 20-39 exact."""
    from stitchlab.iris import smooth
    from stitchlab.iris.recipe import MISMATCH_EVERY

    assert MISMATCH_EVERY == 10
    script = iter([0.5, 0.1])
    calls = _spy_steps(monkeypatch)
    monkeypatch.setattr(smooth._SmoothReLUs, "mismatch", lambda self: next(script))
    torch.manual_seed(0)
    net = _conv_net()
    x = torch.rand(2, 3, 6, 6)
    generate_iris(net, "3", x, steps=40, exact_relu_steps=5, tolerance=None)
    assert [c[0] for c in calls] == [False] * 20 + [True] * 20
    assert [(t, c[1]) for t, c in enumerate(calls) if c[1] is not None] == [(9, 0.1), (19, 0.1)]
    # without the switch no check is made and the smooth steps run to step 35
    calls.clear()
    generate_iris(net, "3", x, steps=40, exact_relu_steps=5, tolerance=None,
                  exact_relu_mismatch=None)
    assert [c[0] for c in calls] == [False] * 35 + [True] * 5
    assert all(c[1] is None for c in calls)


def test_the_mismatch_is_measured_on_the_samples_still_running(monkeypatch):
    """Sample 0 is made to meet the tolerance at step 5 (its error reported as 0): the
    check at step 9 then runs on rows 1 and 2 only, and measures a share of their units."""
    import stitchlab.iris.descent as descent
    from stitchlab.iris import smooth

    calls = _spy_steps(monkeypatch)
    seen = []
    error_and_grad, mismatch = descent._error_and_grad, smooth._SmoothReLUs.mismatch

    def stop_sample_0_at_step_5(f, target, target_norm):
        err, grad = error_and_grad(f, target, target_norm)
        if len(calls) == 6:
            err = err.clone()
            err[0] = 0.0
        return err, grad

    def spy_mismatch(self):
        seen.append(mismatch(self))
        return seen[-1]

    monkeypatch.setattr(descent, "_error_and_grad", stop_sample_0_at_step_5)
    monkeypatch.setattr(smooth._SmoothReLUs, "mismatch", spy_mismatch)
    torch.manual_seed(0)
    generate_iris(_conv_net(), "3", torch.rand(3, 3, 6, 6), steps=30, exact_relu_steps=5,
                  tolerance=1e-9, amp="off")  # fmt: skip
    checks = [(t, c[2]) for t, c in enumerate(calls) if c[1] is not None]
    assert checks[0] == (9, [1, 2]) and all(rows == [1, 2] for _, rows in checks)
    assert len(seen) >= 1 and all(0.0 <= m <= 1.0 for m in seen)


def test_measuring_the_mismatch_changes_no_bit(monkeypatch):
    """Where the switch never comes, the default's IRIs are those without the switch bit for
    bit (the comparison reads the activations and writes nothing); where it comes they
    differ."""
    from stitchlab.iris import smooth

    torch.manual_seed(0)
    net = _conv_net()
    x = torch.rand(3, 3, 6, 6)
    kw = {"steps": 30, "exact_relu_steps": 5, "tolerance": None, "amp": "off"}
    v7 = generate_iris(net, "3", x, exact_relu_mismatch=None, **kw)
    with monkeypatch.context() as m:
        m.setattr(smooth._SmoothReLUs, "mismatch", lambda self: 1.0)
        never = generate_iris(net, "3", x, **kw)
    assert torch.equal(never.iris, v7.iris)
    with monkeypatch.context() as m:
        m.setattr(smooth._SmoothReLUs, "mismatch", lambda self: 0.0)
        at_once = generate_iris(net, "3", x, **kw)
    assert not torch.equal(at_once.iris, v7.iris)


def test_exact_relu_mismatch_is_checked_resolved_and_keyed():
    from stitchlab.iris.front import _recipe_front

    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="exact_relu_mismatch"):
            IRIRecipe.from_kwargs(exact_relu_mismatch=bad)
    d = IRIRecipe().key_dict()
    assert d["exact_relu_mismatch"] == 0.1
    for rec in (IRIRecipe(exact_relu_mismatch=None), IRIRecipe.paper()):
        assert not rec.switches_on_states()
    net = _net()
    x = torch.rand(2, 2)
    rec = IRIRecipe()
    inner = rec.for_front(_recipe_front(net, "3", (), None, rec), x)
    assert inner.exact_relu_mismatch == 0.1
    # no inner ReLU (the first ReLU ends the front, straight through): nothing to switch
    first = rec.for_front(_recipe_front(net, "1", (), None, rec), x)
    assert first.exact_relu_mismatch is None and first.key_dict()["exact_relu_mismatch"] is None
    assert "10% of every inner ReLU's units" in IRIRecipe().describe()
    assert "differ in state" not in IRIRecipe(exact_relu_mismatch=None).describe()


def test_mismatch_stops_measuring_after_the_first_relu_above_the_threshold():
    """Two inner ReLUs, by hand: the sources' states are (on, off) at both; the input's
    are all off at both, so each differs at 2 of 4 units (0.5). Under a threshold of 0.1
    the first ReLU is already above it and the second is not measured; under 0.6 both are."""
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2, bias=False), nn.ReLU(),
                      nn.Linear(2, 1, bias=False), nn.ReLU(), nn.Linear(1, 2))  # fmt: skip
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(2))
        m[0].bias.fill_(-0.5)
        m[2].weight.copy_(torch.eye(2))
        m[4].weight.fill_(1.0)
    front = _frozen_front(m, "5", relu_grad="smooth", relu_width=0.3, relu_floor=0.05)
    smooth = _smooth_relus_of(front)
    with torch.no_grad(), smooth.recording(keep_states=True):
        front(torch.tensor([[0.8, 0.2], [0.9, 0.1]]))
    assert [s.tolist() for s in smooth.source_on] == [[[True, False], [True, False]]] * 2
    x = torch.tensor([[0.4, 0.45], [0.4, -0.5]])
    for threshold, measured in ((0.1, [0.5]), (0.6, [0.5, 0.5])):
        smooth.step(None, measure=threshold)
        front(x.clone().requires_grad_(True))
        assert smooth._mismatches == measured and smooth.mismatch() == 0.5
