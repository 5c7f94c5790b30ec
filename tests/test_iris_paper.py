"""``preset="paper"`` is the released IRI loop, step for step.

The released loop (PROTOCOL section 3): from uniform noise over the box, 200 steps
``x' <- clamp(x' - 1/255 * sign(grad_x' d(f(x'), f(x))), box)`` with ``d`` the relative
distance of the representations at the point, in float32, no early stop. The plain
re-implementation below is compared with the library's at several step counts (each a
prefix of the same trajectory: the step size is constant).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stitchlab import generate_iris
from stitchlab._env import env
from stitchlab.iris import IRIRecipe, quantise


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1),
        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10),
    ).eval()  # fmt: skip


def _released_loop(front: nn.Module, x: torch.Tensor, steps: int, seed: int) -> torch.Tensor:
    """The paper's loop, written out: signed steps of 1/255 from uniform noise, clamped."""
    gen = torch.Generator().manual_seed(seed * 1_000_003)  # the library's batch noise
    x_adv = torch.rand(x.shape, generator=gen)
    with torch.no_grad():
        target = front(x)
    for _ in range(steps):
        x_adv = x_adv.detach().requires_grad_(True)
        f = front(x_adv)
        # d ||f - t|| / ||t|| / df = (f - t) / (||f - t|| ||t||), backpropagated through f
        diff = f.detach() - target
        scale = diff.flatten(1).norm(dim=1) * target.flatten(1).norm(dim=1)
        (grad,) = torch.autograd.grad(f, x_adv, grad_outputs=diff / scale.view(-1, 1, 1, 1))
        x_adv = (x_adv - grad.sign() / 255).clamp(0.0, 1.0)
    return x_adv.detach()


def test_paper_preset_is_the_released_loop():
    rec = IRIRecipe.from_kwargs(preset="paper")
    assert (rec.steps, rec.step_size, rec.final_step_size) == (200, 1 / 255, None)
    assert rec.optimizer == "sign"
    assert rec.tolerance is None and rec.relu_grad == "exact" and rec.start == "noise"
    assert rec.amp == "off" and rec.polyak is None and rec.precondition == "none"


@pytest.mark.parametrize("steps", [1, 3, 20, 200])
def test_paper_preset_matches_the_released_loop_step_for_step(steps):
    net = _net()
    x = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    front = net[:4]  # the prefix up to the point "3" (the second ReLU)
    with env("STITCHLAB_CHANNELS_LAST", "0"), env("STITCHLAB_FOLD_BN", "0"):
        res = generate_iris(net, "3", x, preset="paper", steps=steps, seed=0)
    ref = _released_loop(front, x, steps, seed=0)
    same = quantise(ref) == quantise(res.iris)
    assert bool(same.all()), f"{int((~same).sum())} pixels differ after {steps} steps"
    err = (front(ref) - front(x)).flatten(1).norm(dim=1) / front(x).flatten(1).norm(dim=1)
    assert torch.allclose(res.rel_error_float, err, atol=1e-3)
