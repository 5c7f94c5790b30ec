"""Split exactness: back(front(x)) reproduces model(x) at every point."""

import pytest
import torch
from torch import nn

import stitchlab as sl
from stitchlab import models
from stitchlab.splitting import SplitError, later_points, tap_model

PAPER_MODELS = {
    "resnet18": (dict(), 9),
    "vgg16_bn": (dict(width=32), 6),
    "vit_tiny_patch4_32": (dict(), 13),
}


def _assert_exact(model, x, points):
    with torch.no_grad():
        ref = model(x)
        for p in points:
            front, back = sl.split(model, p)
            out = back(front(x))
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5, msg=f"at {p}")


@pytest.mark.parametrize("name", list(PAPER_MODELS))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_split_exact_paper_models(name, mode):
    options, n_points = PAPER_MODELS[name]
    torch.manual_seed(0)
    model = models.create(name, **options)
    getattr(model, mode)()
    points = sl.stitch_points(model)
    assert len(points) == n_points
    x = torch.rand(4, 3, 32, 32)
    _assert_exact(model, x, points)


def test_paper_point_names():
    r = models.create("resnet18")
    assert sl.stitch_points(r) == [
        "relu",
        "layer1.0",
        "layer1.1",
        "layer2.0",
        "layer2.1",
        "layer3.0",
        "layer3.1",
        "layer4.0",
        "layer4.1",
    ]
    v = models.create("vgg16_bn", width=16)
    assert sl.stitch_points(v) == [
        "features.2",
        "features.5",
        "features.12",
        "features.22",
        "features.32",
        "features.42",
    ]
    t = models.create("vit_tiny_patch4_32", depth=12, width=48)
    assert sl.stitch_points(t) == [f"blocks.{i}" for i in range(12)] + ["pre_logits"]


def test_vit_base_points_without_building_weights():
    t = models.create("vit_base_patch16_224", width=96, heads=2)  # geometry of ViT-B/16
    # the paper's ViT-Base curve uses even blocks; a narrowed copy is a different model
    assert sl.stitch_points(t)[-1] == "pre_logits"


def test_front_runs_only_the_prefix():
    model = models.create("resnet18", width=8).eval()
    front, back = sl.split(model, "layer1.0")
    called = []
    for name, m in model.named_modules():
        if name in ("layer4.1.conv2", "fc", "conv1"):
            m.register_forward_hook(lambda *_, n=name: called.append(n))
    front(torch.rand(1, 3, 32, 32))
    assert called == ["conv1"]
    called.clear()
    back(torch.rand(1, 8, 32, 32))
    assert called == ["layer4.1.conv2", "fc"]


def test_pre_logits_is_the_head_input():
    torch.manual_seed(0)
    t = models.create("vit_tiny_patch4_32", width=48, depth=2).eval()
    x = torch.rand(3, 3, 32, 32)
    front, back = sl.split(t, "pre_logits")
    feats = front(x)
    torch.testing.assert_close(feats, t.forward_head(t.forward_features(x), pre_logits=True))
    assert isinstance(back, nn.Module) and back(feats).shape == (3, 10)


def test_taps_return_later_activations_in_one_pass():
    torch.manual_seed(0)
    model = models.create("resnet18", width=8).eval()
    x = torch.rand(2, 3, 32, 32)
    front, back = sl.split(model, "layer2.0", taps="later")
    logits, acts = back(front(x))
    assert list(acts) == ["layer2.1", "layer3.0", "layer3.1", "layer4.0", "layer4.1"]
    torch.testing.assert_close(logits, model(x))
    for p, a in acts.items():
        torch.testing.assert_close(a, sl.split(model, p)[0](x))
    assert later_points(model, "layer4.0") == ["layer4.1"]


def test_tap_model_matches_fronts():
    model = models.create("small_cnn").eval()
    x = torch.rand(2, 3, 32, 32)
    logits, acts = tap_model(model, ["blocks.1", "blocks.3"])(x)
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(acts["blocks.1"], sl.split(model, "blocks.1")[0](x))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.b = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = self.act(self.a(x))
        return self.head(self.b(h) + x)  # x crosses every cut before the add


def test_generic_module_points_and_crossing_branch():
    m = Residual()
    # only the head's input can be cut: the input skips over everything before the add
    assert sl.stitch_points(m) == ["pre_logits"]
    with pytest.raises(SplitError, match="crosses the cut"):
        sl.split(m, "act")


def test_generic_sequential_points_exact():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 30 * 30, 3))
    assert sl.stitch_points(m) == ["0", "1", "2"]
    _assert_exact(m, torch.rand(2, 3, 32, 32), ["0", "1", "2"])


class Untraceable(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
            return x * 2
        return x


def test_untraceable_sequential_falls_back_to_children():
    m = nn.Sequential(nn.Linear(3, 3), Untraceable(), nn.Linear(3, 2))
    assert sl.stitch_points(m) == ["0", "1"]
    x = torch.rand(5, 3)
    front, back = sl.split(m, "0", taps="later")
    logits, acts = back(front(x))
    torch.testing.assert_close(logits, m(x))
    assert list(acts) == ["1"]


def test_untraceable_model_says_why_and_what_to_do():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.u = Untraceable()

        def forward(self, x):
            return self.u(x)

    with pytest.raises(SplitError, match="cannot trace.*leaf_modules"):
        sl.split(Net(), "u")
    # marking the offending module as a leaf makes it splittable
    assert sl.stitch_points(Net(), leaf_modules=(Untraceable,)) == []


def test_unknown_point_lists_valid_points_and_closest():
    model = models.create("resnet18", width=8)
    with pytest.raises(SplitError) as err:
        sl.split(model, "layer2_0")
    msg = str(err.value)
    assert "Did you mean 'layer2.0'" in msg and "layer4.1" in msg


def test_shared_module_is_not_a_point():
    model = models.create("resnet18", width=8)
    with pytest.raises(SplitError, match="called 2 times"):
        sl.split(model, "layer1.0.relu")


def test_split_shares_parameters_without_copy():
    model = models.create("small_cnn")
    front, _ = sl.split(model, "blocks.1")
    assert front.get_submodule("blocks.0.0").weight is model.blocks[0][0].weight


def test_second_required_input_is_refused():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(2, 2)

        def forward(self, x, y):
            return self.l(x) + y

    with pytest.raises(SplitError, match="second input"):
        sl.split(Two(), "l")
