"""``stft_window``: Adam's moments and steps in short-time Fourier coordinates of 1-D signals
(docs/validation/audio.md, "IRIs in STFT coordinates")."""

import pytest
import torch
from torch import nn

from stitchlab.iris import IRIRecipe, generate_iris
from stitchlab.iris.coordinates import _TimeFrequency


@pytest.mark.parametrize("n, length", [(4, 4), (16, 100), (16, 103), (256, 8000), (256, 8001)])
def test_stft_coordinates_are_a_tight_frame(n, length):
    """Synthesis inverts analysis exactly, and analysis keeps the energy (a tight frame of
    bound 1): with the one-sided spectrum, the bins between 0 and n / 2 count twice."""
    x = torch.randn(3, 2, length, generator=torch.Generator().manual_seed(n + length))
    tf = _TimeFrequency(n, length, x.device)
    z = tf.analysis(x)
    assert z.shape == (3, 2, -(-length // (n // 2)) + 1, n // 2 + 1)
    torch.testing.assert_close(tf.synthesis(z), x, atol=1e-5, rtol=1e-5)
    weight = torch.full((n // 2 + 1,), 2.0)
    weight[0] = weight[-1] = 1.0
    energy = (tf.power(z) * weight).sum(dim=(-2, -1))
    torch.testing.assert_close(energy, x.square().sum(-1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(tf.power(z), z.abs().square())
    s = torch.rand(z.shape, generator=torch.Generator().manual_seed(0)) + 0.5
    torch.testing.assert_close(tf.scale_(z.clone(), s), z / s)


def _linear_front() -> nn.Sequential:
    """A front that is the identity on (N, 1, T) signals at point "0"."""
    conv = nn.Conv1d(1, 1, 1, bias=False)
    with torch.no_grad():
        conv.weight.fill_(1.0)
    return nn.Sequential(conv, nn.Flatten(), nn.Linear(64, 2)).eval()


def test_first_stft_step_is_the_whitened_gradient():
    """Adam's first step normalises each coordinate to unit size; in STFT coordinates that
    is each time-frequency coefficient of the gradient at unit magnitude, its phase kept:
    x1 = x0 - a S(A g / |A g|). For the identity front g is along x0 - source (the start is
    another source of the batch), so the step is known in closed form."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 1, 64, generator=gen) * 0.1
    a = 0.01
    kw = dict(steps=1, step_size=a, final_step_size=None, tolerance=None, start="image",
              box=(-5.0, 5.0), precision="float32", relu_grad="exact")  # fmt: skip
    got = generate_iris(_linear_front(), "0", x, stft_window=16, **kw).iris
    x0 = x.roll(1, 0)  # start "image": another source of the batch
    tf = _TimeFrequency(16, 64, x.device)
    z = tf.analysis(x0 - x)
    expected = x0 - a * tf.synthesis(z / z.abs())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    plain = generate_iris(_linear_front(), "0", x, **kw).iris  # samples' Adam: sign steps
    torch.testing.assert_close(plain, x0 - a * (x0 - x).sign(), atol=1e-5, rtol=1e-4)


def test_stft_iris_do_not_depend_on_the_batch_and_stay_in_the_box():
    """Each sample has its own coordinates, moments and smooth-gradient widths: with a
    start that is the same for every sample (the box centre, noise of sd 1e-9), a sample's
    IRI is the same alone as in its batch; every IRI is in the box."""
    front = nn.Sequential(nn.Conv1d(1, 4, 9, padding=4), nn.ReLU(), nn.Conv1d(4, 4, 9, padding=4),
                          nn.ReLU(), nn.Flatten(), nn.Linear(4 * 200, 2)).eval()  # fmt: skip
    x = torch.randn(3, 1, 200, generator=torch.Generator().manual_seed(5)).mul_(0.5).clamp_(-1, 1)
    kw = dict(preset="audio", steps=40, step_size=0.03, final_step_size=0.003, stft_window=32,
              relu_grad="smooth", start_scale=1e-9, precision="float32")  # fmt: skip
    both = generate_iris(front, "3", x, **kw)
    alone = generate_iris(front, "3", x[1:2], **kw)
    torch.testing.assert_close(alone.iris, both.iris[1:2], atol=1e-5, rtol=1e-4)
    assert float(both.iris.min()) >= -1.0 and float(both.iris.max()) <= 1.0
    start = generate_iris(front, "3", x, **{**kw, "steps": 0})
    assert float(both.rel_error.median()) < 0.5 * float(start.rel_error.median())


def test_stft_window_refused_where_it_cannot_apply():
    front = _linear_front()
    with pytest.raises(ValueError, match=r"needs 1-D signals \(N, C, T\) with T >= 128"):
        generate_iris(front, "0", torch.zeros(2, 1, 64), steps=1, stft_window=128)
    img = nn.Sequential(nn.Conv2d(3, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2)).eval()
    with pytest.raises(ValueError, match="needs 1-D signals"):
        generate_iris(img, "1", torch.rand(2, 3, 6, 6), steps=1, stft_window=4)
    with pytest.raises(ValueError, match="option of Adam"):
        IRIRecipe.from_kwargs(optimizer="sign", stft_window=256)
    for bad in (3, -2, 2):
        with pytest.raises(ValueError, match="even number of samples >= 4"):
            IRIRecipe.from_kwargs(stft_window=bad)
    assert IRIRecipe().key_dict()["stft_window"] == 0
    r = IRIRecipe.from_kwargs(preset="audio", stft_window=256)
    assert r.key_dict()["stft_window"] == 256
    assert "STFT coordinates (sqrt-Hann window of 256)" in r.describe()
