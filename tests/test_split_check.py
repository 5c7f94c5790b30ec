"""Splits that check themselves: every cut is run on an example batch and compared with
the whole model; in-place calls after a point are kept in the back (issue 58)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stitchlab as sl
import stitchlab.splitting as splitting
from stitchlab.splitting import SplitError, TracedModel


class InplaceNet(nn.Module):
    """The issue's example: in-place method calls whose results are not used."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):  # noqa: D102
        h = self.a(x)
        h.mul_(0.5).relu_()
        return self.fc(self.b(h).mean((2, 3)))


def test_inplace_calls_after_the_point_are_kept_exactly():
    torch.manual_seed(0)
    net = InplaceNet().eval()
    x = torch.rand(4, 3, 16, 16)
    assert "a" in sl.stitch_points(net)
    f, b = sl.split(net, "a")
    with torch.no_grad():
        a = f(x)
        kept = a.clone()
        assert torch.equal(b(a), net(x))
        assert torch.equal(a, kept)  # the back copied before modifying it
        assert bool((kept < 0).any())  # the front returns a's own output (pre-ReLU)
        _, back = sl.split(net, "a", taps=["b"])
        logits, acts = back(f(x))
        assert torch.equal(logits, net(x))
        assert torch.equal(acts["b"], net.b(torch.relu(0.5 * net.a(x))))
        assert torch.equal(splitting.tap_model(net, ["a"])(x)[1]["a"], net.a(x))


class ViewThenInplace(nn.Module):
    """The point is a view of an earlier tensor that is then modified in place."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.v = nn.Flatten(2)  # a view of a's output
        self.fc = nn.Linear(4, 3)

    def forward(self, x):  # noqa: D102
        h = self.a(x)
        p = self.v(h)
        h.mul_(2.0)  # changes p too; a back starting at p never sees h
        return self.fc(p.mean(2))


def test_inplace_change_a_back_cannot_reproduce_is_no_point():
    torch.manual_seed(0)
    net = ViewThenInplace().eval()
    points = sl.stitch_points(net, which="all")
    assert "v" not in points and "a" in points
    with pytest.raises(SplitError, match=r"'v'.*in-place operation mul_"):
        sl.split(net, "v")
    x = torch.rand(2, 3, 5, 5)
    f, b = sl.split(net, "a")
    with torch.no_grad():
        assert torch.equal(b(f(x)), net(x))


def test_a_back_that_leaves_out_operations_is_refused(monkeypatch):
    # the check itself: a back built the old way (ancestors of the output only) drops the
    # in-place calls, and the split says so instead of returning it
    monkeypatch.setattr(
        splitting, "_back_keep", lambda t, node, roots: splitting._ancestors(roots, stop=node)
    )
    with pytest.raises(SplitError, match=r"at 'a' is not exact.*does not reproduce: mul_"):
        sl.split(InplaceNet().eval(), "a")


SCALE = [1.0]


class ReadsAGlobal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):  # noqa: D102
        return self.fc2(self.fc1(x)) * SCALE[0]  # a Python value frozen by the trace


def test_a_trace_that_differs_from_the_model_is_refused():
    tm = TracedModel(ReadsAGlobal(), example=torch.rand(3, 4))
    SCALE[0] = 2.0
    try:
        with pytest.raises(SplitError, match="does not reproduce its output"):
            tm.verify(torch.rand(3, 4))
    finally:
        SCALE[0] = 1.0


class BNDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.3)
        self.block = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.fc = nn.Linear(6, 4)

    def forward(self, x):  # noqa: D102
        h = self.drop(torch.relu(self.bn(self.conv(x))))
        if self.training:
            h = h * 1.5
        return self.fc(self.block(h).mean((2, 3)))


@pytest.mark.parametrize("training", [True, False])
def test_the_check_changes_no_parameter_buffer_flag_or_random_state(training):
    torch.manual_seed(0)
    net = BNDrop().train(training)
    net.bn.eval()  # a mixed model keeps its mix
    before = {k: v.clone() for k, v in net.state_dict().items()}
    flags = [m.training for m in net.modules()]
    x = torch.rand(4, 3, 8, 8)
    rng = torch.get_rng_state()
    tm = TracedModel(net, example=x)
    assert not tm.same_in_both_modes  # both graphs are checked
    for p in ("conv", "bn", "drop", "block"):
        tm.split(p, taps="later")
    tm.tap(["bn", "block"])
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [m.training for m in net.modules()] == flags
    assert torch.equal(torch.get_rng_state(), rng)


def test_without_an_example_the_first_batch_checks_the_cut(monkeypatch):
    class Doubles(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 4)
            self.out = nn.Linear(4, 2)

        def forward(self, x):  # noqa: D102
            return self.out(self.fc(torch.cat([x, x], 1)))  # takes 4 features, not 8

    net = Doubles().eval()
    tm = TracedModel(net)  # the guess from fc (8 features) does not run: no example yet
    assert not tm._refs
    f, b = tm.split("fc")
    x = torch.rand(5, 4)
    with torch.no_grad():
        assert torch.equal(b(f(x)), net(x))  # the first call checked the cut on x
    assert tm._refs and tm._example is x
    f, b = sl.split(net, "fc", example=torch.rand(3, 4))
    f, b = sl.split(net, "fc", verify=False)  # unchecked, on request
    # a cut that is not exact stops at its first batch instead of giving a number
    monkeypatch.setattr(
        splitting, "_back_keep", lambda t, node, roots: splitting._ancestors(roots, stop=node)
    )

    class Later(Doubles):
        def forward(self, x):  # noqa: D102
            h = self.fc(torch.cat([x, x], 1))
            h.mul_(2.0)
            return self.out(h)

    f, b = sl.split(Later().eval(), "fc")
    with pytest.raises(SplitError, match=r"at 'fc' is not exact.*does not reproduce: mul_"):
        f(x)


def test_inplace_module_and_method_without_users():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(5, 6)
            self.act = nn.ReLU(inplace=True)
            self.b = nn.Linear(6, 3)

        def forward(self, x):  # noqa: D102
            h = self.a(x)
            self.act(h)  # result unused: h is modified in place
            h.clamp_(max=0.5)
            return self.b(h)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(7, 5)
    f, b = sl.split(net, "a")
    with torch.no_grad():
        assert torch.equal(b(f(x)), net(x))


def test_a_deferred_check_runs_once_also_for_copies_of_the_front(monkeypatch):
    import copy

    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    tm = TracedModel(net, verify=True)
    tm._refs.clear()  # as if no example could be guessed
    f, _ = tm.split("0")
    f2 = copy.deepcopy(f)  # IRI code copies fronts
    calls = []
    check = TracedModel._check_halves
    monkeypatch.setattr(TracedModel, "_check_halves",
                        lambda self, *a, **k: calls.append(1) or check(self, *a, **k))  # fmt: skip
    x = torch.rand(3, 4)
    for _ in range(3):
        f2(x)
        f(x)
    assert len(calls) == 1
