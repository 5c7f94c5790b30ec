"""Corner cases of cutting models, on tiny hand-built modules with known answers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stitchlab as sl
from stitchlab.splitting import LogitsOnly, SplitError, TracedModel, select_logits, tap_model


class ConvBNReLU(nn.Module):
    """conv -> bn -> in-place ReLU: the value at ``bn`` is overwritten by the ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):  # noqa: D102
        x = self.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(self.pool(self.conv2(x)), 1))


def test_inplace_op_after_the_point_changes_nothing_the_caller_holds():
    torch.manual_seed(0)
    model = ConvBNReLU().eval()
    x = torch.randn(5, 3, 8, 8)
    front, back = sl.split(model, "bn")
    a = front(x)
    assert bool((a < 0).any())  # pre-ReLU values exist
    kept = a.clone()
    torch.testing.assert_close(back(a), model(x))
    assert torch.equal(a, kept)  # the back copied before its in-place ReLU
    # a tap at `bn` is the BatchNorm output (negatives included), not the ReLU's
    logits, taps = tap_model(model, ["bn", "conv2"])(x)
    torch.testing.assert_close(taps["bn"], kept)
    torch.testing.assert_close(logits, model(x))
    _, back_c = sl.split(model, "conv", taps=["bn"])
    _, later = back_c(model.conv(x))
    torch.testing.assert_close(later["bn"], kept)
    # no copy where none is needed: ResNet's block outputs feed fresh convolutions
    from stitchlab import models

    _, b = sl.split(models.create("resnet18", width=8).eval(), "layer1.0")
    assert "clone" not in b.code


class CachingModule(nn.Module):
    """Writes a cache keyed by device during forward (as timm's LeViT does)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.bias = nn.Parameter(torch.ones(4))
        self.cache: dict = {}
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):  # noqa: D102
        key = str(x.device)
        if not self.training:
            if key not in self.cache:
                self.cache[key] = self.bias * 2
            b = self.cache[key]
        else:
            b = self.bias * 2
        self.last_batch = x.shape[0]
        return self.fc2(torch.relu(self.fc1(x) + b))


def test_tracing_leaves_the_model_unchanged_and_can_be_repeated():
    model = CachingModule().eval()
    x = torch.randn(3, 4)
    ref = model(x)
    model.cache.clear()
    del model.last_batch
    state = dict(model.__dict__)
    for _ in range(3):  # tracing twice (or more) works
        f, b = sl.split(model, "fc1")
        torch.testing.assert_close(b(f(x)), ref)
        assert sl.stitch_points(model, which="all") == ["fc1"]
    assert model.cache == {} and "last_batch" not in model.__dict__
    assert set(model.__dict__) == set(state)


class ModeDependent(nn.Module):
    """Doubles its hidden activation in train mode only (Python control flow)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):  # noqa: D102
        h = self.fc1(x)
        if self.training:
            h = h * 2
        return self.fc2(h)


def test_halves_follow_train_and_eval_mode():
    torch.manual_seed(0)
    model = ModeDependent()
    x = torch.randn(4, 3)
    tm = TracedModel(model)
    assert not tm.same_in_both_modes
    front, back = tm.split("fc1")
    for mode in (True, False):
        model.train(mode)
        front.train(mode)
        back.train(mode)
        torch.testing.assert_close(back(front(x)), model(x))
    model.train()
    with torch.no_grad():  # hand-computed: fc2(2 fc1(x)) in train mode
        expected = model.fc2(2 * model.fc1(x))
    torch.testing.assert_close(back.train()(front(x)), expected)
    assert model.training  # tracing restored the mode it found


class TupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):  # noqa: D102
        feats = torch.flatten(self.pool(self.body(x)), 1)
        return self.fc(feats), feats


class DictOut(TupleOut):
    def forward(self, x):  # noqa: D102
        logits, feats = super().forward(x)
        return {"features": feats, "logits": logits}


class DictNoLogits(TupleOut):
    def forward(self, x):  # noqa: D102
        logits, feats = super().forward(x)
        return {"scores": logits, "features": feats}


@pytest.mark.parametrize("cls", [TupleOut, DictOut])
def test_tuple_and_dict_outputs_stitch_and_score(cls):
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.rand(40, 3, 8, 8)
    y = torch.randint(0, 3, (40,))
    logits = TupleOut.forward(model, x)[0]
    output = 0 if cls is TupleOut else None  # a tuple names its logits; a dict has "logits"
    f, b = sl.split(model, "body", output=output)
    torch.testing.assert_close(b(f(x)), logits)
    reference = LogitsOnly(model, output)  # the reference returns a tuple/dict too
    for objective in ("slm", "fula", "hlm"):
        s = sl.stitch(model, model, "body", (x, y), objective=objective, epochs=1,
                      init="identity", lr=0.0, output=output)  # fmt: skip
        scores = sl.evaluate(s, (x, y), reference)
        assert scores["agreement"] == pytest.approx(100.0, abs=1e-3)


def test_a_tuple_of_features_and_logits_is_not_guessed():
    # (features, logits): the old default (the first element) scored the features
    class FeaturesFirst(TupleOut):
        def forward(self, x):  # noqa: D102
            logits, feats = super().forward(x)
            return feats, logits

    model = FeaturesFirst().eval()
    for call in (lambda: sl.split(model, "body"), lambda: sl.stitch_points(model),
                 lambda: select_logits(model(torch.rand(2, 3, 8, 8)))):  # fmt: skip
        with pytest.raises(SplitError, match=r"tuple of 2 elements.*pass output=<index>"):
            call()
    x = torch.rand(2, 3, 8, 8)
    f, b = sl.split(model, "body", output=1)
    torch.testing.assert_close(b(f(x)), model(x)[1])


def test_output_selects_the_logits_or_says_how():
    model = DictNoLogits().eval()
    with pytest.raises(SplitError, match="output='<key>'"):
        sl.split(model, "body")
    f, b = sl.split(model, "body", output="scores")
    x = torch.rand(2, 3, 8, 8)
    torch.testing.assert_close(b(f(x)), model(x)["scores"])
    t = TupleOut().eval()
    _, b1 = sl.split(t, "body", output=1)  # the features as "logits"
    torch.testing.assert_close(b1(t.body(x)), t(x)[1])
    with pytest.raises(SplitError, match="index in 0..1"):
        sl.split(t, "body", output=5)


def test_shared_module_says_why_it_is_no_point():
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu, nn.Linear(3, 2))
    with pytest.raises(SplitError, match=r"'3'.*same module instance as '1'.*called 2 times"):
        sl.split(model, "3")


class Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace into it."""

    def forward(self, x):  # noqa: D102
        return x * 2 if float(x.detach().sum()) > 0 else x


class WithUntraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.odd = Untraceable()
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):  # noqa: D102
        return self.fc(torch.flatten(self.pool(self.conv2(self.odd(self.conv(x)))), 1))


def test_leaf_modules_reach_stitch_and_iris():
    torch.manual_seed(0)
    model = WithUntraceable().eval()
    x, y = torch.rand(16, 3, 8, 8), torch.randint(0, 3, (16,))
    with pytest.raises(SplitError, match="leaf_modules"):
        sl.stitch(model, model, "conv2", (x, y), epochs=0)
    s = sl.stitch(model, model, "conv2", (x, y), epochs=0, leaf_modules=(Untraceable,))
    assert s.init_residual < 1e-5  # self-stitching: least squares is the identity
    assert sl.evaluate(s, (x, y), model)["agreement"] == pytest.approx(100.0, abs=1e-3)
    iris = sl.generate_iris(model, "conv2", x[:4], steps=2, leaf_modules=(Untraceable,))
    assert iris.iris.shape == x[:4].shape


class Folded(nn.Module):
    """An activation reshaped so that no axis is the channel axis any more."""

    def forward(self, x):  # noqa: D102
        return x.reshape(x.shape[0], 2, -1)


class WithFolded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fold = Folded()
        self.fc = nn.Linear(64, 3)

    def forward(self, x):  # noqa: D102
        return self.fc(self.fold(self.conv(x)).flatten(1))


def test_unknown_layout_is_a_clear_error_and_can_be_named():
    torch.manual_seed(0)
    model = WithFolded().eval()
    x, y = torch.rand(8, 3, 4, 4), torch.randint(0, 3, (8,))
    fmt = TracedModel(model).formats(x[:3], ["conv", "fold"])
    assert fmt["conv"].spec.layout == "NCHW" and fmt["fold"].spec is None
    with pytest.raises(SplitError, match=r"'fold'.*cannot tell which axis.*layouts="):
        sl.stitch(model, model, "fold", (x, y), epochs=0)
    s = sl.stitch(model, model, "fold", (x, y), epochs=0, layouts={"fold": "NLC"})
    assert s.stitch_layer.src.layout == "NLC" and s.stitch_layer.src.channels == 32


class Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, 6, 9, stride=2)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv1d(6, 8, 5, stride=2)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):  # noqa: D102
        return self.fc(self.pool(self.conv2(self.act(self.conv1(x)))).flatten(1))


def test_conv1d_activations_are_channels_by_time_and_pass_the_twin_test():
    from test_zoo import _twin_test

    torch.manual_seed(0)
    model = Conv1dNet().eval()
    x, y = torch.randn(32, 1, 200), torch.randint(0, 3, (32,))
    tm = TracedModel(model)
    fmt = tm.formats(x[:3], ["conv1", "conv2"])
    assert fmt["conv1"].spec.layout == "NCL" and fmt["conv1"].spec.channels == 6
    assert fmt["conv1"].spec.grid == (1, 96)
    assert _twin_test(model, tm, "conv2", fmt["conv2"].spec, x, y) < 1e-4
    # different lengths (and layouts) still stitch over channels: conv1 -> conv2
    s = sl.stitch(model, model, "conv1", (x, y), back_point="conv2", epochs=0)
    assert s.stitch_layer.src.layout == s.stitch_layer.dst.layout == "NCL"
    assert s(x[:2]).shape == (2, 3)


def test_splitting_module_is_not_shadowed():
    import stitchlab.splitting as splitting

    assert callable(sl.split) and splitting.split is sl.split
    assert splitting.TracedModel is sl.TracedModel


def test_vector_points_pass_the_twin_test():
    from test_zoo import _twin_test

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6), nn.Tanh(),
                          nn.Linear(6, 3)).eval()  # fmt: skip
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    tm = TracedModel(model)
    for point in ("0", "3"):
        spec = tm.formats(x[:3], [point])[point].spec
        assert spec.layout == "NC"
        assert _twin_test(model, tm, point, spec, x, y) < 1e-4
