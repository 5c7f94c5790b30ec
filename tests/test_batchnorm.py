"""Eval-mode BatchNorm folded into the convolution before it: exact where it folds, left
alone where folding would change the function, and IRIs unchanged but for rounding."""

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from stitchlab import models
from stitchlab._batchnorm import ENV, fold_batchnorm, folded, mode
from stitchlab.iris import generate_iris, generate_iris_set
from stitchlab.iris.front import _frozen_front


def _hand_net() -> nn.Module:
    """1x1 conv (weight 2, bias 1), BatchNorm (mean 3, var + eps = 4, weight 0.5, bias -1):
    y = ((2x + 1) - 3) / 2 * 0.5 - 1 = 0.5 x - 1.5."""
    net = nn.Sequential(nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1), nn.ReLU())
    with torch.no_grad():
        net[0].weight.fill_(2.0)
        net[0].bias.fill_(1.0)
        net[1].running_mean.fill_(3.0)
        net[1].running_var.fill_(4.0 - net[1].eps)
        net[1].weight.fill_(0.5)
        net[1].bias.fill_(-1.0)
    return net.eval()


def test_hand_computed_fold():
    gm = fx.symbolic_trace(_hand_net())
    assert fold_batchnorm(gm) == 1
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gm.modules())
    conv = gm.get_submodule("0")
    assert conv.weight.item() == pytest.approx(0.5, abs=1e-7)
    assert conv.bias.item() == pytest.approx(-1.5, abs=1e-7)
    x = torch.tensor([-2.0, 0.0, 3.0, 5.0]).view(4, 1, 1, 1)
    assert gm(x).flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0], abs=1e-6)


class _Residual(nn.Module):
    """None of these may fold: conv1's output feeds its BatchNorm and a residual sum;
    conv2 is called twice; bn3 normalises by the batch even in eval mode; conv5's weight is
    also read directly. conv4 -> bn4 may."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)
        self.conv2, self.bn2 = nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)
        self.conv3 = nn.Conv2d(3, 3, 1)
        self.bn3 = nn.BatchNorm2d(3, track_running_stats=False)
        self.conv4, self.bn4 = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.conv5, self.bn5 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)

    def forward(self, x):
        h = self.conv1(x)
        h = torch.relu(self.bn1(h) + h)
        h = self.bn2(self.conv2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        h = self.bn4(self.conv4(h))
        return self.bn5(self.conv5(h)) + F.conv2d(h, self.conv5.weight)


def _randomise_stats(net: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d) and m.track_running_stats:
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.3, 0.3)
    return net.eval()


def test_only_exact_pairs_fold():
    net = _randomise_stats(_Residual())
    gm = fx.symbolic_trace(net)
    x = torch.rand(4, 3, 8, 8)
    with torch.no_grad():
        ref = gm(x)
    assert fold_batchnorm(gm) == 1
    kinds = {name for name, m in gm.named_modules() if isinstance(m, nn.BatchNorm2d)}
    assert kinds == {"bn1", "bn2", "bn3", "bn5"}
    with torch.no_grad():
        torch.testing.assert_close(gm(x), ref, rtol=1e-5, atol=1e-6)


def test_folded_copy_leaves_the_model_alone_and_agrees(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    torch.manual_seed(0)
    net = _randomise_stats(models.create("resnet18", width=8))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    front = _frozen_front(net, "layer2.1")
    x = torch.rand(4, 3, 32, 32)
    out, count = folded(front, x)
    # stem, four blocks of two convs up to layer2.1, and layer2.0's downsampling conv
    assert count == 1 + 4 * 2 + 1
    assert not any(isinstance(m, nn.BatchNorm2d) for m in out.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in front.modules())
    with torch.no_grad():
        ref, got = front(x), out(x)
    assert float((got - ref).norm() / ref.norm()) < 1e-5
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_switch_off_hooks_and_bad_value(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    front = _frozen_front(_hand_net(), "1")
    x = torch.rand(2, 1, 4, 4)
    assert folded(front, x)[1] == 1
    with mode("0"):
        assert folded(front, x) == (front, 0)
    # a spectral-normalised convolution recomputes its weight in a hook: left unfolded,
    # and IRIs run as before
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.utils.spectral_norm(nn.Conv2d(3, 4, 3, padding=1)), nn.BatchNorm2d(4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2),
    ).eval()  # fmt: skip
    assert folded(_frozen_front(net, "2"), torch.rand(2, 3, 8, 8))[1] == 0
    assert generate_iris(net, "2", torch.rand(2, 3, 8, 8), steps=2).iris.shape == (2, 3, 8, 8)
    monkeypatch.setenv(ENV, "sometimes")
    with pytest.raises(ValueError, match="STITCHLAB_FOLD_BN must be auto, 1 or 0"):
        folded(front, x)


def test_iris_with_and_without_folding_agree(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    torch.manual_seed(0)
    net = _randomise_stats(models.create("resnet18", width=8))
    x = torch.rand(16, 3, 32, 32)
    counts = []

    def recording(front, x):
        out = folded(front, x)
        counts.append(out[1])
        return out

    monkeypatch.setattr("stitchlab.iris.descent.folded", recording)
    with mode("0"):
        plain = generate_iris(net, "layer1.1", x, steps=40)
    fold = generate_iris(net, "layer1.1", x, steps=40)
    assert counts == [0, 1 + 2 * 2]  # stem and layer1's four convolutions when switched on
    # the same optimisation up to rounding
    assert float(fold.rel_error.median()) == pytest.approx(float(plain.rel_error.median()), rel=0.1)
    with pytest.warns(UserWarning, match="FLAGGED"):  # 5 steps: far from converged
        s = generate_iris_set(net, "layer1.1", (x, torch.zeros(16, dtype=torch.long)),
                              tmp_path, steps=5, chunk_size=16)  # fmt: skip
    assert s.meta["batchnorm_folded"] == 1 + 2 * 2
    assert any(isinstance(m, nn.BatchNorm2d) for m in net.modules())  # the model is intact


@pytest.mark.parametrize(
    ("name", "point", "shape", "count"),
    [("wave_cnn", "blocks.1", (3, 1, 4000), 2), ("mel_cnn", "blocks.1", (3, 1, 4000), 2)],
)
def test_audio_fronts_fold(name, point, shape, count, monkeypatch):
    # Conv1d -> BatchNorm1d (waveform CNN) and Conv2d -> BatchNorm2d after the log-mel
    # front end; mel_cnn's input BatchNorm follows no convolution and stays
    monkeypatch.delenv(ENV, raising=False)
    torch.manual_seed(0)
    net = _randomise_stats(models.create(name))
    for m in net.modules():
        if isinstance(m, nn.BatchNorm1d):
            with torch.no_grad():
                m.running_var.uniform_(0.5, 2.0)
    front = _frozen_front(net, point)
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    out, n = folded(front, x)
    assert n == count
    with torch.no_grad():
        ref, got = front(x), out(x)
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_stitch_training_runs_a_folded_back_and_returns_the_unfolded_model(monkeypatch):
    from stitchlab import Stitcher

    monkeypatch.delenv(ENV, raising=False)
    torch.manual_seed(0)
    front = _randomise_stats(models.create("resnet18", width=8))
    torch.manual_seed(1)
    back = _randomise_stats(models.create("resnet18", width=8))
    gen = torch.Generator().manual_seed(0)
    data = (torch.rand(64, 3, 32, 32, generator=gen), torch.randint(0, 10, (64,), generator=gen))
    fits = {}
    for m in ("0", "auto"):
        with mode(m):
            st = Stitcher(front, back, "layer1.1")
            fits[m] = (st, st.fit("slm", data, epochs=2, seed=0, lr=1e-3))
    (plain_st, plain), (st, fit) = fits["0"], fits["auto"]
    assert plain_st._training_back() is plain_st._back  # switched off: the suffix itself
    # layer2 to layer4: 6 blocks x 2 convolutions and 3 downsampling convolutions
    assert sum(isinstance(m, nn.BatchNorm2d) for m in st._back.modules()) == 15
    assert not any(isinstance(m, nn.BatchNorm2d) for m in st._training_back().modules())
    assert fit.back is st._back  # the fitted model keeps the unfolded suffix
    for k, v in fit.stitch_layer.state_dict().items():
        torch.testing.assert_close(v, plain.stitch_layer.state_dict()[k], rtol=1e-4, atol=1e-5)
    assert fit.step_losses == pytest.approx(plain.step_losses, rel=1e-4)
    # with the frozen networks in train mode (batch statistics) nothing is folded
    monkeypatch.setattr(Stitcher, "_training_back", lambda self: pytest.fail("folded"))
    Stitcher(front, back, "layer1.1").fit("slm", data, epochs=1, frozen_mode="train")
