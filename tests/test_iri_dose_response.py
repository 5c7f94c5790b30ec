"""validation/iri_dose_response.py end to end on a tiny config (generated shapes, two small
CNNs): its rows, identities the rows must satisfy, its refusals before any work, and the
figure redrawn from its CSV."""

import csv
import sys

import pytest

from _scripts import validation_script

dose = validation_script("iri_dose_response")

CONFIG = """
name = "tiny-dose"
[data]
kind = "shapes"
n_train = 240
n_test = 80
seed = 0
[models.back]
arch = "small_cnn"
options = { width = 4 }
seed = 0
recipe = { epochs = 1, augment = false }
[models.other]
arch = "small_cnn"
options = { width = 4 }
seed = 1
recipe = { epochs = 1, augment = false }
[pairs.identical]
front = "back"
back = "back"
[pairs.cross-seed]
front = "other"
back = "back"
[stitch]
points = ["blocks.1"]
objectives = ["slm"]
protocols = ["iris"]
n_stitch = 48
n_init = 48
training = { epochs = 1, batch_size = 16 }
[run]
threads = 1
"""

ROUGH = "sign 40 steps 8/255->0.5/255"
DEFAULT = "default"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The config on disk and a store holding its two trained models."""
    from stitchlab.experiments import load_config, with_fingerprints
    from stitchlab.experiments.jobs import RunContext, TrainJob, train_job

    root = tmp_path_factory.mktemp("dose")
    config = root / "tiny.toml"
    config.write_text(CONFIG)
    ctx = RunContext(exp=with_fingerprints(load_config(config).raw), store=str(root / "store"))
    for name in ("back", "other"):
        train_job(TrainJob(ctx=ctx, model=name))
    return root, config


def _main(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["iri_dose_response.py", *map(str, args)])
    dose.main()


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_rows_per_pair_and_level_with_their_identities(tiny, monkeypatch):
    root, config = tiny
    out, figure = root / "out", root / "dose.png"
    _main(monkeypatch, config, "--store", root / "store", "--out", out,
          "--pairs", "identical,cross-seed", "--points", "blocks.1", "--objectives", "slm",
          "--levels", f"{ROUGH};{DEFAULT}", "--threads", 1, "--figure", figure)  # fmt: skip
    rows = _rows(out / "dose_response.csv")
    assert [(r["pair"], r["recipe"]) for r in rows] == [
        ("identical", ROUGH), ("identical", DEFAULT),
        ("cross-seed", ROUGH), ("cross-seed", DEFAULT),
    ]  # fmt: skip
    for r in rows:
        cell = (r["point"], r["objective"], r["n_iris"], r["epochs"])
        assert cell == ("blocks.1", "slm", "48", "1")
        assert 0 <= float(r["agreement"]) <= 100
        # every set is measured against its null: another image is farther than an IRI
        assert float(r["iri_null_ratio"]) > 1
        if r["pair"] == "identical":  # the back is the front: one model, one agreement
            assert r["front_on_iris"] == r["back_on_iris"]
    for pair in ("identical", "cross-seed"):
        rough, default = (float(r["iri_median_error"]) for r in rows if r["pair"] == pair)
        assert default < rough  # 270 Adam steps against 40 signed steps
    assert figure.stat().st_size > 0
    # the figure again from the CSV alone
    again = root / "again.png"
    _main(monkeypatch, "--plot", out / "dose_response.csv", "--figure", again, "--n0", 48,
          "--e0", 1)  # fmt: skip
    assert again.stat().st_size > 0


@pytest.mark.parametrize(
    "flag, value, message",
    [("--pairs", "identical,cross-bias2", "unknown pairs ['cross-bias2']"),
     ("--levels", "sign 41 steps", "unknown levels ['sign 41 steps']")],
)  # fmt: skip
def test_unknown_names_are_refused_before_any_work(tiny, monkeypatch, flag, value, message):
    root, config = tiny
    out = root / f"refused{flag}"
    args = {"--pairs": "identical", "--levels": ROUGH, flag: value}
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        _main(monkeypatch, config, "--store", root / "store", "--out", out,
              "--points", "blocks.1", *[s for kv in args.items() for s in kv])  # fmt: skip
    assert not out.exists()  # nothing was run or written
