"""Property test of splitting: generated modules (random depth, residual sums, in-place
method calls with and without used results, reshapes, permutes, movedim, tuple and dict
outputs; Conv1d/Conv2d/Linear/LayerNorm/BatchNorm) are cut at every offered point, and
``back(front(x))`` (and every tap) is compared with the whole model on a fresh batch."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from stitchlab.splitting import SplitError, TracedModel

N_CASES = 60  # models in the default suite (the slow test adds 600)


class Op(nn.Module):
    """One generated step over an activation ``h``; ``kind`` fixes what forward does (a
    Python branch frozen by the trace)."""

    def __init__(self, kind: str, rank: int, c: int, rng: random.Random) -> None:
        super().__init__()
        self.kind = kind
        self.rank = rank
        conv = {3: nn.Conv1d, 4: nn.Conv2d}.get(rank)
        bn = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[rank]
        if kind in ("conv", "residual") and conv is not None:
            self.layer = conv(c, c, 3, padding=1)
        elif kind in ("conv", "residual", "linear_last"):
            self.layer = nn.Linear(c, c)
        elif kind == "bn":
            self.layer = bn(c)
        elif kind == "layernorm_last":
            self.layer = nn.LayerNorm(c)
        self.scale = rng.choice([0.5, 2.0, -1.0])

    def forward(self, h):  # noqa: D102
        k = self.kind
        if k in ("conv", "bn"):
            return self.layer(h)
        if k == "residual":
            return h + torch.tanh(self.layer(h))
        if k == "inplace_unused":  # the results are not used: h itself changes
            h.mul_(self.scale).relu_()
            return h
        if k == "inplace_used":
            return h.add_(self.scale).clamp_(min=-1.0)
        if k in ("linear_last", "layernorm_last"):  # channels to the last axis and back
            if self.rank == 2:
                return self.layer(h)
            return self.layer(h.movedim(1, -1)).movedim(-1, 1)
        if k == "permute":  # swap the spatial axes (and back for half of them)
            if self.rank == 4:
                return h.permute(0, 1, -1, -2)
            return h.transpose(-1, -2).transpose(-1, -2) if self.rank == 3 else h * 1.0
        if k == "reshape":
            if self.rank == 4:
                n, c, a, b = h.shape
                return h.reshape(n, c, a * b).reshape(n, c, a, b)
            return h.reshape(h.shape) + 0.0
        raise AssertionError(k)  # pragma: no cover


KINDS = ["conv", "bn", "residual", "inplace_unused", "inplace_used", "linear_last",
         "layernorm_last", "permute", "reshape"]  # fmt: skip


class Generated(nn.Module):
    def __init__(self, rank: int, c: int, kinds: list[str], out: str, rng) -> None:
        super().__init__()
        first = {2: nn.Linear, 3: nn.Conv1d, 4: nn.Conv2d}[rank]
        self.stem = first(3, c) if rank == 2 else first(3, c, 3, padding=1)
        self.ops = nn.ModuleList(Op(k, rank, c, rng) for k in kinds)
        self.head = nn.Linear(c, 5)
        self.rank = rank
        self.out = out
        self.inplace_stem = rng.random() < 0.3

    def forward(self, x):  # noqa: D102
        h = self.stem(x)
        if self.inplace_stem:
            h.relu_()  # in place on the stem's output, result unused
        for op in self.ops:
            h = op(h)
        feats = h if self.rank == 2 else h.mean(tuple(range(2, self.rank)))
        logits = self.head(feats)
        if self.out == "tuple":
            return feats, logits
        if self.out == "dict":
            return {"features": feats, "logits": logits}
        return logits


def _case(seed: int):
    rng = random.Random(seed)
    rank = rng.choice([2, 3, 4])
    c = rng.choice([3, 4, 6])
    kinds = [rng.choice(KINDS) for _ in range(rng.randint(1, 6))]
    out = rng.choice(["tensor", "tuple", "dict"])
    torch.manual_seed(seed)
    model = Generated(rank, c, kinds, out, rng)
    model.train(rng.random() < 0.3)
    shape = {2: (3,), 3: (3, 11), 4: (3, 5, 7)}[rank]
    gen = torch.Generator().manual_seed(seed)
    example = torch.randn(4, *shape, generator=gen)
    fresh = torch.randn(5, *shape, generator=gen)
    return model, out, example, fresh


def _logits(model, out, x):
    y = model(x)
    return y[1] if out == "tuple" else y["logits"] if out == "dict" else y


def _check_models(seeds) -> int:
    """Cut every generated model at every offered point; the number of cuts checked."""
    checked = 0
    for seed in seeds:
        model, out, example, fresh = _case(seed)
        output = 1 if out == "tuple" else None
        before = {k: v.clone() for k, v in model.state_dict().items()}
        try:
            tm = TracedModel(model, output=output, example=example)
        except SplitError as exc:  # pragma: no cover - a generated model must trace
            raise AssertionError(f"seed {seed}: {exc}") from exc
        points = tm.points("all")
        assert points, f"seed {seed}: no points"
        with torch.no_grad():
            state = {k: v.clone() for k, v in model.state_dict().items()}
            ref = _logits(model, out, fresh.clone())
            model.load_state_dict(state)  # train-mode BatchNorm: same statistics each run
            tap_logits, values = tm.tap(points)(fresh.clone())  # every point in one pass
            model.load_state_dict(state)
            assert torch.allclose(tap_logits, ref, atol=1e-6), f"seed {seed}: tapped model"
            for i, p in enumerate(points):
                later = points[i + 1 :]
                front, back = tm.split(p, taps=later)
                a = front(fresh.clone())
                assert torch.allclose(a, values[p], atol=1e-6), f"seed {seed}: front {p}"
                logits, acts = back(a) if later else (back(a), {})
                model.load_state_dict(state)
                assert torch.allclose(logits, ref, atol=1e-6), (
                    f"seed {seed} at {p}: {(logits - ref).abs().max()}")
                for q, v in acts.items():
                    assert torch.allclose(v, values[q], atol=1e-6), f"seed {seed}: {q} after {p}"
                checked += 1
        after = model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before), f"seed {seed}"
    return checked


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("block", range(4))
def test_generated_models_split_exactly_at_every_point(block, one_thread):
    # 60 models, about 5 points each: some 300 cuts in the default suite
    assert _check_models(range(block, N_CASES, 4)) > 0


@pytest.mark.slow
def test_many_more_generated_models_split_exactly(one_thread):
    assert _check_models(range(N_CASES, N_CASES + 600)) > 0
