"""stitchlab.report on small synthetic run directories (no models, no torch in the report)."""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pd = pytest.importorskip("pandas")  # the report's dependencies (pandas, matplotlib)
pytest.importorskip("matplotlib")

from stitchlab.report import (  # noqa: E402
    MissingColumnError,
    MissingResultsError,
    ReportInputError,
    infer_num_classes,
    layer_averages,
    load_iris_examples,
    load_results,
    make_report,
    plot_agreement_curves,
)
from stitchlab.report.__main__ import main as report_main  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "stitchlab"
OBJECTIVES = ("hlm", "slm", "dm", "fula")
RESNET_POINTS = ("relu", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0",
                 "layer3.1", "layer4.0", "layer4.1")  # fmt: skip


def _row(**kw) -> dict:
    a = kw["agreement"]
    base = {
        "experiment": "A", "pair": "cross-seed", "front": "resnet18_s1", "back": "resnet18_s0",
        "point": "layer1.0", "point_index": 1, "objective": "hlm", "protocol": "standard",
        "seed": 1, "agreement_normalized": (a - 10) / 90 * 100, "accuracy": 90.0,
        "hard_agreement": a, "error_consistency": 0.5, "reference_accuracy": 91.0,
        "init_residual": 0.3, "seconds": 1.0,
    }  # fmt: skip
    return {**base, **kw}


def _curve(pair: str, objective: str, protocol: str, depth: float) -> float:
    """Paper-like agreement (PROTOCOL section 7) at relative depth in [0, 1]."""
    if protocol == "standard" or objective == "hlm":
        return 95 - 8 * depth
    if pair == "identical":
        return 99.5
    if pair == "cross-bias":
        return max(11.0, 95 - 200 * depth)
    if "robust" in pair:
        return 92 - 55 * depth**1.5
    return 96 - (45 if objective != "dm" else 55) * depth


def synthetic_run(
    run_dir: Path,
    *,
    points=RESNET_POINTS[:3],
    seeds=(1, 2),
    pairs=("cross-seed", "cross-bias", "clean->robust"),
    optional: bool = True,
) -> pd.DataFrame:
    """Write results.csv (+ pairs.csv, cka.csv, iris_examples.safetensors when optional)."""
    rng = np.random.default_rng(0)
    rows = []
    for pair in pairs:
        for seed in seeds:
            front = f"resnet18_s{seed}" if pair != "identical" else "resnet18_s0"
            for i, point in enumerate(points, start=1):
                depth = (i - 1) / max(1, len(points) - 1)
                for protocol in ("standard", "iris"):
                    for objective in OBJECTIVES:
                        a = _curve(pair, objective, protocol, depth) + rng.normal(0, 1.5)
                        a = float(np.clip(a, 0, 100))
                        row = _row(experiment="A", pair=pair, front=front, point=point,
                                   point_index=i, objective=objective, protocol=protocol,
                                   seed=seed, agreement=a)  # fmt: skip
                        if optional and protocol == "iris":
                            e = 0.02 + 0.1 * depth + 0.01 * seed
                            row.update(iri_median_error=e, iri_p90_error=1.6 * e,
                                       iri_pixel_rms=0.2, iri_null_median=1.0,
                                       iri_null_ratio=1.0 / e)  # fmt: skip
                            back = 11.0 if "bias" in pair else 95 - 40 * depth
                            row.update(iri_front_agreement=99.0, iri_back_agreement=back,
                                       iri_back_hard_agreement=back - 2,
                                       iri_back_null_agreement=12.0)  # fmt: skip
                        rows.append(row)
                        if optional and "robust" in pair and objective in ("slm", "fula"):
                            robust = a - 20 * depth - 10 * (protocol == "iris")
                            rows.append({**row, "adversarial": True, "robust_agreement": robust})
    if optional:  # experiment C: unseen shortcut markers
        for marker in ("pixel+loc", "pixel", "rand"):
            for i, point in enumerate(points, start=1):
                for protocol in ("standard", "iris"):
                    for objective in OBJECTIVES:
                        excess = 0.0 if marker == "rand" else (
                            40.0 if protocol == "standard" or objective == "hlm" else 2.0
                        )  # fmt: skip
                        a = 60 + excess
                        rows.append(
                            _row(
                                experiment="C",
                                pair="lsimnet->cifar",
                                point=point,
                                point_index=i,
                                objective=objective,
                                protocol=protocol,
                                seed=1,
                                agreement=a,
                                marker=marker,
                                agreement_rolled=60.0,
                                excess_agreement=excess,
                            )  # fmt: skip
                        )
    df = pd.DataFrame(rows)
    run_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(run_dir / "results.csv", index=False)
    if optional:
        pd.DataFrame(
            [{"pair": p, "front": "resnet18_s1", "back": "resnet18_s0",
              "front_agreement": 100.0 if p == "identical" else 88.0 - 30 * ("bias" in p),
              "front_accuracy": 90.0, "back_accuracy": 91.0} for p in pairs]
        ).to_csv(run_dir / "pairs.csv", index=False)  # fmt: skip
        pd.DataFrame(
            [{"pair": p, "front": "resnet18_s1", "back": "resnet18_s0", "point": pt,
              "point_index": i, "data": d, "cka": 0.9 - 0.1 * i * (d == "test_iris")}
             for p in pairs[:2] for i, pt in enumerate(points, 1) for d in ("test", "test_iris")]
        ).to_csv(run_dir / "cka.csv", index=False)  # fmt: skip
        write_examples(run_dir / "iris_examples.safetensors", ["resnet18_s1"], points[:2])
    return df


def write_examples(path: Path, fronts, points, k: int = 3) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    tensors = {"source": rng.integers(0, 256, (k, 3, 16, 16), dtype=np.uint8)}
    meta = {}
    for f in fronts:
        for p in points:
            tensors[f"iris/{f}/{p}"] = rng.integers(0, 256, (k, 3, 16, 16), dtype=np.uint8)
            meta[f"errors/{f}/{p}"] = json.dumps([0.01 * (j + 1) for j in range(k)])
    save_file(tensors, str(path), metadata=meta)


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    df = synthetic_run(run)
    out = make_report(run, strict=True)
    return run, out, df


def test_make_report_writes_html_and_figures(full_report):
    run, out, df = full_report
    assert out == run / "report.html" and out.is_file()
    html = out.read_text(encoding="utf-8")
    pngs = sorted((run / "figures").glob("*.png"))
    pdfs = sorted((run / "figures").glob("*.pdf"))
    names = {p.stem for p in pngs}
    assert {"agreement-a", "agreement-c", "robust-a", "excess-agreement", "cka", "iri-quality",
            "iris-examples", "layer-average"} <= names  # fmt: skip
    assert {p.stem for p in pdfs} == names
    assert all(p.read_bytes()[:4] == b"%PDF" for p in pdfs)
    # every PNG embedded, byte for byte
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(embedded) == len(pngs)
    assert {base64.b64decode(e) for e in embedded} == {p.read_bytes() for p in pngs}
    for pair in ("cross-seed", "cross-bias", "clean-&gt;robust", "lsimnet-&gt;cifar"):
        assert pair in html
    assert f"{len(df)} stitch runs" in html
    assert "Layer-averaged agreement" in html and "IRI quality per front and point" in html
    assert "times closer than null" in html and "null (another image)" in html
    assert "Pairs and the Front reference" in html
    assert "Shared invariance without a stitch" in html and "back on the front&#x27;s IRIs" in html
    assert "back: null (another image)" in html and "back: same top-1 (%)" in html
    assert "Layer-averaged robust agreement" in html and "excess agreement (pp)" in html
    assert "K = 10" in html  # inferred from agreement_normalized


def test_layer_averages_hand_computed():
    rows = [
        # seed 1: 80, 90, 60 over three points; seed 2: 60 and (100, 100 -> 100) on two
        _row(point="a", point_index=1, seed=1, agreement=80.0),
        _row(point="b", point_index=2, seed=1, agreement=90.0),
        _row(point="c", point_index=3, seed=1, agreement=60.0),
        _row(point="a", point_index=1, seed=2, agreement=60.0),
        _row(point="b", point_index=2, seed=2, agreement=100.0),
        _row(point="b", point_index=2, seed=2, agreement=100.0),  # second stitch seed
        _row(point="a", point_index=1, seed=1, agreement=30.0, protocol="iris"),
        _row(point="b", point_index=2, seed=1, agreement=10.0, protocol="iris"),
    ]
    table = layer_averages(pd.DataFrame(rows))
    assert list(table["protocol"]) == ["standard", "iris"]
    std = table.iloc[0]
    # curve over seeds: (80+60)/2 = 70, (90+100)/2 = 95, 60 -> layer average 225/3 = 75
    assert std["layer_average"] == pytest.approx(75.0)
    assert (std["n_points"], std["n_seeds"]) == (3, 2)
    # per-seed layer averages: (80+90+60)/3 = 76.667 and (60+100)/2 = 80
    assert std["seed_std"] == pytest.approx(np.std([230 / 3, 80.0], ddof=1))
    iris = table.iloc[1]
    assert iris["layer_average"] == pytest.approx(20.0) and iris["n_seeds"] == 1
    assert math.isnan(iris["seed_std"])


def test_layer_averages_keep_markers_apart():
    rows = [
        _row(marker="pixel", point_index=1, agreement=90.0, excess_agreement=30.0),
        _row(marker="rand", point_index=1, agreement=60.0, excess_agreement=0.0),
    ]
    table = layer_averages(pd.DataFrame(rows), "excess_agreement")
    assert list(table["marker"]) == ["pixel", "rand"]
    assert list(table["layer_average"]) == [30.0, 0.0]


def test_minimal_run_single_seed_single_point(tmp_path):
    rows = [_row(pair="cross-seed", point="blocks.1", objective=o, protocol=p, agreement=70.0)
            for o in OBJECTIVES for p in ("standard", "iris")]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    (tmp_path / "pairs.csv").write_text("pair\n")  # what a run without pairs writes
    out = make_report(tmp_path, formats=("png",), strict=True)
    html = out.read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == len(list((tmp_path / "figures").iterdir()))
    assert "cross-seed" in html and "1 stitch runs" not in html and "8 stitch runs" in html
    for missing in ("No pairs.csv", "No cka.csv", "No iris_examples.safetensors",
                    "no excess_agreement values", "no iri_* values"):  # fmt: skip
        assert missing in html
    assert not list((tmp_path / "figures").glob("*.pdf"))


def test_report_names_the_iri_recipe_that_run_json_records(tmp_path):
    """The IRI table's caption gives the recipe run.json records (never one guessed from
    the config); a run.json without it, or without IRIs, is handled loudly or quietly."""
    rows = [_row(pair="cross-seed", point="blocks.1", objective="slm", protocol=p,
                 agreement=70.0, iri_median_error=0.04 if p == "iris" else None,
                 iri_p90_error=0.05 if p == "iris" else None)
            for p in ("standard", "iris")]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    recipe = {"steps": 200, "step_size": 1 / 255, "final_step_size": None, "optimizer": "sign",
              "start": "noise", "tolerance": None, "box": [0.0, 1.0], "batch_size": 128,
              "amp": "auto", "relu_grad": "exact", "relu_slope": 0.1, "start_scale": 0.003,
              "precision": "uint8"}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps({"iris": {"total": 1, "recipe": recipe}}))
    html = make_report(tmp_path, formats=("png",), strict=True).read_text(encoding="utf-8")
    assert "IRI recipe: 200 sign steps 1/255 from uniform noise over the box, exact ReLU" in html
    (tmp_path / "run.json").write_text(json.dumps({"iris": {"total": 1}}))  # an older run
    html = make_report(tmp_path, formats=("png",), strict=True).read_text(encoding="utf-8")
    assert "records no IRI recipe" in html and "IRI recipe: not recorded in run.json" in html
    (tmp_path / "run.json").write_text(json.dumps({"iris": {"total": 1, "recipe": {"steps": 1}}}))
    html = make_report(tmp_path, formats=("png",), strict=True).read_text(encoding="utf-8")
    assert "not readable" in html
    (tmp_path / "run.json").write_text(json.dumps({"iris": {"total": 0}}))  # no IRI sets
    html = make_report(tmp_path, formats=("png",), strict=True).read_text(encoding="utf-8")
    assert "records no IRI recipe" not in html


def test_agreement_figure_axes():
    rows = [_row(point="blocks.1", objective=o, agreement=70.0, seed=s) for o in OBJECTIVES
            for s in (1, 2, 3)]  # fmt: skip
    fig = plot_agreement_curves(pd.DataFrame(rows), reference={"cross-seed": (80.0, 78.0, 82.0)})
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Front", "blocks.1", "End"]
    assert ax.get_ylim() == (0.0, 100.0)
    assert ax.get_title() == "cross-seed"
    points = {(float(x), float(y)) for line in ax.lines for x, y in line.get_xydata()}
    assert (0.0, 80.0) in points and (2.0, 100.0) in points  # Front and End
    assert {y for x, y in points if 0.5 < x < 1.5} == {70.0, 10.0}  # objectives; chance
    assert [list(ln.get_ydata()) for ln in ax.lines if ln.get_linestyle() == ":"] == [[10, 10]]
    pairs = pd.DataFrame({"pair": ["cross-seed"], "front_agreement": [55.0]})
    fig = plot_agreement_curves(pd.DataFrame(rows), reference=pairs, num_classes=None)
    points = {(float(x), float(y)) for line in fig.axes[0].lines for x, y in line.get_xydata()}
    assert (0.0, 55.0) in points
    with pytest.raises(ValueError, match="2 experiments"):
        plot_agreement_curves(
            pd.DataFrame([_row(agreement=1.0), _row(experiment="B", agreement=1.0)])
        )


def test_iri_quality_figure_point_names_do_not_overlap():
    """The demo's IRI panel (4 points, 3 fronts, the legend outside) drew its point names
    upright on top of each other; they are turned where they would overlap, and the
    curves are the table's numbers."""
    from stitchlab.report import plot_iri_quality
    from stitchlab.report.figures import tick_labels_overlap

    rows = [{"front": f, "point": f"blocks.{i}", "point_index": i + 1,
             "iri_median_error": 0.01 * (i + 1), "iri_p90_error": 0.02 * (i + 1),
             "iri_null_median": 1.0} for f in ("back", "seed1", "shortcut")
            for i in range(4)]  # fmt: skip
    fig = plot_iri_quality(pd.DataFrame(rows))
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"blocks.{i}" for i in range(4)]
    assert not tick_labels_overlap(fig, ax)
    assert ax.get_yscale() == "log"
    medians = [list(ln.get_ydata()) for ln in ax.lines if ln.get_linestyle() == "-"]
    assert medians == [[0.01, 0.02, 0.03, 0.04]] * 3
    # long front names take the legend's room: the names that would overlap are turned
    from stitchlab.report.figures import _rotate_crowded_points

    long_rows = [r | {"front": r["front"] * 5} for r in rows]
    fig = plot_iri_quality(pd.DataFrame(long_rows))
    assert all(t.get_rotation() == 45 for t in fig.axes[0].get_xticklabels())
    _rotate_crowded_points(fig, fig.axes[0])  # idempotent once turned
    # two short names fit upright and stay so
    fig = plot_iri_quality(pd.DataFrame([r | {"point": r["point"][-1]} for r in rows[:2]]))
    assert all(t.get_rotation() == 0 for t in fig.axes[0].get_xticklabels())


def test_missing_required_column(tmp_path):
    df = pd.DataFrame([_row(agreement=50.0)]).drop(columns=["agreement", "seed"])
    df.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(MissingColumnError) as info:
        make_report(tmp_path)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "results.csv" in msg and "'agreement'" in msg and "'seed'" in msg
    assert info.value.columns == ("seed", "agreement")
    assert report_main([str(tmp_path)]) == 2


def test_bad_values_and_missing_files(tmp_path):
    with pytest.raises(MissingResultsError, match="results.csv"):
        make_report(tmp_path)
    df = pd.DataFrame([_row(agreement=50.0), _row(agreement=50.0)]).astype({"agreement": object})
    df.loc[1, "agreement"] = "n/a?"
    df.to_csv(tmp_path / "results.csv", index=False)
    with pytest.raises(ReportInputError, match="'agreement'.*'n/a\\?'.*row 2"):
        load_results(tmp_path / "results.csv")
    pd.DataFrame([_row(agreement=50.0)]).to_csv(tmp_path / "results.csv", index=False)
    pd.DataFrame({"pair": ["cross-seed"]}).to_csv(tmp_path / "pairs.csv", index=False)
    with pytest.raises(MissingColumnError, match="pairs.csv.*'front_agreement'"):
        make_report(tmp_path)


def test_text_from_files_is_escaped(tmp_path):
    evil = "<script>alert(1)</script>"
    rows = [_row(experiment="../" + evil, pair=evil, objective=o, agreement=50.0)
            for o in OBJECTIVES]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    html = make_report(tmp_path, formats=("png",), strict=True).read_text(encoding="utf-8")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert all(p.parent == tmp_path / "figures" for p in tmp_path.rglob("*.png"))


def test_iris_examples_and_num_classes(tmp_path):
    write_examples(tmp_path / "ex.safetensors", ["vit_s1"], ["blocks.0", "blocks.5"], k=2)
    ex = load_iris_examples(tmp_path / "ex.safetensors")
    assert set(ex.iris) == {("vit_s1", "blocks.0"), ("vit_s1", "blocks.5")}
    assert ex.errors[("vit_s1", "blocks.5")] == [0.01, 0.02]
    k100 = pd.DataFrame([_row(agreement=a, agreement_normalized=(a - 1) / 99 * 100)
                         for a in (30.0, 60.0)])  # fmt: skip
    assert infer_num_classes(k100) == 100
    assert infer_num_classes(k100.drop(columns="agreement_normalized"), 10) == 10


def test_report_does_not_import_torch():
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('stitchlab'); pkg.__path__ = [{str(SRC)!r}]\n"
        "sys.modules['stitchlab'] = pkg\n"
        "import stitchlab.report\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')\n"
        "       or (m.startswith('stitchlab.') and not m.startswith('stitchlab.report')\n"
        "           and m != 'stitchlab.vocabulary')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_markdown_table_known_output():
    from stitchlab.report import markdown_table

    rows = [{"a": 1, "b": 0.25}, {"a": 2, "c": float("nan")}]
    assert markdown_table(rows) == "| a | b | c |\n|---|---|---|\n| 1 | 0.25 |  |\n| 2 |  |  |"
    df = pd.DataFrame({"x": [1.26, None]})
    assert markdown_table(df, float_format=".1f") == "| x |\n|---|\n| 1.3 |\n|  |"


def test_iri_transfer_hand_computed():
    from stitchlab.report.tables import iri_transfer

    iris = dict(protocol="iris", iri_front_agreement=99.0)
    rows = [
        _row(point="a", point_index=1, seed=1, agreement=50.0, iri_back_agreement=40.0, **iris),
        _row(point="a", point_index=1, seed=2, agreement=52.0, iri_back_agreement=60.0, **iris),
        _row(point="b", point_index=2, seed=1, agreement=20.0, iri_back_agreement=10.0, **iris),
        _row(point="a", point_index=1, seed=1, agreement=90.0),  # standard: no transfer
    ]
    t = iri_transfer(pd.DataFrame(rows))
    assert list(t["point"]) == ["a", "b"]
    assert list(t["iri_back_agreement"]) == [50.0, 10.0]  # (40 + 60) / 2
    assert list(t["iri_front_agreement"]) == [99.0, 99.0]
    assert iri_transfer(pd.DataFrame(rows[3:])) is None


def test_scores_out_of_range_or_missing_are_refused_and_missing_runs_named(tmp_path):
    """An agreement of 800, inf or an empty cell was averaged in ("190.0 ± 216.6"); runs
    missing at one point were averaged over other seeds while the table said "seeds 3"."""
    rows = [_row(point=f"p{i}", point_index=i, seed=s, agreement=a)
            for i in (1, 2) for s, a in ((1, 60.0), (2, 70.0), (3, 80.0))]  # fmt: skip
    for bad in (800.0, math.inf, -5.0, math.nan):
        table = pd.DataFrame(rows)
        table.loc[2, "agreement"] = bad
        table.to_csv(tmp_path / "results.csv", index=False)
        with pytest.raises(ReportInputError, match=r"'agreement' must hold percentages .*\[4\]"):
            load_results(tmp_path / "results.csv")
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    whole = layer_averages(load_results(tmp_path / "results.csv"))
    assert whole[["n_seeds", "min_seeds"]].values.tolist() == [[3, 3]]
    pd.DataFrame(rows[:5]).to_csv(tmp_path / "results.csv", index=False)  # seed 3 lost at p2
    part = layer_averages(load_results(tmp_path / "results.csv"))
    assert part[["n_seeds", "min_seeds"]].values.tolist() == [[3, 2]]
    html = make_report(tmp_path, formats=("png",)).read_text()
    assert "2–3 (runs missing)" in html


def test_normalised_to_identical_hand_computed():
    """(layer average - 100/K) / (identical pair's - 100/K), per objective and protocol."""
    from stitchlab.report.tables import normalised_to_identical

    rows = [_row(pair="identical", agreement=91.0), _row(pair="cross-seed", agreement=50.5),
            _row(pair="identical", agreement=55.0, protocol="iris"),
            _row(pair="cross-seed", agreement=32.5, protocol="iris")]
    table = normalised_to_identical(layer_averages(pd.DataFrame(rows)), {"A": 10})
    got = {(r.pair, r.protocol): r.layer_average for r in table.itertuples()}
    assert got[("identical", "standard")] == 1 and got[("identical", "iris")] == 1
    assert got[("cross-seed", "standard")] == pytest.approx(0.5)  # 40.5 / 81
    assert got[("cross-seed", "iris")] == pytest.approx(0.5)  # 22.5 / 45
    assert normalised_to_identical(layer_averages(pd.DataFrame(rows[1:2])), {"A": 10}) is None


def test_report_with_an_identical_pair_has_the_normalised_table(tmp_path):
    synthetic_run(tmp_path, pairs=("identical", "cross-seed"), optional=False)
    html = make_report(tmp_path, strict=True).read_text(encoding="utf-8")
    assert "Layer-averaged agreement between floor and ceiling" in html
