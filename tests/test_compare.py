"""stitchlab compare: your own models and data, with intervals and a random-front null."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from stitchlab.cli import main
from stitchlab.compare import CompareSettings, bootstrap_agreement, match_points, run_compare
from stitchlab.models.sources import InputSpec, WithInput, load_model_source


def _write_folder(root, n_per_class=6, classes=("a", "b", "c"), size=32, seed=0):
    """Class folders of PNGs whose class is its mean colour (a learnable task)."""
    from PIL import Image

    g = np.random.default_rng(seed)
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n_per_class):
            img = g.integers(0, 60, size=(size, size, 3)).astype(np.uint8)
            img[..., k] += 150
            Image.fromarray(img).save(root / name / f"{i}.png")
    return root


def _timm_weights(tmp_path, name, num_classes, seed):
    import timm

    torch.manual_seed(seed)
    m = timm.create_model(name, pretrained=False, num_classes=num_classes)
    path = tmp_path / f"{name}-{seed}.safetensors"
    save_file(m.state_dict(), str(path))
    return m, path


# --- points ----------------------------------------------------------------------------


def test_match_points_by_relative_depth():
    front = ["f1", "f2", "f3", "f4"]  # depths .25 .5 .75 1
    back = [f"b{i}" for i in range(1, 9)]  # depths .125 ... 1
    assert match_points(front, back, "depth", 4) == [
        ("f1", "b2"), ("f2", "b4"), ("f3", "b6"), ("f4", "b8")]  # fmt: skip
    assert match_points(front, back, "depth", 2) == [("f2", "b4"), ("f4", "b8")]
    assert match_points(back, front, "depth", 8)[0] == ("b1", "f1")  # ties: the deeper one
    grid = match_points(front, back, "grid", 2)
    assert grid == [("f2", "b4"), ("f2", "b8"), ("f4", "b4"), ("f4", "b8")]


def test_match_points_named_and_errors():
    front, back = ["x", "y"], ["x", "z"]
    assert match_points(front, back, ["x", "y:z"]) == [("x", "x"), ("y", "z")]
    with pytest.raises(ValueError, match="not a stitch point of the back model"):
        match_points(front, back, ["y"])
    with pytest.raises(ValueError, match="Did you mean 'x'"):
        match_points(front, back, ["xx"])


# --- intervals -------------------------------------------------------------------------


def test_bootstrap_identities_and_known_values():
    ones = np.ones((3, 200))
    s = bootstrap_agreement(ones, ones, reps=200)
    assert s["agreement"] == 100 and s["agreement_ci_low"] == s["agreement_ci_high"] == 100
    assert s["excess_over_null"] == 0 and s["excess_ci_low"] == s["excess_ci_high"] == 0
    g = np.random.default_rng(0)
    hits = (g.random((3, 2000)) < 0.7).astype(float)
    null = (g.random((2, 2000)) < 0.3).astype(float)
    s = bootstrap_agreement(hits, null, reps=500)
    assert s["agreement"] == pytest.approx(100 * hits.mean())
    assert s["agreement_ci_low"] < s["agreement"] < s["agreement_ci_high"]
    # binomial standard error of a mean over 6000 draws at p = 0.7 is 0.59 points
    assert 1.0 < s["agreement_ci_high"] - s["agreement_ci_low"] < 4.0
    assert s["excess_over_null"] == pytest.approx(s["agreement"] - s["null_agreement"])
    assert s["excess_ci_low"] > 35 and s["excess_ci_high"] < 45
    single = bootstrap_agreement(hits[:1], reps=100)
    assert math.isnan(single["agreement_seed_std"]) and "null_agreement" not in single
    # more test images: a narrower interval
    wide = bootstrap_agreement(hits[:, :200], reps=500)
    assert (wide["agreement_ci_high"] - wide["agreement_ci_low"]) > (
        s["agreement_ci_high"] - s["agreement_ci_low"])


def test_bootstrap_seed_spread_widens_interval():
    g = np.random.default_rng(1)
    same = np.stack([(g.random(1000) < 0.6)] * 3).astype(float)
    spread = np.stack([(g.random(1000) < p) for p in (0.4, 0.6, 0.8)]).astype(float)
    a, b = bootstrap_agreement(same, reps=400), bootstrap_agreement(spread, reps=400)
    assert (b["agreement_ci_high"] - b["agreement_ci_low"]) > 2 * (
        a["agreement_ci_high"] - a["agreement_ci_low"])


# --- model sources ---------------------------------------------------------------------


def test_sources_read_classes_and_pipelines(tmp_path):
    import torchvision

    _, path = _timm_weights(tmp_path, "test_convnext", 7, 0)
    a = load_model_source("timm:test_convnext", str(path))
    assert a.num_classes == 7 and a.input.mean == (0.5, 0.5, 0.5) and a.input.size == (160, 160)
    tv = torchvision.models.resnet18(num_classes=4)
    torch.save({"state_dict": tv.state_dict()}, tmp_path / "tv.pth")
    b = load_model_source("torchvision:resnet18", str(tmp_path / "tv.pth"))
    assert b.num_classes == 4 and b.input.size == (224, 224)
    assert b.input.std == pytest.approx((0.229, 0.224, 0.225))
    with pytest.raises(ValueError, match="without weights"):
        load_model_source("timm:test_convnext")
    with pytest.raises(ValueError, match="neither a file nor a known model"):
        load_model_source("no_such_model_xyz")


def test_with_input_resizes_and_normalises_exactly():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Identity())
    spec = InputSpec((2, 2), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    w = WithInput(net, spec, (4, 4), points=["0"])
    x = torch.full((1, 3, 4, 4), 0.75)
    assert torch.allclose(w(x), torch.ones(1, 12))  # (0.75 - 0.5) / 0.25
    assert w.stitchlab_points == ["net.0"]
    same = WithInput(net, InputSpec((4, 4)), (4, 4), points=[])
    assert not same.resize and torch.equal(same(x), x.flatten(1))


# --- end to end ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # 67 stitching images: test_convnext's pre_logits (64 channels) needs 65
    return _write_folder(tmp_path_factory.mktemp("imgs"), n_per_class=28)


def test_compare_end_to_end_timm_pair(tmp_path, folder):
    _, wa = _timm_weights(tmp_path, "test_convnext", 3, 0)
    _, wb = _timm_weights(tmp_path, "test_convnext", 3, 1)
    out = tmp_path / "out"
    rc = main(["compare", "timm:test_convnext", "timm:test_convnext", "--front-weights", str(wa),
               "--back-weights", str(wb), "--data", str(folder), "--out", str(out), "--quick",
               "--front-size", "32", "--back-size", "32", "--n-points", "2",
               "--no-progress"])  # fmt: skip
    assert rc == 0
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 2 * 2  # 2 cells x 2 protocols x SLM
    for col in ("agreement", "agreement_ci_low", "agreement_ci_high", "null_agreement",
                "excess_over_null", "iri_median_error"):  # fmt: skip
        assert col in df
    assert (df["agreement_ci_low"] <= df["agreement"]).all()
    assert (df["agreement"] <= df["agreement_ci_high"]).all()
    assert df[df.protocol == "iris"]["iri_median_error"].notna().all()
    assert df[df.protocol == "standard"]["iri_median_error"].isna().all()
    iris_rows = df[df.protocol == "iris"]
    for col in ("iri_front_agreement", "iri_back_agreement", "iri_back_hard_agreement",
                "iri_back_null_agreement", "null_iri_back_agreement"):
        assert iris_rows[col].between(0, 100).all()
        assert df[df.protocol == "standard"][col].isna().all()
    assert pd.read_parquet(out / "results.parquet").shape == df.shape
    html = (out / "report.html").read_text()
    assert "<img src=\"data:image/png;base64," in html and "excess over null" in html
    assert (out / "figures" / "profile.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["labelled"] and summary["data"]["test"] > 0
    # resumes: a second run computes nothing and gives the same table
    before = df.drop(columns="seconds")
    assert main(["compare", "timm:test_convnext", "timm:test_convnext", "--front-weights",
                 str(wa), "--back-weights", str(wb), "--data", str(folder), "--out", str(out),
                 "--quick", "--front-size", "32", "--back-size", "32", "--n-points", "2",
                 "--no-progress"]) == 0  # fmt: skip
    again = pd.read_csv(out / "results.csv").drop(columns="seconds")
    pd.testing.assert_frame_equal(before, again)


def test_compare_identical_model_scores_100(tmp_path, folder):
    """A model stitched into itself at the same point (least-squares init, no training)
    reproduces the back exactly: agreement 100, interval [100, 100]."""
    from stitchlab import models
    from stitchlab.data.user import load_user_data

    torch.manual_seed(0)
    m = models.create("small_cnn", num_classes=3, width=8)
    data = load_user_data(folder)
    x = torch.stack([data.stitch[i][0] for i in range(len(data.stitch))])
    y = torch.tensor([data.stitch[i][1] for i in range(len(data.stitch))])
    opt = torch.optim.Adam(m.parameters(), 0.01)
    for _ in range(30):  # a little training, so that the back's predictions vary
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    m.eval()
    path = models.save(m, tmp_path / "m.safetensors")
    s = CompareSettings.quick(front=str(path), back=str(path), data=str(folder),
                              points=("blocks.1",), epochs=0, protocols=("standard",),
                              null_seeds=1)  # fmt: skip
    df = run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    row = df.iloc[0]
    assert row["agreement"] == 100 and row["agreement_ci_low"] == 100
    assert len(set(m(x).argmax(1).tolist())) > 1
    # the null ran (a random front; on an easy colour task it can stitch well too)
    assert row["null_seeds"] == 1 and 0 <= row["null_agreement"] <= 100
    # the ceiling (the back into itself) is the same exact stitch: 100, so the normalised
    # score of the back against itself is 1 (its interval too)
    assert row["ceiling_agreement"] == 100 and row["ceiling_ci_low"] == 100
    assert row["null_agreement"] < 100 and not row["budget_limited"]
    assert row["normalised"] == 1
    assert row["normalised_ci_low"] == row["normalised_ci_high"] == 1


def test_compare_iri_seeds_give_each_stitch_seed_its_own_iris(tmp_path, folder):
    """iri_seeds=True: stitch seed k stitches on IRIs of random start k (two sets, two
    errors); the default shares seed 0's set. Switching it on reuses every stored run on
    start 0 (seed 0's IRI run, the standard runs, the null's) and computes only seed 1's
    IRI run; null fronts keep start 0."""
    from stitchlab import models

    torch.manual_seed(0)
    path = models.save(models.create("small_cnn", num_classes=3, width=8),
                       tmp_path / "m.safetensors")  # fmt: skip
    store = tmp_path / "store"

    def runs(iri_seeds, out):
        s = CompareSettings.quick(front=str(path), back=str(path), data=str(folder),
                                  points=("blocks.1",), seeds=2, null_seeds=1, epochs=1,
                                  iri_steps=5, iri_seeds=iri_seeds)  # fmt: skip
        lines = []
        df = run_compare(s, tmp_path / out, store=store, progress=False, echo=lines.append)
        per_run = pd.read_csv(tmp_path / out / "runs.csv")
        text = "\n".join(lines).splitlines()
        estimates[out] = next(x for x in text if x.strip().startswith("IRI sets"))
        assert any(x.startswith("estimate: ") and "about" in x for x in text)
        return df, per_run[per_run.protocol == "iris"]

    estimates = {}
    _, shared = runs(False, "shared")
    assert "   2 jobs, 0 stored, at most about" in estimates["shared"]
    stored = set((store / "compare").glob("*.json"))
    assert len(stored) == 2 * 5  # 2 protocols x (2 seeds + 1 null + 2 ceiling seeds)
    assert len(list((store / "iris").iterdir())) == 2  # the front's and the null's
    real = shared[~shared.null]
    assert real["iri_median_error"].nunique() == 1
    _, own = runs(True, "own")
    new = set((store / "compare").glob("*.json")) - stored
    assert len(new) == 2  # only seed 1's IRI run and its ceiling
    assert sorted(json.dumps(json.loads(x.read_text())["run"], sort_keys=True)
                  for x in new) == sorted(json.dumps(spec | {"n_init": 64}, sort_keys=True)
                                          for spec in ({
        "front_point": "blocks.1", "back_point": "blocks.1", "protocol": "iris",
        "objective": "slm", "null": False, "seed": 1}, {
        "front_point": "blocks.1", "back_point": "blocks.1", "protocol": "iris",
        "objective": "slm", "null": False, "ceiling": True, "seed": 1}))  # fmt: skip
    assert len(list((store / "iris").iterdir())) == 3  # + the front's start 1
    mine = own[~own.null]
    by_seed = dict(zip(mine["seed"], mine["iri_median_error"]))
    assert by_seed[0] == real["iri_median_error"].iloc[0] != by_seed[1]
    # the null front's IRIs are the same set either way
    assert own[own.null]["iri_median_error"].tolist() == shared[shared.null][
        "iri_median_error"].tolist()
    summary = json.loads((tmp_path / "own" / "summary.json").read_text())
    assert summary["settings"]["iri_seeds"] is True
    assert "own random start" in (tmp_path / "own" / "report.html").read_text()
    assert "every seed on one IRI set" in (tmp_path / "shared" / "report.html").read_text()
    with pytest.raises(TypeError):
        CompareSettings.quick(front=str(path), back=str(path), data=str(folder), iri_seeds=1)
    # the estimate leaves out the IRI sets already stored (keyed as the run keys them)
    assert "   1 job, 0 stored, at most about" in estimates["own"]
    for entry in (store / "compare").glob("*.json"):
        if json.loads(entry.read_text())["run"]["protocol"] == "iris":
            entry.unlink()
    runs(True, "again")
    assert "   3 jobs, 3 stored (" in estimates["again"]  # nothing left: no time


def test_compare_torchvision_vs_timm_different_inputs(tmp_path, folder):
    import torchvision

    tv = torchvision.models.resnet18(num_classes=3)
    torch.save(tv.state_dict(), tmp_path / "tv.pth")
    _, wb = _timm_weights(tmp_path, "test_convnext", 3, 2)
    s = CompareSettings.quick(front="torchvision:resnet18", back="timm:test_convnext",
                              front_weights=str(tmp_path / "tv.pth"), back_weights=str(wb),
                              data=str(folder), front_size=32, back_size=48, n_points=1,
                              protocols=("standard",), auto_init=False)  # fmt: skip
    lines = []
    df = run_compare(s, tmp_path / "o", progress=False, echo=lines.append)
    text = "\n".join(lines)
    assert "32x32, mean (0.485" in text and "48x48, mean (0.5, 0.5, 0.5)" in text
    assert "estimate:" in text
    assert df.iloc[0]["front_point"] == "layer4.1" and len(df) == 1


def test_compare_unlabelled_data_skips_hlm(tmp_path):
    from stitchlab import models

    g = torch.Generator().manual_seed(0)
    images = torch.rand(160, 3, 16, 16, generator=g)
    np.savez(tmp_path / "x.npz", images=(images * 255).byte().numpy())
    a = models.save(models.create("small_cnn", num_classes=4, width=8), tmp_path / "a.safetensors")
    torch.manual_seed(1)
    b = models.save(models.create("small_cnn", num_classes=4, width=8), tmp_path / "b.safetensors")
    s = CompareSettings.quick(front=str(a), back=str(b), data=str(tmp_path / "x.npz"),
                              objectives=("hlm", "slm", "dm", "fula"), n_points=1)  # fmt: skip
    df = run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    assert sorted(set(df["objective"])) == ["dm", "fula", "slm"]
    assert df["accuracy"].isna().all()
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert any("HLM" in x for x in summary["skipped"])


def test_compare_config_and_errors(tmp_path, folder):
    from stitchlab import models

    path = models.save(models.create("small_cnn", num_classes=3, width=8),
                       tmp_path / "m.safetensors")  # fmt: skip
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'name = "x"\n[compare]\nfront = "m.safetensors"\nback = "{path}"\n'
                   f'data = "{folder}"\npoints = ["blocks.3"]\nseeds = 1\nnull_seeds = 0\n'
                   'objectives = ["slm"]\nprotocols = ["standard"]\nn_stitch = 64\n'
                   'n_test = 64\nepochs = 1\n')  # fmt: skip
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--check"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    df = pd.read_csv(tmp_path / "o" / "results.csv")
    assert len(df) == 1 and df["null_agreement"].isna().all()
    with pytest.raises(TypeError, match="compare seeds must be int"):
        CompareSettings(front="a", back="b", data="d", seeds=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="objectives"):
        CompareSettings(front="a", back="b", data="d", objectives=("nope",))
    assert main(["compare", "timm:test_convnext", "timm:test_convnext", "--data", str(folder),
                 "--out", str(tmp_path / "e")]) == 2  # no weights, no --random-init


def test_compare_hf_folders(tmp_path, folder):
    """hf:FOLDER models (transformers, optional): the adapter reproduces the model's logits
    exactly and a ViT compares against a ResNet."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3)).eval()  # fmt: skip
    vit.save_pretrained(tmp_path / "vit")
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32},
                                               image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor.save_pretrained(tmp_path / "vit")
    res = transformers.ResNetForImageClassification(transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=3)).eval()  # fmt: skip
    res.save_pretrained(tmp_path / "res")
    src = load_model_source(f"hf:{tmp_path / 'vit'}")
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(src.model(x), vit(pixel_values=x).logits)
    assert src.points() == ["layers.0", "layers.1", "pre_logits"]
    assert src.input.size == (32, 32) and src.input.mean == (0.5, 0.5, 0.5)
    s = CompareSettings.quick(front=f"hf:{tmp_path / 'vit'}", back=f"hf:{tmp_path / 'res'}",
                              data=str(folder), n_points=2)  # fmt: skip
    df = run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    assert list(df["front_point"].unique()) == ["layers.1", "pre_logits"]
    assert df["agreement"].between(0, 100).all() and len(df) == 4


def test_compare_grid_draws_a_heat_map(tmp_path, folder):
    """points = "grid": every chosen front point into every chosen back point."""
    from stitchlab import models

    a = models.save(models.create("small_cnn", num_classes=3, width=8), tmp_path / "a.safetensors")
    torch.manual_seed(3)
    b = models.save(models.create("small_cnn", num_classes=3, width=8), tmp_path / "b.safetensors")
    s = CompareSettings.quick(front=str(a), back=str(b), data=str(folder), points="grid",
                              n_points=2, protocols=("standard",), null_seeds=0)  # fmt: skip
    df = run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    cells = set(zip(df["front_point"], df["back_point"]))
    assert cells == {(f, g) for f in ("blocks.1", "blocks.3") for g in ("blocks.1", "blocks.3")}
    assert (tmp_path / "o" / "figures" / "heatmap.png").stat().st_size > 1000
    assert "Every front point into every back point" in (tmp_path / "o" / "report.html").read_text()


def test_compare_speech_models_on_images_is_a_clear_error(tmp_path, folder):
    """Speech models read waveforms: an image folder is refused before anything runs (not a
    shape error from inside torch); tests/test_compare_audio.py compares them on audio."""
    from stitchlab import models

    path = models.save(models.create("wave_cnn"), tmp_path / "w.safetensors")
    s = CompareSettings.quick(front=str(path), back=str(path), data=str(folder))
    with pytest.raises(ValueError, match=r"No \.wav files in .*speech models read audio"):
        run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)


def test_compare_greyscale_models_see_grey_images(tmp_path, folder):
    """1-channel models (small_cnn in_channels=1) get the RGB images as grey (luma): an
    image of equal channels comes back as its level, and a model stitched into itself
    scores 100. (Before, every 1-channel model failed on the 3-channel images.)"""
    from stitchlab import models
    from stitchlab.models.sources import InputSpec, WithInput, for_channels

    torch.manual_seed(0)
    m = models.create("small_cnn", num_classes=3, width=8, in_channels=1).eval()
    spec = for_channels(InputSpec(), 1)
    assert spec.mean == (0.0,) and "grey" in spec.source
    wrapped = WithInput(torch.nn.Identity(), spec, (8, 8), [])
    level = torch.rand(2, 1, 8, 8)
    assert torch.allclose(wrapped(level.expand(-1, 3, -1, -1)), level, atol=1e-6)
    with pytest.raises(ValueError, match="one value per RGB channel"):
        for_channels(InputSpec(mean=(0.4, 0.5, 0.6)), 1)
    assert for_channels(InputSpec(), 3) == InputSpec()  # RGB models keep their pipeline
    # an RGB model given one mean and std broadcasts them over its channels (no luma)
    rgb = models.create("small_cnn", num_classes=3, width=8).eval()
    one = WithInput(rgb, InputSpec(mean=(0.5,), std=(0.25,)), (32, 32), [])
    assert not one.grey and one(torch.rand(2, 3, 32, 32)).shape == (2, 3)
    path = models.save(m, tmp_path / "grey.safetensors")
    s = CompareSettings.quick(front=str(path), back=str(path), data=str(folder),
                              points=("blocks.1",), epochs=0, protocols=("standard",),
                              null_seeds=0)  # fmt: skip
    said: list[str] = []
    df = run_compare(s, tmp_path / "o", progress=False, echo=said.append)
    assert df.iloc[0]["agreement"] == 100
    assert any("RGB to grey (luma)" in line for line in said)


# --- ceiling, budget-limited rows, under-determined least squares ----------------------


def test_images_needed_hand_computed():
    """Rows per image x images must reach the unknowns per output (input channels + 1)."""
    from stitchlab.fit import images_needed, least_squares_sizes
    from stitchlab.layers import ActivationSpec

    conv = ActivationSpec("conv", (16, 2, 2))  # 4 positions, 17 unknowns: ceil(17/4) = 5
    assert least_squares_sizes(conv, conv) == [(4, 17)]
    assert images_needed(conv, conv) == 5
    vec = ActivationSpec("vector", (32,))  # one row per image: 33
    assert images_needed(conv, vec) == 17 and images_needed(vec, vec) == 33
    wide = ActivationSpec("conv", (32, 8, 8))  # the back's 64 positions: ceil(17/64) = 1
    assert images_needed(conv, wide) == 1


def test_ridge_used_exactly_when_samples_below_dims_plus_one():
    """small_cnn width 8 on 8x8 images: blocks.3 is 32 channels at 1x1, so the least
    squares has 33 unknowns per output and one row per image; blocks.2 has 2x2 = 4
    positions and 33 unknowns: 9 images."""
    from stitchlab import Stitcher, models
    from stitchlab.fit import UNDERDETERMINED_RIDGE

    torch.manual_seed(0)
    m = models.create("small_cnn", num_classes=3, width=8).eval()
    x = torch.rand(40, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.TensorDataset(x, torch.zeros(40, dtype=torch.long))
    st = Stitcher(m, m, "blocks.3")
    for n, under in ((32, True), (33, False), (40, False)):
        init = st.initialise(data, samples=n)
        assert (init.samples, init.images_needed, init.underdetermined) == (n, 33, under)
        assert init.ridge == (UNDERDETERMINED_RIDGE if under else 0.0)
    assert st.initialise(data, samples=4, ridge=0.5).ridge == 0.5  # a given ridge stays
    st2 = Stitcher(m, m, "blocks.2")
    assert [st2.initialise(data, samples=n).underdetermined for n in (8, 9)] == [True, False]
    assert st2.initialise(data, samples=9).images_needed == 9


def test_normalised_score_known_values():
    from stitchlab.compare import normalised_score

    z, v, c = np.full((2, 50), 0.3), np.full((3, 50), 0.7), np.full((1, 50), 0.9)
    out = normalised_score(v, z, c, reps=100)
    assert out["normalised"] == pytest.approx(2 / 3)
    assert out["normalised_ci_low"] == pytest.approx(2 / 3)
    assert out["normalised_ci_high"] == pytest.approx(2 / 3)
    g = np.random.default_rng(0)
    v = (g.random((2, 400)) < 0.6).astype(float)
    out = normalised_score(v, np.full((1, 400), 0.2), np.full((1, 400), 0.8), reps=300)
    assert out["normalised"] == pytest.approx((100 * v.mean() - 20) / 60)
    assert out["normalised_ci_low"] < out["normalised"] < out["normalised_ci_high"]
    flat = normalised_score(v, np.full((1, 400), 0.8), np.full((1, 400), 0.8))
    assert math.isnan(flat["normalised"])  # no room between the floor and the ceiling
    # a ceiling above the null on average but not in every resample: no number at all
    # (hand-built: 2 of 40 images separate them, so some resamples draw neither)
    z, c = np.zeros((1, 40)), np.zeros((1, 40))
    c[0, :2] = 1.0
    v = np.full((1, 40), 0.025)
    assert c.mean() > z.mean()
    out = normalised_score(v, z, c, reps=500)
    assert all(math.isnan(out[k]) for k in ("normalised", "normalised_ci_low",
                                            "normalised_ci_high"))  # fmt: skip
    # the same images with a ceiling resolved in every resample: a finite ratio
    c[0, :30] = 1.0
    out = normalised_score(v, z, c, reps=500)
    assert out["normalised"] == pytest.approx(0.025 / 0.75)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):  # 36 stitching and 9 test images, 8x8
    return _write_folder(tmp_path_factory.mktemp("tiny"), n_per_class=15, size=8)


@pytest.fixture(scope="module")
def tinier_folder(tmp_path_factory):  # 24 stitching and 6 test images, 8x8
    return _write_folder(tmp_path_factory.mktemp("tinier"), n_per_class=10, size=8)


@pytest.fixture(scope="module")
def trained_small_cnn(tmp_path_factory, tiny_folder):
    """small_cnn width 8 trained a little on the 8x8 colour task (confident predictions)."""
    from stitchlab import models
    from stitchlab.data.user import load_user_data

    torch.manual_seed(0)
    m = models.create("small_cnn", num_classes=3, width=8)
    data = load_user_data(tiny_folder)
    x = torch.stack([data.stitch[i][0] for i in range(len(data.stitch))])
    y = torch.tensor([data.stitch[i][1] for i in range(len(data.stitch))])
    opt = torch.optim.Adam(m.parameters(), 0.01)
    for _ in range(40):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return models.save(m.eval(), tmp_path_factory.mktemp("m") / "m.safetensors")


def test_budget_limited_row_at_a_wide_point_is_flagged(tmp_path, tiny_folder, trained_small_cnn):
    """One least-squares image at blocks.3 (33 unknowns, one row per image), no training:
    the back into itself cannot reach the identity, so the row is flagged everywhere."""
    path = str(trained_small_cnn)
    s = CompareSettings.quick(front=path, back=path, data=str(tiny_folder), points=("blocks.3",),
                              protocols=("standard",), epochs=0, n_init=1, auto_init=False)
    lines = []
    df = run_compare(s, tmp_path / "o", progress=False, echo=lines.append)
    plan = "\n".join(lines)
    assert "blocks.3 -> blocks.3: 1 images, needs 33" in plan
    assert "blocks.3 -> blocks.3 (ceiling): 1 images, needs 33" in plan
    row = df.iloc[0]
    assert row["ceiling_agreement"] < 90 and row["budget_limited"]
    assert row["init_underdetermined"] and row["ceiling_init_underdetermined"]
    assert row["agreement"] == row["ceiling_agreement"]  # front == back: the same stitch
    assert "--n-init 33" in row["budget_note"]
    from stitchlab.compare import console_table

    text = console_table(df)
    assert "BUDGET-LIMITED" in text and "--n-init 33" in text
    csv = pd.read_csv(tmp_path / "o" / "results.csv")
    assert bool(csv["budget_limited"].iloc[0]) and "--n-init 33" in csv["budget_note"].iloc[0]
    assert "Budget-limited (ceiling below 90)" in (tmp_path / "o" / "report.html").read_text()
    runs = pd.read_csv(tmp_path / "o" / "runs.csv")
    assert runs["init_ridge"].tolist() == [1e-3] * 3  # the front, its null, the ceiling
    # enough images: determined, no ridge, and the identity is reached (no flag)
    s = CompareSettings.quick(front=path, back=path, data=str(tiny_folder), points=("blocks.3",),
                              protocols=("standard",), epochs=0, n_init=33, auto_init=False)
    lines = []
    row = run_compare(s, tmp_path / "p", progress=False, echo=lines.append).iloc[0]
    assert "under-determined" not in "\n".join(lines)
    assert row["ceiling_agreement"] > 99.9 and not row["budget_limited"]
    assert not row["ceiling_init_underdetermined"]


def test_quick_raises_images_or_leaves_a_point_out(tmp_path, tinier_folder,
                                                   trained_small_cnn):  # fmt: skip
    """--quick at blocks.3 of 8x8 images (33 unknowns, one row per image: 33 images) on a
    folder of 24 stitching images leaves the point out and says so; blocks.2 (4 positions:
    9 images) runs on quick's own counts."""
    path = str(trained_small_cnn)
    lines = []
    s = CompareSettings.quick(front=path, back=path, data=str(tinier_folder),
                              points=("blocks.2", "blocks.3"), protocols=("standard",),
                              epochs=0)  # fmt: skip
    df = run_compare(s, tmp_path / "o", progress=False, echo=lines.append)
    assert df["front_point"].tolist() == ["blocks.2"]
    text = "\n".join(lines)
    assert "left out: blocks.3 -> blocks.3: its least squares needs 33 images" in text
    assert "more than the 24 stitching images the data has" in text
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert any("blocks.3 -> blocks.3" in x for x in summary["skipped"])
    assert df.iloc[0]["n_init"] == 64 and not df.iloc[0]["init_underdetermined"]
    with pytest.raises(ValueError, match="needs more images than a quick run takes"):
        run_compare(CompareSettings.quick(front=path, back=path, data=str(tinier_folder),
                                          points=("blocks.3",), protocols=("standard",)),
                    tmp_path / "q", progress=False, echo=lambda _: None)  # fmt: skip


def test_budget_note_says_why():
    """Under 90: an under-determined least squares names the images it needs; an exact
    one says that training moved the ceiling away; otherwise the training budget."""
    from stitchlab.compare.tables import _budget_note

    s = CompareSettings(front="a", back="b", data="d", epochs=2, n_stitch=128)

    def runs(samples, needed, under, residual):
        return [{"init_samples": samples, "init_images_needed": needed,
                 "init_underdetermined": under, "init_residual": residual}]  # fmt: skip

    exact, rough = runs(64, 1, False, 0.0), runs(64, 1, False, 0.3)
    assert _budget_note(s, "p", 95.0, rough, rough) == ""
    note = _budget_note(s, "p", 84.2, exact, exact)
    assert "reproduced the back" in note and "2 epochs on 128 images" in note
    assert "does not reach the identity" in _budget_note(s, "p", 80.0, rough, rough)
    under = runs(1, 33, True, 0.0)
    note = _budget_note(s, "p", 40.0, under, under)
    assert "had 1 images for the 33" in note and "--n-init 33" in note
    assert "the front's least squares too" in note


def test_console_marks_rows_whose_iris_are_flagged():
    import pandas as pd

    from stitchlab.compare.tables import console_table

    row = dict(front_point="a", back_point="b", objective="slm", agreement=70.0,
               agreement_ci_low=68.0, agreement_ci_high=72.0, null_agreement=10.0,
               ceiling_agreement=90.0, normalised=0.75, normalised_ci_low=0.7,
               normalised_ci_high=0.8, excess_over_null=60.0, excess_ci_low=58.0,
               excess_ci_high=62.0, budget_limited=False, budget_note="",
               iri_median_error=0.666, iri_null_ratio=1.6)  # fmt: skip
    table = pd.DataFrame([row | {"protocol": "standard", "iri_flagged": False},
                          row | {"protocol": "iris", "iri_flagged": True}])  # fmt: skip
    lines = console_table(table).splitlines()
    assert "IRIS-FLAGGED" not in lines[1] and lines[2].endswith("IRIS-FLAGGED")
    assert lines[3].startswith("IRIs flagged")
    assert lines[4] == "  a -> b slm: IRI median error 0.666, 1.6x closer than another image"
    ok = table.assign(iri_flagged=False)
    assert "flagged" not in console_table(ok).lower()
