"""Channels-last layout of convolutional fronts: chosen only where it computes the same
numbers, and IRIs agree between the two layouts."""

import pytest
import torch
from torch import nn

from stitchlab._memory_format import ENV, channels_last
from stitchlab.iris import generate_iris


def _conv_net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
    )  # fmt: skip
    with torch.no_grad():  # non-trivial BatchNorm statistics
        net[1].running_mean.uniform_(-0.2, 0.2)
        net[1].running_var.uniform_(0.5, 2.0)
    return net.eval()


class _Viewing(nn.Module):
    """A net whose code needs NCHW order: ``.view`` of a conv activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        return self.head(self.fc(h.view(h.shape[0], -1)))


def test_conv_net_runs_channels_last_with_the_same_outputs(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    net, x = _conv_net(), torch.rand(6, 3, 16, 16)
    with torch.no_grad():
        reference = net(x)
    assert channels_last(net, x)
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not net[0].weight.is_contiguous()
    with torch.no_grad():
        out = net(x.contiguous(memory_format=torch.channels_last))
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)


def test_layout_dependent_code_and_other_inputs_stay_contiguous(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    viewing = _Viewing().eval()
    assert not channels_last(viewing, torch.rand(2, 3, 8, 8))  # .view fails channels-last
    assert viewing.conv.weight.is_contiguous()  # put back
    assert not channels_last(_conv_net(), torch.rand(2, 3, 16))  # not 4-d
    assert not channels_last(nn.Sequential(nn.Flatten(), nn.Linear(12, 2)), torch.rand(2, 3, 2, 2))
    # a 5-d parameter beside the convolutions (timm's Swin holds one) is left as it is
    with5d = _conv_net()
    with5d.register_parameter("table", nn.Parameter(torch.ones(2, 1, 1, 1, 1)))
    assert channels_last(with5d, torch.rand(2, 3, 16, 16))
    assert with5d.table.is_contiguous() and with5d[0].weight.is_contiguous(
        memory_format=torch.channels_last
    )
    monkeypatch.setenv(ENV, "0")
    net = _conv_net()
    assert not channels_last(net, torch.rand(2, 3, 16, 16))
    assert net[0].weight.is_contiguous()
    monkeypatch.setenv(ENV, "sometimes")
    with pytest.raises(ValueError, match="STITCHLAB_CHANNELS_LAST must be auto, 1 or 0"):
        channels_last(_conv_net(), torch.rand(2, 3, 16, 16))


def test_iris_agree_between_layouts(monkeypatch):
    net, x = _conv_net(), torch.rand(16, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    results = {}
    for precondition in ("none", "first_layer"):
        for mode in ("0", "auto"):
            monkeypatch.setenv(ENV, mode)
            results[precondition, mode] = generate_iris(
                net, "3", x, steps=20, seed=3, tolerance=None, precondition=precondition
            )
    a, b = results["none", "0"], results["none", "auto"]
    assert b.iris.is_contiguous()
    # the same optimisation to rounding: errors agree, IRIs within one uint8 level
    torch.testing.assert_close(b.rel_error_float, a.rel_error_float, rtol=1e-3, atol=1e-4)
    assert float((a.iris - b.iris).abs().max()) <= 1 / 255 + 1e-6
    assert float((a.iris != b.iris).float().mean()) < 0.01
    # whitened Adam (the default) spreads a pixel's rounding difference at the box over the
    # image (S is not local), so a few pixels move by more than a level (measured: 0.8%
    # differ, 0.03% by more than one level, at most 8); the errors still agree
    a, b = results["first_layer", "0"], results["first_layer", "auto"]
    torch.testing.assert_close(b.rel_error_float, a.rel_error_float, rtol=1e-3, atol=1e-4)
    differ = (a.iris - b.iris).abs()
    assert float((differ > 0).float().mean()) < 0.02
    assert float((differ > 1.5 / 255).float().mean()) < 0.001
    # a model that cannot run channels-last gives exactly the contiguous result
    viewing = _Viewing().eval()
    xv = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    monkeypatch.setenv(ENV, "auto")
    auto = generate_iris(viewing, "fc", xv, steps=5, seed=0)
    monkeypatch.setenv(ENV, "0")
    plain = generate_iris(viewing, "fc", xv, steps=5, seed=0)
    assert torch.equal(auto.iris, plain.iris)


def test_stitcher_runs_channels_last_with_the_same_training(monkeypatch):
    import stitchlab as sl
    from stitchlab import models

    torch.manual_seed(0)
    front = models.create("small_cnn", width=8).eval()
    torch.manual_seed(1)
    back = models.create("small_cnn", width=8).eval()
    g = torch.Generator().manual_seed(0)
    data = (torch.rand(48, 3, 32, 32, generator=g), torch.randint(0, 10, (48,), generator=g))
    fits = {}
    for mode in ("0", "auto"):
        monkeypatch.setenv(ENV, mode)
        st = sl.Stitcher(front, back, "blocks.1")
        model = st.fit("slm", data, epochs=2, batch_size=16, lr=1e-2)
        assert st.channels_last == (mode == "auto")
        fits[mode] = (model.history, st.evaluate(model, data)["agreement"])
    # the caller's models are untouched; the training is the same to rounding
    assert all(p.is_contiguous() for p in front.parameters())
    assert fits["auto"][0] == pytest.approx(fits["0"][0], rel=1e-3, abs=1e-7)
    assert fits["auto"][1] == pytest.approx(fits["0"][1], abs=1e-3)
