"""Layouts followed through movedim, negative permutes, transpose, matmul / einsum /
F.linear with a weight, and found by probing where the graph cannot be followed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import stitchlab as sl
from stitchlab.splitting import TracedModel


class Point(nn.Module):
    """An identity whose output names the point."""

    def forward(self, x):  # noqa: D102
        return x


class Mixer(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.w = nn.Parameter(torch.randn(8, 6) / 3)
        self.lin = nn.Linear(8, 6)
        self.p = Point()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):  # noqa: D102
        h, k = self.conv(x), self.kind
        if k == "movedim":
            h = h.movedim(1, -1) @ self.w
        elif k == "permute_negative":
            h = h.permute(0, -2, -1, -3) @ self.w
        elif k == "transpose":
            h = torch.matmul(h.transpose(1, -1), self.w)
        elif k == "einsum":
            h = torch.einsum("bchw,cd->bhwd", h, self.w)
        elif k == "linear":
            h = F.linear(h.movedim(1, 3), self.lin.weight, self.lin.bias)
        elif k == "weight_left":  # (6, 8) @ (b, 8, L): channels on axis 1
            h = self.w.t() @ h.flatten(2)
            return self.fc(self.p(h).mean(2))
        return self.fc(self.p(h).mean((1, 2)))


@pytest.mark.parametrize("kind, layout", [
    ("movedim", "NHWC"), ("permute_negative", "NHWC"), ("transpose", "NHWC"),
    ("einsum", "NHWC"), ("linear", "NHWC"), ("weight_left", "NCL"),
])  # fmt: skip
def test_layouts_followed_through_moves_and_weights(kind, layout):
    torch.manual_seed(0)
    model = Mixer(kind).eval()
    x, y = torch.rand(12, 3, 6, 5), torch.randint(0, 3, (12,))
    fmt = TracedModel(model).formats(x[:3], ["p"])["p"]
    assert fmt.spec is not None and fmt.spec.layout == layout and fmt.spec.channels == 6
    s = sl.stitch(model, model, "p", (x, y), epochs=0)  # self-stitch: exact identity
    assert sl.evaluate(s, (x, y), model)["agreement"] == pytest.approx(100.0, abs=1e-3)


class AddChannel(nn.Module):
    """A leaf the graph cannot see into: it appends a channel (the shape changes)."""

    def forward(self, x):  # noqa: D102
        return torch.cat([x, x[:, :1]], 1)


class Probed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.extra = AddChannel()
        self.conv2 = nn.Conv2d(5, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):  # noqa: D102
        return self.fc(self.conv2(torch.relu(self.extra(self.conv(x)))).mean((2, 3)))


def test_a_layout_the_graph_cannot_follow_is_found_by_probing():
    torch.manual_seed(0)
    model = Probed().eval()
    tm = TracedModel(model, leaf_modules=(AddChannel,))
    x = torch.rand(3, 3, 6, 6)
    fmt = tm.formats(x, ["extra"])["extra"]
    # batch: only sample 0 changes when only input 0 does; channels: conv2 reads axis 1
    assert fmt.spec is not None and fmt.spec.layout == "NCHW" and fmt.spec.channels == 5
