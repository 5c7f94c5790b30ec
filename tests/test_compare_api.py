"""sl.compare: two nn.Modules (or model specs) on tensors (or a path), the results table in
memory, nothing written unless asked; the numbers of `stitchlab compare` on the same case."""

from __future__ import annotations

import tempfile

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import stitchlab as sl
from stitchlab import models
from stitchlab.data import shapes

pytestmark = pytest.mark.filterwarnings("ignore:IRIs")  # tiny IRI budgets are flagged

# 2 stitch seeds and 1-2 null fronts at blocks.3 of small_cnn width 4, 12x12 shapes
TINY = dict(points=["blocks.3"], quick=True, seeds=2, n_stitch=48, n_test=16, bootstrap=50,
            progress=False)  # fmt: skip


@pytest.fixture(scope="module")
def xy():
    return shapes(80, seed=0, size=12, num_classes=4)


def _trained(seed: int, xy) -> nn.Module:
    x, y = xy
    torch.manual_seed(seed)
    m = models.create("small_cnn", num_classes=4, width=4)
    opt = torch.optim.Adam(m.parameters(), 0.02)
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return m.eval()


@pytest.fixture(scope="module")
def pair(xy):
    return _trained(0, xy), _trained(1, xy)


def test_a_model_with_itself_scores_its_ceiling_and_a_random_front_its_null(
    pair, xy, tmp_path, monkeypatch
):
    """Self: the real runs are the ceiling's runs (same seeds), so score == ceiling and
    normalised == 1 exactly. A random front: near the null (normalised within 0.3 of 0)."""
    m, _ = pair
    (tmp_path / "cwd").mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    weights = {k: v.clone() for k, v in m.state_dict().items()}
    m.train()
    df = sl.compare(m, m, xy, protocols=["standard"], null_seeds=2, **TINY)
    assert isinstance(df, pd.DataFrame) and len(df) == 1
    row = df.iloc[0]
    assert row["agreement"] == row["ceiling_agreement"] > 99
    assert row["normalised"] == 1  # the interval draws the seeds of each independently
    assert row["normalised_ci_low"] == pytest.approx(1, abs=1e-6) == row["normalised_ci_high"]
    assert row["null_agreement"] < 60 and not row["budget_limited"]
    # the caller's module is untouched (mode, weights) and nothing is left behind
    assert m.training
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in weights.items())
    assert list((tmp_path / "cwd").iterdir()) == list((tmp_path / "tmp").iterdir()) == []
    m.eval()
    torch.manual_seed(7)
    rnd = models.create("small_cnn", num_classes=4, width=4)
    r = sl.compare(rnd, m, xy, protocols=["standard"], null_seeds=2, **TINY).iloc[0]
    assert abs(r["normalised"]) < 0.3  # measured -0.12 (score 34.8, null 41.9)
    assert r["ceiling_agreement"] == row["ceiling_agreement"]
    assert r["agreement"] < r["null_agreement"] + 5


COLUMNS = ["agreement", "agreement_ci_low", "null_agreement", "ceiling_agreement",
           "normalised", "normalised_ci_low"]  # fmt: skip


def test_modules_on_tensors_give_the_numbers_of_compare_on_files(pair, xy, tmp_path):
    """The in-memory path (modules, tensors) reads and keys exactly as checkpoints and a
    .npz do: compare on the files, with the store the modules' call filled, computes nothing
    and gives the same table; out= writes results.csv and results.parquet (the same table)
    and a second call on the same store computes nothing."""
    front, back = pair
    x, y = xy
    df = sl.compare(front, back, xy, null_seeds=1, iri_steps=4, out=tmp_path / "o", **TINY)
    assert sorted(df.protocol) == ["iris", "standard"]
    assert df[COLUMNS].notna().all().all()
    assert df.loc[df.protocol == "standard", "hard_agreement"].item() == 100
    assert len(pd.read_csv(tmp_path / "o" / "results.csv")) == len(df)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "o" / "results.parquet"), df)
    stored = sorted((tmp_path / "o" / "store" / "compare").glob("*.json"))
    assert len(stored) == 10  # 2 protocols x (2 seeds + 1 null + 2 ceiling runs)
    mtimes = [p.stat().st_mtime_ns for p in stored]
    again = sl.compare(front, back, xy, null_seeds=1, iri_steps=4,
                       store=tmp_path / "o" / "store", **TINY)  # fmt: skip
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy())
    paths = [str(models.save(m, tmp_path / f"{i}.safetensors")) for i, m in enumerate(pair)]
    files = sl.compare(*paths, tmp_path / "d.npz", null_seeds=1, iri_steps=4,
                       store=tmp_path / "o" / "store", **TINY)  # fmt: skip
    assert sorted((tmp_path / "o" / "store" / "compare").glob("*.json")) == stored
    assert [p.stat().st_mtime_ns for p in stored] == mtimes  # nothing computed again
    pd.testing.assert_frame_equal(again.drop(columns="seconds"), df.drop(columns="seconds"))
    pd.testing.assert_frame_equal(files.drop(columns="seconds"), df.drop(columns="seconds"))


def test_specs_and_paths_as_the_command_line_takes_them(pair, xy, tmp_path):
    front, _ = pair
    x, y = xy
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy())
    path = models.save(front, tmp_path / "m.safetensors")
    by_spec = sl.compare(str(path), str(path), tmp_path / "d.npz", protocols=["standard"],
                         null_seeds=0, epochs=0, **TINY)  # fmt: skip
    by_module = sl.compare(front, front, {"x": x, "y": y}, protocols=["standard"],
                           null_seeds=0, epochs=0, **TINY)  # fmt: skip
    cols = ["agreement", "ceiling_agreement", "hard_agreement", "accuracy"]
    assert by_spec[cols].values.tolist() == by_module[cols].values.tolist()
    assert by_spec["agreement"].item() > 99 and np.isnan(by_spec["normalised"].item())


class _Scaled(nn.Module):
    """A model with a bare parameter: no reset_parameters() can make its null."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.scale = net, nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.net(x) * self.scale


def test_clear_errors(pair, xy):
    front, back = pair
    with pytest.raises(ValueError, match=r"scale belong to modules without reset_parameters"):
        sl.compare(_Scaled(front), back, xy, **TINY)
    with pytest.raises(TypeError, match="data must be a path"):
        sl.compare(front, back, [1, 2, 3], **TINY)
    with pytest.raises(TypeError, match="front must be an nn.Module or a model spec"):
        sl.compare(3, back, xy, **TINY)
    with pytest.raises(ValueError, match="objectives must be"):
        sl.compare(front, back, xy, objectives=["xyz"], **TINY)
