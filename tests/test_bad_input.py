"""Bad input: no silent wrong numbers (non-finite values, ambiguous labels, mismatched IRIs
and damaged store entries stop with a clear error or are recomputed instead of becoming a
score), and stitchlab's own errors where torch's would come from deep inside."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import stitchlab as sl
from stitchlab import metrics, models
from stitchlab.data import shapes
from stitchlab.errors import DataError
from stitchlab.fit import TrainingConfig
from stitchlab.objectives import SLM, FuLA
from stitchlab.splitting import SplitError


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    a = models.create("small_cnn", width=8).eval()
    torch.manual_seed(1)
    b = models.create("small_cnn", width=8).eval()
    x, y = shapes(32, seed=0)
    return a, b, x, y


# --- metrics ---------------------------------------------------------------------------


def test_metrics_refuse_non_finite_logits_and_ambiguous_labels():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 2.0]])
    labels = torch.tensor([0, 1, 1, 1])
    assert metrics.accuracy(logits, labels) == 75.0  # the valid case, by hand
    bad = logits.clone()
    bad[1, 0] = float("nan")
    for score in (metrics.agreement, metrics.hard_agreement):
        with pytest.raises(ValueError, match=r"NaN or infinite values \(1 of 4 samples\)"):
            score(bad, logits)
    with pytest.raises(ValueError, match="NaN or infinite"):
        metrics.accuracy(bad, labels)
    # (N, 1) labels would broadcast against the N predictions: 0.0 or a wrong percentage
    with pytest.raises(ValueError, match=r"labels of shape \(4,\)"):
        metrics.accuracy(logits, labels[:, None])
    with pytest.raises(ValueError, match=r"labels of shape \(4,\)"):
        metrics.error_consistency(logits, logits, labels[:1])
    with pytest.raises(ValueError, match="integer class indices"):
        metrics.accuracy(logits, labels.float())


def test_cka_refuses_non_finite_representations():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 5, generator=g), torch.randn(16, 7, generator=g)
    assert math.isfinite(metrics.cka(x, y))
    for value in (float("nan"), float("inf")):
        bad = x.clone()
        bad[3, 2] = value
        with pytest.raises(ValueError, match="NaN or infinite"):  # was 0.0
            metrics.cka(bad, y)


def test_bootstrap_refuses_one_image_and_values_outside_0_1(pair):
    # over one image there is no interval: NaN bounds (were [a, a]), the score stays
    assert all(math.isnan(v) for v in metrics.agreement_interval(torch.randn(1, 3),
                                                                 torch.randn(1, 3)))  # fmt: skip
    a, b, x, y = pair
    one = sl.evaluate(a, (x[:1], y[:1]), b)
    assert 0 <= one["agreement"] <= 100 and math.isnan(one["agreement_ci_low"])
    with pytest.raises(ValueError, match="at least 2"):
        metrics.bootstrap_agreement(np.array([[0.5]]))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):  # was agreement 100 in [-300, 500]
        metrics.bootstrap_agreement(np.array([[5.0, -3.0]]))
    with pytest.raises(ValueError, match="NaN"):
        metrics.bootstrap_agreement(np.array([[0.5, np.nan]]))
    low, high = metrics.agreement_interval(torch.randn(8, 3), torch.randn(8, 3))
    assert 0 <= low < high <= 100


# --- data ------------------------------------------------------------------------------


class _Items(Dataset):
    def __init__(self, x, y, make):
        self.x, self.y, self.make = x, y, make

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.make(self.x[i], self.y[i])


def test_data_refuses_empty_sets_vector_labels_and_third_elements(pair):
    a, b, x, y = pair
    with pytest.raises(ValueError, match="the dataset is empty"):
        sl.evaluate(a, (x[:0], y[:0]), b)
    with pytest.raises(ValueError, match="the dataset is empty"):
        sl.generate_iris(a, "blocks.1", x[:0], steps=2)
    # labels of shape (1,): accuracy was 96.9 where the true value is 100
    vector = _Items(x, y, lambda img, lab: (img, lab[None]))
    with pytest.raises(DataError, match=r"label must be one class index"):
        sl.evaluate(a, vector, b)
    # a third element was read as the back model's target images in stitch training
    third = _Items(x, y, lambda img, lab: (img, lab, torch.zeros_like(img)))
    with pytest.raises(DataError, match="got 3 elements"):
        sl.stitch(a, b, "blocks.1", third, epochs=1)
    with pytest.raises(DataError, match="got 3 elements"):  # streamed, not cached
        sl.stitch(a, b, "blocks.1", third, epochs=1, cache=False)
    # elsewhere an extra element (an index, metadata) is ignored, as before
    indexed = _Items(x, y, lambda img, lab: (img, lab, 7))
    assert sl.evaluate(a, indexed, b) == sl.evaluate(a, (x, y), b)


def test_sixteen_bit_png_keeps_its_levels(tmp_path):
    """Pillow's RGB conversion clips 16-bit grey levels at 255 (every image white): a level
    of 32768 of 65535 must read as 128/255."""
    from PIL import Image

    from stitchlab.data.tensors import DataFileError
    from stitchlab.data.user import _read_rgb

    level = np.full((4, 4), 32768, dtype=np.uint16)
    Image.fromarray(level).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I;16")
    rgb = np.asarray(_read_rgb(tmp_path / "g16.png", "g16"))
    assert rgb.shape == (4, 4, 3) and (rgb == 128).all()
    Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32)).save(tmp_path / "f.tiff")
    with pytest.raises(DataFileError, match="32-bit float pixels"):
        _read_rgb(tmp_path / "f.tiff", "f")


# --- training --------------------------------------------------------------------------


def test_settings_refuse_non_finite_values(pair):
    a, b, x, y = pair
    for bad in ({"lr": math.inf}, {"lr": math.nan}, {"weight_decay": math.nan},
                {"ridge": math.inf}, {"gamma": math.nan}):  # fmt: skip
        with pytest.raises(ValueError, match="finite"):
            TrainingConfig.from_kwargs(**bad)
    for bad in ((2.0, -1.0), (math.nan,)):  # were accepted
        with pytest.raises(ValueError, match=r"milestones are fractions .* in \(0, 1\)"):
            TrainingConfig.from_kwargs(milestones=bad)
    with pytest.raises(ValueError, match="finite and positive"):
        SLM(temperature=math.nan)
    with pytest.raises(ValueError, match="FuLA weights must be finite"):
        FuLA(weights=[math.nan, 1.0, 1.0])
    from stitchlab.compare import CompareSettings

    with pytest.raises(ValueError, match="lr must be finite"):
        CompareSettings(front="a", back="b", data="d", lr=math.inf)
    with pytest.raises(ValueError, match="n_test must be >= 2"):
        CompareSettings(front="a", back="b", data="d", n_test=1)


def test_diverging_stitch_training_stops(pair):
    a, b, x, y = pair
    from stitchlab.fit import StitchDivergedError

    with pytest.raises(StitchDivergedError, match="stitch training diverged"):
        sl.stitch(a, b, "blocks.1", (x, y), epochs=2, lr=1e30, batch_size=8)


def test_nan_weights_are_refused_at_fitting_and_loading(pair, tmp_path):
    a, b, x, y = pair
    broken = models.create("small_cnn", width=8).eval()
    broken.load_state_dict(a.state_dict())
    with torch.no_grad():
        next(broken.parameters())[0, 0, 0, 0] = float("nan")
    # was an oneMKL parameter error and an internal assert from torch.linalg.lstsq
    with pytest.raises(ValueError, match="front model's activations .* NaN"):
        sl.stitch(broken, b, "blocks.1", (x, y), epochs=0)
    import gc

    gc.collect()  # the abandoned activation generator is closed: gradients stay on
    assert torch.is_grad_enabled()
    path = models.save(broken, tmp_path / "nan.safetensors")
    with pytest.raises(models.CheckpointError, match="NaN weights in 1 tensor"):
        models.load(path)


def test_diverging_model_training_stops_before_saving(tmp_path):
    from stitchlab.train import fast_recipe, train_model
    from stitchlab.train.loop import TrainingDivergedError

    x, y = shapes(64, seed=0)
    with pytest.raises(TrainingDivergedError, match="training diverged in epoch 1"):
        train_model(models.create("small_cnn", width=8), (x, y), out=tmp_path / "m",
                    recipe=fast_recipe(epochs=1, lr=1e30, batch_size=32))  # fmt: skip
    assert not list((tmp_path / "m").glob("*.safetensors"))  # nothing of it was saved


# --- IRIs ------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:IRIs")  # 3 steps: flagged sets, on purpose
def test_given_iris_must_match_the_stitch(pair, tmp_path):
    """A stored set made at another point, from another front or from other images, and
    IRIs that are not float images in the box, are refused (each was trained on)."""
    from stitchlab.iris import IRIError, quantise

    a, b, x, y = pair
    kw = {"steps": 3, "progress": False}
    at1 = sl.generate_iris_set(a, "blocks.1", (x, y), tmp_path / "c", **kw)
    at2 = sl.generate_iris_set(a, "blocks.2", (x, y), tmp_path / "c", **kw)
    of_b = sl.generate_iris_set(b, "blocks.1", (x, y), tmp_path / "c", **kw)
    other = sl.generate_iris_set(a, "blocks.1", shapes(32, seed=5), tmp_path / "c", **kw)
    run = {"epochs": 1}

    def given(iris):  # the protocol that trains on these IRIs (flagged: 3 steps)
        return sl.InvarianceAware(iris=iris, allow_flagged=True)

    sl.stitch(a, b, "blocks.1", (x, y), protocol=given(at1), **run)  # the matching set
    # at an affine point (the recipe's key records its Polyak rule) a matching set passes
    at0 = sl.generate_iris_set(a, "blocks.0", (x, y), tmp_path / "c", **kw)
    assert "affine_rule" in at0.meta["recipe"]
    sl.stitch(a, b, "blocks.0", (x, y), protocol=given(at0), **run)
    with pytest.raises(IRIError, match="another front model"):  # also inside a DataLoader
        loader = torch.utils.data.DataLoader(of_b)
        sl.stitch(a, b, "blocks.1", (x, y), protocol=given(loader), **run)
    with pytest.raises(IRIError, match="made at point 'blocks.2'"):
        sl.stitch(a, b, "blocks.1", (x, y), protocol=given(at2), **run)
    with pytest.raises(IRIError, match="another front model"):
        sl.stitch(a, b, "blocks.1", (x, y), protocol=given(of_b), **run)
    with pytest.raises(IRIError, match="other stitching images"):
        sl.stitch(a, b, "blocks.1", (x, y), protocol=given(other), **run)
    result = sl.generate_iris(a, "blocks.1", x, steps=3)
    with pytest.raises(ValueError, match="must be float images"):
        sl.stitch(a, b, "blocks.1", (x, y), protocol=given(quantise(result.iris)), **run)
    with pytest.raises(ValueError, match=r"pixel box \[0, 1\]"):
        sl.stitch(a, b, "blocks.1", (x, y), protocol=given(result.iris * 255), **run)
    sl.stitch(a, b, "blocks.1", (x, y), protocol=given(result), **run)  # an IRIResult: its own box


# --- compare's store -------------------------------------------------------------------


def test_compare_recomputes_a_damaged_stored_run(tmp_path):
    from stitchlab.compare import CompareSettings, run_compare

    torch.manual_seed(0)
    m = models.save(models.create("small_cnn", num_classes=4, width=8), tmp_path / "m.safetensors")
    x, y = shapes(96, seed=0, num_classes=4)
    np.savez(tmp_path / "d.npz", images=(x * 255).round().byte().numpy(), labels=y.numpy())
    s = CompareSettings.quick(front=str(m), back=str(m), data=str(tmp_path / "d.npz"),
                              points=("blocks.1",), epochs=0, protocols=("standard",),
                              null_seeds=0)  # fmt: skip
    first = run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    stored = sorted((tmp_path / "o" / "store" / "compare").glob("*.json"))
    assert len(stored) == 2  # the run and its ceiling (the back into itself)
    stored[0].write_text(stored[0].read_text()[:40])  # truncated
    said: list[str] = []
    again = run_compare(s, tmp_path / "o", progress=False, echo=said.append)
    assert any("is damaged" in line and "computing it again" in line for line in said)
    assert again["agreement"].tolist() == first["agreement"].tolist() == [100.0]
    # a run stored with NaN agreements (as NaN logits gave before) is computed again too
    from stitchlab.compare.jobs import _pack
    from stitchlab.store import read_json, write_json

    entry = read_json(stored[0])
    write_json(stored[0], entry | {"values": _pack(torch.full((entry["n"],), math.nan))})
    said.clear()
    third = run_compare(s, tmp_path / "o", progress=False, echo=said.append)
    assert any("not all numbers in [0, 1]" in line for line in said)
    assert third["agreement"].tolist() == [100.0]


# --- clear errors instead of torch's ---------------------------------------------------


def test_clear_errors_for_unusual_models_settings_and_tables(pair, tmp_path):
    a, b, x, y = pair

    class Functional(torch.nn.Module):  # parameters, but no submodule calls to cut at
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 3, 3, 3))

        def forward(self, x):
            return torch.nn.functional.conv2d(x, self.w).mean((2, 3))

    with pytest.raises(SplitError, match="has no stitch points"):
        sl.split(Functional(), "c1")
    # a wrong layout override is named as such, not blamed on the images
    with pytest.raises(SplitError, match="layout 'NC' given for 'blocks.1'"):
        sl.stitch(a, b, "blocks.1", (x, y), epochs=0, layouts={"blocks.1": "NC"})
    # images of two sizes in one batch: was torch's "stack expects each tensor ..."
    mixed = _Items(x, y, lambda img, lab: (img if int(lab) % 2 else img[:, :16, :16], lab))
    with pytest.raises(DataError, match="the images differ in shape"):
        sl.evaluate(a, mixed, b)
    with pytest.raises(ValueError, match="step_size must be finite"):
        sl.IRIRecipe.from_kwargs(step_size=math.nan)
    # stitchlab report on a compare folder says that compare wrote its own report
    from stitchlab.report.inputs import ReportInputError, load_results

    (tmp_path / "results.csv").write_text("front_point,back_point,objective\nnet.a,net.b,slm\n")
    with pytest.raises(ReportInputError, match="stitchlab compare, which wrote its own"):
        load_results(tmp_path / "results.csv")


def test_layers_reads_a_greyscale_models_channels(tmp_path, capsys):
    from stitchlab.cli import main

    grey = models.create("small_cnn", width=8, in_channels=1)
    path = models.save(grey, tmp_path / "g.safetensors")
    assert main(["layers", str(path)]) == 0
    assert "input 1x32x32" in capsys.readouterr().out
    assert main(["layers", str(path), "--input-size", "0"]) == 2  # was silently 32


@pytest.mark.filterwarnings("ignore:IRIs")
def test_iri_set_metadata_must_agree_with_its_chunks(pair, tmp_path):
    """Hand-edited metadata with a valid checksum: a wrong count (was 20 items over 32
    labels), chunk_size 0 (was a ZeroDivisionError) or no recipe (was a KeyError)."""
    from stitchlab.iris import IRIError, IRISet
    from stitchlab.store import read_json, write_json

    a, b, x, y = pair
    made = sl.generate_iris_set(a, "blocks.1", (x, y), tmp_path / "c", steps=2, progress=False)
    meta = read_json(made.root / "meta.json")
    assert len(IRISet(made.root)) == 32
    for edit, why in (({"n": 20}, "holds 32 IRIs where its metadata says 20"),
                      ({"chunk_size": 0}, "chunk_size and n must be >= 1"),
                      ({"recipe": None}, "not what generate_iris_set writes")):  # fmt: skip
        write_json(made.root / "meta.json", meta | edit)
        with pytest.raises(IRIError, match=why):
            IRISet(made.root)


def test_waveforms_laid_out_time_first_are_refused(tmp_path):
    """(N, T, C) arrays, as soundfile reads them, were averaged over T as if it were the
    channels: every clip became silence and compare reported 100% agreement."""
    from stitchlab.data.tensors import DataFileError
    from stitchlab.data.user import load_user_data

    t = np.linspace(0, 1, 800, dtype=np.float32)
    tones = np.stack([0.5 * np.sin(2 * np.pi * (200 + 50 * k) * t) for k in range(12)])
    labels = np.arange(12) % 3
    np.savez(tmp_path / "ntc.npz", waveforms=np.stack([tones, tones], 2), labels=labels,
             sample_rate=np.array(800))  # fmt: skip
    with pytest.raises(DataFileError, match=r"probably \(N, T, channels\)"):
        load_user_data(tmp_path / "ntc.npz", n_test=4)
    np.savez(tmp_path / "nct.npz", waveforms=np.stack([tones, tones], 1), labels=labels,
             sample_rate=np.array(800))  # fmt: skip
    data = load_user_data(tmp_path / "nct.npz", n_test=4)
    clip = data.stitch[0][0]
    assert clip.shape == (1, 800) and float(clip.abs().max()) > 0.4
