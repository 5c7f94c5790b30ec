"""validation/reproduce.py's tables from a results table: the ceiling of hard agreement,
the spread over the fronts of a family and the gap between two families, on hand-built
rows with hand-computed answers."""

import pandas as pd
import pytest

from _scripts import validation_script

reproduce = validation_script("reproduce")


def _row(pair, protocol, objective, point_index, agreement, **extra) -> dict:
    return {
        "pair": pair, "protocol": protocol, "objective": objective,
        "point_index": point_index, "point": f"p{point_index}", "agreement": agreement,
        **extra,
    }  # fmt: skip


def _families() -> pd.DataFrame:
    rows = []
    values = {"cross-seed": 30.0, "cross-seed2": 40.0, "cross-seed3": 35.0,
              "cross-bias1": 10.0, "cross-bias": 12.0, "cross-bias3": 14.0}  # fmt: skip
    for pair, value in values.items():
        for seed, jitter in ((0, -1.0), (1, 1.0)):  # two stitch seeds average to `value`
            rows.append(_row(pair, "iris", "slm", 3, value + jitter, seed=seed))
            rows.append(_row(pair, "iris", "slm", 1, value + 50, seed=seed))
    return pd.DataFrame(rows)


def test_hard_ceiling_is_100_minus_the_accuracy_difference():
    t = pd.DataFrame([
        # a stitch that reads the marker: 100% accurate, the back 78.8% -> at most 78.8
        _row("cross-bias", "standard", "slm", 2, 67.9, accuracy=100.0,
             reference_accuracy=78.8, hard_agreement=78.7),
        # less accurate than the back by 2 points -> at most 98
        _row("cross-seed", "standard", "slm", 2, 85.0, accuracy=80.3,
             reference_accuracy=82.3, hard_agreement=87.2),
    ])  # fmt: skip
    c = reproduce.hard_ceiling(t)
    assert c.loc[("cross-bias", "standard", "slm", 2), "ceiling"] == pytest.approx(78.8)
    assert c.loc[("cross-seed", "standard", "slm", 2), "ceiling"] == pytest.approx(98.0)
    assert reproduce.hard_ceiling(t.drop(columns="accuracy")) is None
    rows = reproduce.findings("a", t)
    bias = next(r for r in rows if r[0].startswith("standard stitching calls cross-bias"))
    assert "slm at point 2: 67.9 (hard 78.7 of at most 78.8)" in bias[1]
    assert bias[2] == "differs"


def test_one_point_cannot_show_a_fall_with_depth():
    t = pd.DataFrame([_row("cross-seed", "iris", "slm", 3, 33.6)])
    rows = reproduce.findings("a", t)
    (fall,) = [r for r in rows if "falls with depth" in r[0]]
    assert fall[2] == "n/a"


def test_front_families_mean_sd_and_range():
    fam = reproduce.front_families(_families())
    last = fam[fam["point"] == "p3"].set_index("family")
    assert last.loc["cross-seed", "fronts"] == 3
    assert last.loc["cross-seed", "mean"] == pytest.approx(35.0)
    assert last.loc["cross-seed", "sd"] == pytest.approx(5.0)  # sample sd of 30, 40, 35
    assert (last.loc["cross-seed", "min"], last.loc["cross-seed", "max"]) == (30.0, 40.0)
    assert last.loc["cross-bias", "mean"] == pytest.approx(12.0)
    assert last.loc["cross-bias", "sd"] == pytest.approx(2.0)
    single = _families()
    single = single[single["pair"].isin(["cross-seed", "cross-bias"])]
    assert reproduce.front_families(single) is None  # no family with two fronts


def test_family_gap_at_every_point():
    t = _families()
    t.loc[(t["point_index"] == 1) & t["pair"].str.startswith("cross-bias"), "agreement"] -= 20
    gaps = reproduce.family_gap(t).set_index("point")
    assert list(gaps.index) == ["p1", "p3"]  # in the order of the points
    last = gaps.loc["p3"]
    assert last["objective"] == "slm"
    assert last["gap of the means"] == pytest.approx(35.0 - 12.0)
    assert last["smallest gap"] == pytest.approx(30.0 - 14.0)
    assert last["largest gap"] == pytest.approx(40.0 - 10.0)
    assert (last["cross-seed fronts"], last["cross-bias fronts"]) == (3, 3)
    first = gaps.loc["p1"]  # cross-seed 80 / 90 / 85, cross-bias 40 / 42 / 44
    assert first["gap of the means"] == pytest.approx(85.0 - 42.0)
    assert first["smallest gap"] == pytest.approx(80.0 - 44.0)
    assert reproduce.family_gap(t, protocol="standard") is None


def test_family_gap_per_back_for_prefixed_families():
    t = _families()
    other = t.copy()
    other["pair"] = "back4-" + other["pair"]
    other.loc[other["pair"].str.contains("cross-seed"), "agreement"] += 10  # a better back
    gaps = reproduce.family_gap(pd.concat([t, other]))
    last = gaps[gaps["point"] == "p3"].set_index("back")
    assert list(last.index) == ["back", "back4"]
    assert last.loc["back", "gap of the means"] == pytest.approx(35.0 - 12.0)
    assert last.loc["back4", "gap of the means"] == pytest.approx(45.0 - 12.0)
    assert last.loc["back4", "smallest gap"] == pytest.approx(40.0 - 14.0)
    assert "back" not in reproduce.family_gap(t).columns  # one back: no column
