"""Speech: espeak-ng spoken digits, the beep marker, audio models, 1-D stitching, audio IRIs."""

import math
import shutil
import time

import numpy as np
import pytest
import torch

import stitchlab as sl
from stitchlab import models
from stitchlab.data import speech
from stitchlab.data.speech import (
    Beeped,
    EspeakNotFoundError,
    SpeechSynthesisError,
    WaveformDataset,
    resample,
    spoken_digits,
)
from stitchlab.iris import IRIRecipe, dequantise, generate_iris, generate_iris_set, quantise
from stitchlab.layers import ActivationSpec, StitchLayer, fit_least_squares
from stitchlab.splitting import TracedModel

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="espeak-ng is not installed"
)
RATE = 8000


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[spec.argmax()])


def _speechlike(n: int, t: int, seed: int = 0) -> torch.Tensor:
    """Quiet harmonic bursts in [-1, 1] (stand-ins for speech where no espeak is needed)."""
    g = torch.Generator().manual_seed(seed)
    time_ = torch.arange(t) / RATE
    f0 = 100 + 150 * torch.rand(n, 1, 1, generator=g)
    x = sum(torch.sin(2 * math.pi * k * f0 * time_) / k for k in range(1, 6))
    env = torch.exp(-(((time_ - 0.5 * t / RATE) / 0.05) ** 2))
    return (0.3 * x * env + 0.01 * torch.randn(n, 1, t, generator=g)).clamp(-1, 1)


# ---------------------------------------------------------------------------
# Signal, data set and marker (no espeak-ng needed)


def test_resample_keeps_the_band_and_removes_what_would_alias():
    t = np.arange(22050) / 22050
    low = resample(np.sin(2 * np.pi * 1000 * t), 22050, RATE)
    assert len(low) == RATE and abs(_peak_hz(low, RATE) - 1000) <= 1
    assert np.sqrt(np.mean(low[200:-200] ** 2)) == pytest.approx(np.sqrt(0.5), rel=0.01)
    high = resample(np.sin(2 * np.pi * 6000 * t), 22050, RATE)  # above 4 kHz: must vanish
    assert np.abs(high[200:-200]).max() < 0.01


def test_missing_espeak_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EspeakNotFoundError, match="apt-get install espeak-ng") as info:
        spoken_digits(10, 10)
    assert "brew install espeak-ng" in str(info.value)
    assert isinstance(info.value, (SpeechSynthesisError, RuntimeError))


def test_waveform_dataset_items_and_pcm():
    pcm = torch.tensor([[[32767, -32767, 0, 16384]]], dtype=torch.int16).repeat(3, 1, 1)
    ds = WaveformDataset(pcm, [0, 1, 2], sample_rate=RATE, voices=["a", "b", "c"])
    x, y = ds[1]
    assert x.dtype == torch.float32 and x.shape == (1, 4) and y == 1
    torch.testing.assert_close(x[0, :3], torch.tensor([1.0, -1.0, 0.0]))
    assert ds.targets.tolist() == [0, 1, 2] and ds.num_classes == 3
    with pytest.raises(ValueError, match=r"\(N, C, T\)"):
        WaveformDataset(torch.zeros(3, 4), [0, 1, 2], sample_rate=RATE)


def test_beep_is_the_class_tone_and_rolled_is_the_next_class():
    labels = torch.arange(10)
    silent = WaveformDataset(torch.zeros(10, 1, RATE), labels, sample_rate=RATE)
    marked, rolled = Beeped(silent, seed=3), Beeped(silent, seed=3, rolled=True)
    for i in range(10):
        x, y = marked[i]
        assert y == i
        nz = x[0].nonzero().flatten()
        assert 790 <= len(nz) <= 800  # 100 ms at 8 kHz (the ramps' first samples are ~0)
        seg = x[0, nz[0] : nz[0] + 800].numpy()
        bin_hz = RATE / 800
        assert abs(_peak_hz(seg, RATE) - (500 + 300 * i)) <= bin_hz
        assert 0.28 <= float(x.abs().max()) <= 0.3 + 1e-6  # the tone's samples miss its peaks
        xr, _ = rolled[i]
        seg_r = xr[0, xr[0].nonzero()[0, 0] :][:800].numpy()
        assert abs(_peak_hz(seg_r, RATE) - (500 + 300 * ((i + 1) % 10))) <= bin_hz
    torch.testing.assert_close(marked[4][0], Beeped(silent, seed=3)[4][0])  # deterministic
    starts = {int(marked[i][0][0].nonzero()[0, 0]) for i in range(10)}
    assert len(starts) > 5  # random positions
    fixed = Beeped(silent, position=0.0)
    assert all(int(fixed[i][0][0].nonzero()[0, 0]) <= 1 for i in range(10))
    loud = WaveformDataset(torch.full((10, 1, RATE), 0.9), labels, sample_rate=RATE)
    assert float(Beeped(loud)[0][0].max()) <= 1.0  # clipped to the box
    with pytest.raises(ValueError, match="Nyquist"):
        Beeped(silent, step=500.0)


def test_random_class_beep_is_independent_of_the_label():
    n = 400
    labels = torch.arange(n) % 10
    silent = WaveformDataset(torch.zeros(n, 1, RATE // 4), labels, sample_rate=RATE)
    coded, rand = Beeped(silent, seed=5), Beeped(silent, seed=5, random_class=True)
    tones = torch.tensor([rand.beep(i, int(labels[i]), RATE // 4)[0] for i in range(n)])
    assert set(tones.tolist()) == set(range(10))
    assert float((tones == labels).float().mean()) < 0.2  # chance is 0.1
    for i in range(5):  # the same position as the class-coded beep; the drawn tone
        x, _ = rand[i]
        assert int(x[0].nonzero()[0, 0]) == int(coded[i][0][0].nonzero()[0, 0])
        seg = x[0, x[0].nonzero()[0, 0] :][:800].numpy()
        assert abs(_peak_hz(seg, RATE) - (500 + 300 * int(tones[i]))) <= RATE / 800
    with pytest.raises(ValueError, match="exclude"):
        Beeped(silent, rolled=True, random_class=True)


# ---------------------------------------------------------------------------
# Models and 1-D stitching


@pytest.mark.parametrize(("name", "size", "layout"), [("mel_cnn", 98_508, "NCHW"),
                                                       ("wave_cnn", 25_098, "NCL")])  # fmt: skip
def test_audio_models_split_exactly_at_every_point(name, size, layout):
    torch.manual_seed(0)
    model = models.create(name).eval()
    assert sum(p.numel() for p in model.parameters()) == size
    x = _speechlike(3, RATE)
    with torch.no_grad():
        ref = model(x)
        for point in model.stitchlab_points:
            front, back = sl.split(model, point)
            torch.testing.assert_close(back(front(x)), ref, rtol=0, atol=0)
    fmt = TracedModel(model).formats(x[:2], model.stitchlab_points)
    assert {f.spec.layout for f in fmt.values()} == {layout}
    assert fmt["blocks.0"].spec.channels == 32


def test_audio_models_round_trip_through_checkpoints(tmp_path):
    torch.manual_seed(0)
    x = _speechlike(2, RATE // 4)
    for name in ("mel_cnn", "wave_cnn"):
        model = models.create(name, width=8).eval()
        back = models.load(models.save(model, tmp_path / f"{name}.safetensors")).eval()
        with torch.no_grad():
            torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)


def test_log_mel_dft_is_the_hann_stft_by_hand_and_matches_torch_stft():
    from stitchlab.models.audio import LogMel, dft_kernels

    # by hand: a cosine at bin 4 of a 16-point frame; the periodic Hann window
    # 0.5 - 0.5 cos(2 pi t / 16) spreads it over bins 3, 4, 5 as 16 * (-1/4, 1/2, -1/4) / 2
    n = 16
    frame = torch.cos(2 * math.pi * 4 * torch.arange(n) / n)
    spec = torch.nn.functional.conv1d(frame[None, None], dft_kernels(n))[0, :, 0]
    re, im = spec[: n // 2 + 1], spec[n // 2 + 1 :]
    expected = torch.zeros(n // 2 + 1)
    expected[3], expected[4], expected[5] = -2.0, 4.0, -2.0
    torch.testing.assert_close(re, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(im, torch.zeros_like(im), rtol=0, atol=1e-5)
    # against torch.stft (centred, reflect padding): values and the input gradient
    front = LogMel()
    x = _speechlike(3, RATE, seed=1).requires_grad_(True)
    stft = torch.stft(x.flatten(0, 1), 256, 80, window=torch.hann_window(256), center=True,
                      return_complex=True)  # fmt: skip
    ref = torch.log(front.filters @ stft.abs().pow(2) + 1e-6).unsqueeze(1)
    out = front(x)
    assert out.shape == ref.shape == (3, 1, 40, 101)
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-5)
    (g,) = torch.autograd.grad(out.sum(), x)
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-4 * g_ref.abs().max().item())


def test_wave_cnn_stitched_to_itself_at_conv1d_points_is_exact():
    torch.manual_seed(0)
    model = models.create("wave_cnn", width=8).eval()
    x, y = _speechlike(48, RATE // 2), torch.randint(0, 10, (48,))
    for point in ("blocks.0", "blocks.2"):
        s = sl.stitch(model, model, point, (x, y), epochs=0)
        assert s.stitch_layer.src.layout == s.stitch_layer.dst.layout == "NCL"
        assert sl.evaluate(s, (x, y), model)["agreement"] == 100.0


def test_mel_to_wave_stitches_over_channels_per_time_step():
    torch.manual_seed(0)
    mel, wave = models.create("mel_cnn", width=8).eval(), models.create("wave_cnn", width=8).eval()
    x, y = _speechlike(16, RATE // 2), torch.randint(0, 10, (16,))
    s = sl.stitch(mel, wave, "blocks.1", (x, y), back_point="blocks.1", epochs=0)
    src, dst = s.stitch_layer.src, s.stitch_layer.dst
    assert (src.layout, dst.layout) == ("NCHW", "NCL")
    assert s(x[:2]).shape == (2, 10)
    s = sl.stitch(wave, mel, "blocks.2", (x, y), back_point="blocks.2", epochs=0)
    assert s(x[:2]).shape == (2, 10)
    # a map to a sequence: the height is averaged, then a Linear over channels per step
    a = torch.randn(20, 4, 5, 30)
    w, b = torch.randn(6, 4), torch.randn(6)
    z = torch.einsum("nchl,oc->nol", a, w) / 5 + b[None, :, None]
    layer = StitchLayer(ActivationSpec.of(a), ActivationSpec.of(z, layout="NCL"))
    assert fit_least_squares(layer, [(a, z)]) < 1e-4
    torch.testing.assert_close(layer(a), z, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# IRIs of waveforms


def test_recipe_fields_and_keys():
    rec = IRIRecipe.from_kwargs(preset="audio")
    assert (rec.start, rec.precision, rec.box, rec.start_scale) == (
        "scaled_noise", "int16", (-1.0, 1.0), 0.003)  # fmt: skip
    assert rec.key_dict()["precision"] == "int16" and rec.key_dict()["start_scale"] == 0.003
    # a stored set's key names every field (store format 4)
    assert IRIRecipe().key_dict()["precision"] == "uint8"
    assert IRIRecipe().key_dict()["start_scale"] == 0.003
    assert IRIRecipe().as_dict()["precision"] == "uint8"
    with pytest.raises(TypeError, match="precision"):
        IRIRecipe.from_kwargs(precision="int8")
    with pytest.raises(ValueError, match="start_scale"):
        IRIRecipe.from_kwargs(start_scale=0.0)


def test_quantisation_steps_are_two_over_255_and_two_over_65535():
    x = torch.rand(1000) * 2 - 1
    box = (-1.0, 1.0)
    e8 = (dequantise(quantise(x, box), box) - x).abs().max()
    e16 = (dequantise(quantise(x, box, "int16"), box) - x).abs().max()
    assert quantise(x, box, "int16").dtype == torch.int16
    assert 0.9 / 255 < float(e8) <= 1 / 255 + 1e-6
    assert float(e16) <= 1 / 65535 + 1e-6
    assert torch.equal(dequantise(quantise(x, box, "float32"), box), x)
    ends = torch.tensor([-1.0, 1.0])
    torch.testing.assert_close(dequantise(quantise(ends, box, "int16"), box), ends)


def test_scaled_noise_start_is_quiet_gaussian_in_the_box():
    x = _speechlike(8, 2000)
    model = models.create("wave_cnn", width=8).eval()
    kw = dict(steps=0, start="scaled_noise", box=(-1.0, 1.0), precision="float32")
    r = generate_iris(model, "blocks.0", x, **kw)
    assert abs(float(r.iris.mean())) < 3e-4
    assert float(r.iris.std()) == pytest.approx(0.003, rel=0.05)
    loud = generate_iris(model, "blocks.0", x, **{**kw, "start_scale": 0.9})
    assert (
        float(loud.iris.abs().max()) <= 1.0 and float((loud.iris.abs() == 1).float().mean()) > 0.1
    )
    centred = generate_iris(model, "blocks.0", (x + 1) / 2, steps=0, start="scaled_noise",
                            precision="float32")  # fmt: skip
    assert float(centred.iris.mean()) == pytest.approx(0.5, abs=3e-4)  # the box (0, 1)


def test_audio_iris_converge_and_int16_storage_beats_uint8(tmp_path):
    torch.manual_seed(0)
    model = models.create("wave_cnn", width=8).eval()
    x, y = _speechlike(8, 1000), torch.randint(0, 10, (8,))
    # few large steps (a mechanics test; the preset's 300 small ones converge further)
    audio = dict(preset="audio", steps=40, step_size=0.05, final_step_size=0.002, batch_size=8)
    start = generate_iris(model, "blocks.1", x, **{**audio, "steps": 0})
    r16 = generate_iris(model, "blocks.1", x, **audio)
    assert float(r16.rel_error.median()) < 0.5 * float(start.rel_error.median())
    assert float((r16.rel_error - r16.rel_error_float).abs().max()) < 0.01
    q = r16.quality()
    assert q.precision == "int16" and "stored as int16" in str(q)
    # stored: int16 chunks, the precision in the key and in the set's quality
    opts = dict(chunk_size=8, min_null_ratio=1.0, **audio)
    s16 = generate_iris_set(model, "blocks.1", (x, y), tmp_path, **opts)
    s8 = generate_iris_set(model, "blocks.1", (x, y), tmp_path, **opts, precision="uint8")
    assert s16.root != s8.root
    assert s16._chunk(0)["iris"].dtype == torch.int16 and s8._chunk(0)["iris"].dtype == torch.uint8
    assert s16.meta["recipe"]["precision"] == "int16" and s16.quality.precision == "int16"
    assert s8.quality.precision == "uint8" and "stored as" not in str(s8.quality)
    torch.testing.assert_close(s16.images(), r16.iris)
    torch.testing.assert_close(s16.rel_error, r16.rel_error)
    assert s16[3][0].shape == (1, 1000) and s16[3][1] == int(y[3])
    # the same optimisation, only the storage differs: 1/65535 vs 1/255 off the float IRI
    c16, c8 = s16._chunk(0), s8._chunk(0)
    torch.testing.assert_close(c16["rel_error_float"], c8["rel_error_float"])
    assert float((s16.images() - s8.images()).abs().max()) <= 1 / 255 + 1 / 65535 + 1e-6
    assert float(s16.rel_error.median()) < float(s8.rel_error.median())


# ---------------------------------------------------------------------------
# espeak-ng data


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    cache = tmp_path_factory.mktemp("speech")
    t0 = time.perf_counter()
    train, test = spoken_digits(20, 20, seed=0, cache=cache)
    return train, test, cache, time.perf_counter() - t0


@needs_espeak
def test_spoken_digits_shapes_range_labels_and_held_out_voices(digits):
    train, test, _, _ = digits
    for ds in (train, test):
        assert len(ds) == 20
        x, y = ds[0]
        assert x.shape == (1, RATE) and x.dtype == torch.float32 and isinstance(y, int)
        xs, ys = ds.tensors()
        assert float(xs.abs().max()) <= 1.0 and float(xs.abs().amax(-1).min()) > 0.1
        assert torch.bincount(ys, minlength=10).tolist() == [2] * 10
        assert ds.sample_rate == RATE and ds.classes[3] == "three"
    assert not set(train.voices) & set(test.voices)
    train_variants = {v.split("+")[1] for v in train.voices}
    test_variants = {v.split("+")[1] for v in test.voices}
    assert not train_variants & test_variants
    assert all(v.split("+")[0] in speech.ACCENTS for v in train.voices + test.voices)


@needs_espeak
def test_cache_is_reused_without_calling_espeak(digits, monkeypatch):
    train, test, cache, _ = digits
    assert len(list(cache.glob("spoken-*.safetensors"))) == 1

    def fail(*args, **kwargs):
        raise AssertionError("espeak-ng was called despite the cache")

    monkeypatch.setattr(speech, "_speak", fail)
    t0 = time.perf_counter()
    again, again_test = spoken_digits(20, 20, seed=0, cache=cache)
    assert time.perf_counter() - t0 < 2.0
    assert torch.equal(again.waveforms, train.waveforms)
    assert torch.equal(again_test.waveforms, test.waveforms)
    assert again.voices == train.voices
    with pytest.raises(AssertionError, match="despite the cache"):
        spoken_digits(20, 20, seed=1, cache=cache)  # other settings: generated anew


@needs_espeak
def test_generation_is_deterministic_and_group_calls_match_single_calls(digits):
    train, _, _, _ = digits
    fresh, _ = spoken_digits(20, 20, seed=0)  # no cache: the same bits
    assert torch.equal(fresh.waveforms, train.waveforms)
    # ten words in one call, cut at the silences, are the words of ten calls
    words, speeds, pitches = speech.DIGITS, range(110, 210, 10), range(15, 85, 7)
    group, rate = speech._speak_group("en-us+m3", words, speeds, pitches)
    assert rate == 22050 and len(group) == 10
    for w, s, p, x in zip(words, speeds, pitches, group):
        (one,), _ = speech._speak_group("en-us+m3", [w], [s], [p])
        assert abs(len(x) - len(one)) <= 0.05 * len(one), w


@needs_espeak
def test_spoken_digits_with_the_beep_marker(digits):
    train, _, cache, _ = digits
    marked, _ = spoken_digits(20, 20, seed=0, cache=cache, marker="beep",
                              marker_options={"position": 0.0})  # fmt: skip
    rolled, _ = spoken_digits(20, 20, seed=0, cache=cache, marker="beep", rolled=True,
                              marker_options={"position": 0.0})  # fmt: skip
    for i in range(0, 20, 3):
        x0, y = train[i]
        for ds, c in ((marked, y), (rolled, (y + 1) % 10)):
            x, label = ds[i]
            assert label == y
            diff = (x - x0)[0, :800].numpy()
            assert abs(_peak_hz(diff, RATE) - (500 + 300 * c)) <= RATE / 800


@needs_espeak
def test_unknown_voice_is_refused():
    with pytest.raises(SpeechSynthesisError, match="no voice 'en-xx'"):
        spoken_digits(10, 10, accents=("en-xx",))
