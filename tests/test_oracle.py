"""The oracle testbed: its construction and identities (not the hypothesis it tests)."""

import csv
import json

import pytest
import torch

from stitchlab import models
from stitchlab.oracle import (
    TESTBED_CUES,
    OracleSettings,
    bootstrap_spearman,
    conflict_agreement,
    oracle_data,
    profile_overlap,
    run_oracle,
    spearman,
    with_ceiling,
)


def _share(a, b):
    return float((a == b).double().mean())


def test_cues_carry_the_label_only_where_asked():
    n = 2000
    _, y, c = oracle_data(n, seed=0, mode="train", cues=("colour", "marker"))
    assert torch.equal(c["colour"], y) and torch.equal(c["marker"], y)
    assert _share(c["shape"], y) < 0.15 and _share(c["texture"], y) < 0.15
    _, y, c = oracle_data(n, seed=0, mode="aligned")
    assert all(torch.equal(c[k], y) for k in TESTBED_CUES)
    _, y, c = oracle_data(n, seed=0, mode="isolated", cues=("texture",))
    assert torch.equal(c["texture"], y)
    assert all(_share(c[k], y) < 0.15 for k in TESTBED_CUES if k != "texture")


def test_conflict_data_is_balanced_and_its_cues_independent():
    n = 4000
    x, y, c = oracle_data(n, seed=1, mode="conflict")
    assert x.shape == (n, 3, 32, 32) and 0 <= x.min() and x.max() <= 1
    for cue in TESTBED_CUES:  # every class about equally often
        counts = torch.bincount(c[cue], minlength=10).double() / n
        assert counts.min() > 0.07 and counts.max() < 0.13, cue
    for a in TESTBED_CUES:  # two cues show the same class about 1 time in 10
        for b in TESTBED_CUES:
            if a < b:
                assert 0.07 < _share(c[a], c[b]) < 0.13, (a, b)


def test_the_marker_is_drawn_and_images_differ_by_cue():
    x0, _, c0 = oracle_data(8, seed=0, mode="aligned")
    x1, _, _ = oracle_data(8, seed=0, mode="aligned")
    assert torch.equal(x0, x1)  # deterministic for a seed
    with pytest.raises(ValueError, match="one label-carrying cue"):
        oracle_data(8, seed=0, mode="isolated", cues=("shape", "colour"))
    with pytest.raises(ValueError, match="subset"):
        oracle_data(8, seed=0, mode="train", cues=("smell",))


def test_oracle_identities():
    torch.manual_seed(0)
    a = models.create("small_cnn", width=4).eval()
    torch.manual_seed(1)
    b = models.create("small_cnn", width=4).eval()
    x = oracle_data(200, seed=2, mode="conflict")[0]
    assert conflict_agreement(a, a, x) == 100.0
    assert conflict_agreement(a, b, x) == conflict_agreement(b, a, x)
    p = {"shape": 95.0, "colour": 10.0, "texture": 12.0, "marker": 9.0}
    q = {"shape": 10.0, "colour": 96.0, "texture": 10.0, "marker": 10.0}
    assert profile_overlap(p, p) == 1.0
    assert profile_overlap(p, q) == 0.0  # disjoint reliance
    half = {**p, "shape": 55.0, "texture": 10.0}  # reliance above chance: 0.5 on shape
    assert profile_overlap(p, half) == pytest.approx(0.5 / (85 / 90 + 2 / 90))


def test_spearman_hand_values_and_interval():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties get average ranks: x ranks 1, 2.5, 2.5, 4 against 1..4: 0.9487
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, abs=1e-6)
    rho, lo, hi = bootstrap_spearman(list(range(20)), [v + (v % 3) for v in range(20)], reps=200)
    assert lo <= rho <= hi and hi <= 1.0


TINY = dict(
    families=(("colour",), ("marker",), ("colour", "marker")), n_train=1000, n_test=200,
    n_stitch=64, n_init=32, width=4, train_epochs=3, train_batch_size=32, points=("blocks.3",),
    objectives=("slm", "dm"), stitch_epochs=1, iri_steps=5, bootstrap=50, threads=1,
)  # fmt: skip


def test_tiny_oracle_run_writes_its_tables_and_resumes(tmp_path):
    settings = OracleSettings(**TINY)
    plan = run_oracle(settings, tmp_path, progress=False, plan_only=True)
    stages = [(s.name, s.jobs, s.stored) for s in plan.stages]
    assert stages == [("networks", 3, 0), ("IRI sets", 3, 0), ("graded pairs", 9, 0)]
    assert all(s.seconds > 0 for s in plan.stages)
    summary = run_oracle(settings, tmp_path, progress=False)
    with open(tmp_path / "oracle.csv") as f:
        rows = list(csv.DictReader(f))
    # 9 ordered pairs x 1 point x (2 protocols x 2 objectives + 2 CKA + 2 IRI transfers)
    assert len(rows) == 9 * 8
    assert all(float(r["oracle"]) == 100.0 for r in rows if r["self"] == "True")
    # a self pair's stitch is its own ceiling: normalised 1 (where above chance)
    assert all(float(r["normalised"]) == 1.0 for r in rows if r["self"] == "True"
               and r["method"] == "stitch" and float(r["score"]) > 10)  # fmt: skip
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert set(saved["methods"]) == {"stitch/standard/slm", "stitch/standard/dm",
                                     "stitch/iris/slm", "stitch/iris/dm", "cka/test", "cka/iris",
                                     "iri_transfer/soft", "iri_transfer/hard"}
    transfer = [float(r["score"]) for r in rows if r["method"] == "iri_transfer"]
    assert len(transfer) == 2 * 9 and all(0 <= v <= 100 for v in transfer)
    assert saved["methods"]["stitch/standard/slm"]["layer_average"]["pairs"] == 6
    with open(tmp_path / "networks.csv") as f:
        nets = {r["network"]: r for r in csv.DictReader(f)}
    # reliance measured, not assumed: the colour network reads colour, not the marker
    assert float(nets["colour-s0"]["acc_colour"]) > 40 > float(nets["colour-s0"]["acc_marker"])
    assert float(nets["marker-s0"]["acc_marker"]) > 40 > float(nets["marker-s0"]["acc_colour"])
    assert (tmp_path / "report.html").exists() and (tmp_path / "figures" / "oracle.png").exists()
    again = run_oracle(settings, tmp_path, progress=False)  # everything reused
    assert again["methods"] == summary["methods"]
    assert again["seconds"] < summary["seconds"] / 2
    assert run_oracle(settings, tmp_path, progress=False, plan_only=True).todo == 0
    # other stitch settings reuse the networks and IRIs, never a pair result
    other = OracleSettings(**{**TINY, "stitch_epochs": 2})
    plan = run_oracle(other, tmp_path, progress=False, plan_only=True)
    stages = [(s.name, s.jobs, s.stored) for s in plan.stages]
    assert stages == [("networks", 3, 3), ("IRI sets", 3, 3), ("graded pairs", 9, 0)]
    run_oracle(other, tmp_path, progress=False)
    assert len(list((tmp_path / "store" / "pairs").glob("*.json"))) == 2 * 9
    assert len(list((tmp_path / "store" / "models").iterdir())) == 3


def test_settings_are_checked():
    with pytest.raises(ValueError, match="at least 3 networks"):
        OracleSettings(families=(("shape",),), seeds=(0,))
    with pytest.raises(ValueError, match="subset"):
        OracleSettings(families=(("shape",), ("smell",), ("colour",)))
    with pytest.raises(ValueError, match="unknown \\[oracle\\] keys"):
        OracleSettings.from_table({"n_trian": 5})
    assert OracleSettings.quick().points == ("blocks.3",)


def test_the_oracle_config_runs_through_stitchlab_run(tmp_path, capsys):
    from pathlib import Path

    from stitchlab.cli import main

    config = Path(__file__).parent.parent / "configs" / "oracle.toml"
    assert main(["run", str(config), "--out", str(tmp_path), "--check"]) == 0
    assert "valid oracle config (8 families" in capsys.readouterr().out
    assert main(["run", str(config), "--out", str(tmp_path / "p"), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "  networks         8 jobs, 0 stored, about" in out
    assert "estimate: at most about" in out  # the IRI sets: an upper bound
    assert not (tmp_path / "p" / "oracle.csv").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text("[oracle]\nn_trian = 5\n")
    assert main(["run", str(bad), "--out", str(tmp_path), "--check"]) != 0


def test_with_ceiling_hand_computed():
    """normalised = (score - 100/K) / (self pair's score - 100/K), per back, point,
    protocol and objective; other methods have no ceiling."""
    def row(front, back, score, method="stitch", protocol="standard"):
        return {"front": front, "back": back, "self": front == back, "point": "p",
                "method": method, "protocol": protocol, "objective": "slm", "score": score}

    rows = with_ceiling([row("b", "b", 90.0), row("a", "b", 50.0), row("a", "a", 10.0),
                         row("b", "a", 30.0), row("a", "b", 70.0, "cka", "test")])
    assert [r["self_score"] for r in rows] == [90.0, 90.0, 10.0, 10.0, None]
    assert rows[0]["normalised"] == 1.0 and rows[1]["normalised"] == pytest.approx(0.5)
    assert rows[3]["normalised"] != rows[3]["normalised"]  # ceiling at chance: NaN
    assert rows[4]["normalised"] is None
