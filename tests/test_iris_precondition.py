"""precondition="first_layer": Adam in coordinates whitened by the front's first
convolution. Hand-computed whitening of a 1x1 convolution, the Gram identity on a 3x3
one, the convolutions it applies to (and the fronts it leaves in pixels, bit for bit), the
recipe's resolution of "auto", and the gain on a front whose first layer mixes colours
badly."""

import math

import pytest
import torch
from torch import nn

from stitchlab import generate_iris, generate_iris_set
from stitchlab.iris import IRIRecipe
from stitchlab.iris.coordinates import FIRST_LAYER_DAMPING, _FirstLayer, input_convolution
from stitchlab.iris.front import _recipe_front


def _front(model: nn.Module, point: str = "1") -> nn.Module:
    return _recipe_front(model.eval(), point, (), None, IRIRecipe())


def _conv(weight: torch.Tensor, **kw) -> nn.Conv2d:
    conv = nn.Conv2d(weight.shape[1], weight.shape[0], weight.shape[-1], bias=False, **kw)
    with torch.no_grad():
        conv.weight.copy_(weight)
    return conv


def test_whitening_of_a_1x1_convolution_by_hand():
    # W = diag(1, 2, 4) on the colours: Gram eigenvalues 1, 4, 16 at every frequency, median
    # 4, damping 0.4; S = (e + 0.4)^(-1/2) scaled to median 1: sqrt(4.4 / (e + 0.4))
    weight = torch.diag(torch.tensor([1.0, 2.0, 4.0])).view(3, 3, 1, 1)
    model = nn.Sequential(_conv(weight), nn.ReLU(), nn.Flatten())
    x = torch.rand(2, 3, 6, 6)
    coords = _FirstLayer.of(IRIRecipe(), x, _front(model))
    lam = FIRST_LAYER_DAMPING * 4.0
    expected = torch.tensor([math.sqrt((4 + lam) / (e + lam)) for e in (1.0, 4.0, 16.0)])
    assert FIRST_LAYER_DAMPING == 0.1
    assert expected.tolist() == pytest.approx([1.7728, 1.0, 0.5180], abs=1e-4)
    t = torch.randn(2, 3, 6, 6)
    assert torch.allclose(coords.analysis(t), t * expected.view(1, 3, 1, 1), atol=1e-5)
    # S is symmetric: x = S z, grad_z = S grad_x
    assert torch.equal(coords.synthesis(t), coords.analysis(t))


def test_s_squared_inverts_the_damped_gram_of_a_3x3_convolution():
    # on periodic images: S S (W^T W + lam) x = c x for every x, W^T W by autograd
    torch.manual_seed(0)
    weight = torch.randn(8, 3, 3, 3)
    model = nn.Sequential(
        _conv(weight, padding=1, padding_mode="circular"), nn.ReLU(), nn.Flatten()
    )
    x = torch.rand(2, 3, 8, 8)
    coords = _FirstLayer.of(IRIRecipe(), x, _front(model))
    conv = model[0]

    def gram(v):
        v = v.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(conv(v), v, grad_outputs=conv(v).detach())
        return g

    probe = torch.randn(2, 3, 8, 8)
    # the damping and scale from the operator's own spectrum (eigenvalues of W^T W on 8x8)
    spectrum = torch.linalg.eigvalsh(
        torch.stack([gram(e.view(1, 3, 8, 8))[0].flatten() for e in torch.eye(192)])
    )
    lam = FIRST_LAYER_DAMPING * spectrum.median()
    c = 1 / (spectrum + lam).rsqrt().median() ** 2  # S's scale: median eigenvalue 1
    out = coords.analysis(coords.analysis(gram(probe) + lam * probe))
    assert torch.allclose(out, c * probe, rtol=1e-3, atol=1e-3 * float(c))


def test_whitening_output_and_second_moment_are_contiguous_in_every_layout():
    # the whitened coordinates and Adam's second moment in them share one layout
    # (contiguous), whatever the iterate's (channels-last on the CPU): elementwise
    # operations on mixed layouts take a slow path; the numbers do not depend on it
    torch.manual_seed(0)
    model = nn.Sequential(_conv(torch.randn(8, 3, 3, 3), padding=1), nn.ReLU(), nn.Flatten())
    x = torch.rand(4, 3, 8, 8)
    coords = _FirstLayer.of(IRIRecipe(), x, _front(model))
    t = torch.randn(4, 3, 8, 8)
    last = t.contiguous(memory_format=torch.channels_last)
    assert torch.equal(coords.analysis(last), coords.analysis(t))
    assert coords.analysis(last).is_contiguous()
    assert coords.zeros_like(last).is_contiguous() and not coords.zeros_like(last).any()


def test_input_convolution_includes_the_batchnorm_scale():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.running_var.copy_(torch.tensor([1.0, 4.0, 0.25, 9.0]))
        bn.weight.copy_(torch.tensor([1.0, 2.0, 3.0, -1.0]))
    model = nn.Sequential(conv, bn, nn.ReLU(), nn.Flatten())
    scale = (
        torch.tensor([1.0, 2.0, 3.0, -1.0]) / (torch.tensor([1.0, 4.0, 0.25, 9.0]) + 1e-5).sqrt()
    )
    got = input_convolution(_front(model, "2"))
    assert torch.allclose(got, conv.weight * scale.view(-1, 1, 1, 1), atol=1e-6)


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x) + x)


@pytest.mark.parametrize(
    "first",
    [
        nn.Conv2d(3, 8, 3, stride=2, padding=1),  # strided stem
        nn.Conv2d(3, 6, 3, padding=1, groups=3),  # grouped
        nn.Conv2d(3, 8, 3, padding=2, dilation=2),  # dilated
        _Residual(),  # the input also skips the convolution
    ],
    ids=["strided", "grouped", "dilated", "input-used-twice"],
)
def test_other_first_layers_stay_in_pixels_bit_for_bit(first, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(first, nn.ReLU(), nn.Flatten()).eval()
    x = torch.rand(4, 3, 8, 8)
    front = _front(model)
    assert _FirstLayer.of(IRIRecipe(), x, front) is None
    assert IRIRecipe().for_front(front, x).precondition == "none"
    a = generate_iris(model, "1", x, steps=20)
    b = generate_iris(model, "1", x, steps=20, precondition="none")
    assert torch.equal(a.iris, b.iris) and torch.equal(a.rel_error, b.rel_error)
    # the default's stored set is the pixel recipe's: same key, one folder
    data = (x, torch.zeros(4, dtype=torch.long))
    auto = generate_iris_set(model, "1", data, tmp_path, steps=20)
    none = generate_iris_set(model, "1", data, tmp_path, steps=20, precondition="none")
    assert auto.root == none.root and len(list(tmp_path.iterdir())) == 1
    with pytest.raises(ValueError, match="precondition='first_layer' needs a front whose"):
        generate_iris(model, "1", x, steps=2, precondition="first_layer")


def test_auto_resolves_to_first_layer_only_for_adam_in_pixels():
    assert IRIRecipe().precondition == "auto"  # resolved against the front when IRIs are made
    assert IRIRecipe.from_kwargs().key_dict()["precondition"] == "auto"
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten())
    x = torch.rand(2, 3, 8, 8)
    resolved = IRIRecipe().for_front(_front(conv), x)
    assert resolved.precondition == "first_layer"
    assert resolved.key_dict()["precondition"] == "first_layer"
    for kw in ({"optimizer": "sign"}, {"stft_window": 256}, {"preset": "paper"},
               {"preset": "audio"}):  # fmt: skip
        recipe = IRIRecipe.from_kwargs(**kw)
        assert recipe.precondition == "none", kw
        assert recipe.key_dict()["precondition"] == "none"
    # the default in pixels differs from the whitened one in that field only
    pixels = IRIRecipe(precondition="none").for_front(_front(conv), x).as_dict()
    whitened = IRIRecipe().for_front(_front(conv), x).as_dict()
    assert {k for k, v in whitened.items() if pixels[k] != v} == {"precondition"}
    with pytest.raises(ValueError, match="add precondition='none' to use optimizer='sign'"):
        IRIRecipe.from_kwargs(optimizer="sign", precondition="first_layer")
    with pytest.raises((TypeError, ValueError), match="precondition must be 'auto'"):
        IRIRecipe.from_kwargs(precondition="fourier")


@pytest.mark.parametrize("gain, ratio", [(0.1, 0.5), (0.02, 0.75)])
def test_whitened_adam_converges_where_the_first_layer_mixes_colours_badly(gain, ratio):
    # a 1x1 convolution with gains 1, `gain`, 1 along rotated colour axes: Adam's per-pixel
    # scaling cannot undo a rotated weak direction; the whitened coordinates can. (With a
    # damping of 0.01 instead of 0.1 the 0.02 case diverges: median 0.19 against 0.0065.)
    torch.manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(3, 3))
    weight = (q @ torch.diag(torch.tensor([1.0, gain, 1.0])) @ q.T).view(3, 3, 1, 1)
    model = nn.Sequential(_conv(weight), nn.Flatten()).eval()
    x = torch.rand(8, 3, 8, 8)
    kw = {"steps": 60, "tolerance": None, "precision": "float32"}
    whitened = generate_iris(model, "0", x, **kw).rel_error.median()
    plain = generate_iris(model, "0", x, precondition="none", **kw).rel_error.median()
    assert whitened < ratio * plain
