"""The shared run layer: plans with hand-computed estimates, the one table writer."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from stitchlab.runs import Plan, Stage, duration, read_table, seconds_per_image, write_table
from stitchlab.runs.plan import iri_seconds, stitch_seconds, training_seconds


def test_plan_counts_and_estimate_by_hand():
    plan = Plan("plan of x", (Stage("models", 3, 1, 20.0), Stage("runs", 10, 10, None),
                              Stage("sets", 4, 0, 100.0, "200 steps")), ("line",))  # fmt: skip
    assert plan.todo == 2 + 0 + 4
    assert plan.seconds == 120.0  # a finished stage needs no estimate
    assert plan.estimate().startswith("about 2 min (")
    text = plan.text().splitlines()
    assert text[0] == "plan of x" and text[1] == "line"
    assert text[2] == "  models     3 jobs, 1 stored, about 20 s"
    assert text[3] == "  runs      10 jobs, 10 stored"
    assert text[4] == "  sets       4 jobs, 0 stored, about 100 s (200 steps)"
    assert plan.as_dict() == {
        "stages": [{"name": "models", "jobs": 3, "stored": 1, "seconds": 20.0, "at_most": False},
                   {"name": "runs", "jobs": 10, "stored": 10, "seconds": None, "at_most": False},
                   {"name": "sets", "jobs": 4, "stored": 0, "seconds": 100.0, "at_most": False}],
        "todo": 6, "estimated_seconds": 120.0}  # fmt: skip
    # a stage with work left and no estimate: the plan says so rather than undercount
    assert Plan("p", (Stage("a", 2, 0, None), Stage("b", 1, 0, 5.0))).estimate() == "not available"
    assert Plan("p", (Stage("a", 2, 2),)).estimate() == "nothing to compute: every job is stored"
    # an upper bound (IRI sets: samples stop early) makes the whole estimate one
    bound = Plan("p", (Stage("sets", 2, 0, 60.0, at_most=True), Stage("runs", 1, 0, 30.0)))
    assert bound.text().splitlines()[1] == "  sets     2 jobs, 0 stored, at most about 60 s"
    assert bound.estimate().startswith("at most about 90 s (")
    with pytest.raises(ValueError, match="3 stored of 2 jobs"):
        Stage("a", 2, 3)


def test_durations_and_job_costs_by_hand():
    assert [duration(s) for s in (5, 119.4, 120, 5400, 7200)] == [
        "5 s", "119 s", "2 min", "90 min", "2.0 h"]  # fmt: skip
    assert training_seconds(0.01, 1000, 6) == pytest.approx(60.0)
    assert training_seconds(0.01, 1000, 6, passes=6.0) == pytest.approx(360.0)
    assert iri_seconds(0.002, 300, 270, depth=0.5) == pytest.approx(81.0)
    # 8 epochs x 300 images x back 0.003, the front's cached forward once per image
    # (300 x 0.006 / 3), the test images' forwards (400 x (0.006 + 0.003) / 3)
    assert stitch_seconds(0.006, 0.003, 300, 8, 400) == pytest.approx(7.2 + 0.6 + 1.2)


def test_seconds_per_image_leaves_the_model_as_it_was():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    model[0].weight.requires_grad_(False)
    for parameters in (True, False):
        t = seconds_per_image(model, torch.rand(8, 3, 8, 8), parameters=parameters)
        assert 0 < t < 1
        assert all(p.grad is None for p in model.parameters())
        assert [p.requires_grad for p in model.parameters()] == [False, True, True, True]


def test_write_table_csv_and_parquet(tmp_path):
    rows = [{"a": 1, "b": 1 / 3, "c": "x", "d": None},
            {"a": 2, "b": float("nan"), "c": "y", "e": True}]  # fmt: skip
    df = write_table(tmp_path / "t.csv", rows, ["c", "a", "b", "d", "missing"], parquet=True)
    assert list(df.columns) == ["c", "a", "b", "d", "missing"]  # "e" dropped
    assert (tmp_path / "t.csv").read_text().splitlines() == [
        "c,a,b,d,missing", "x,1,0.333333,,", "y,2,,,"]  # six digits; None and NaN empty
    exact = read_table(tmp_path / "t.csv")  # the Parquet file: every digit, typed
    assert exact["b"].iloc[0] == 1 / 3 and math.isnan(exact["b"].iloc[1])
    assert exact["a"].tolist() == [1, 2]
    write_table(tmp_path / "u.csv", pd.DataFrame({"v": np.arange(3.0)}))
    assert not (tmp_path / "u.parquet").exists()
    assert read_table(tmp_path / "u.csv")["v"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="at least one column"):
        write_table(tmp_path / "w.csv", [])
