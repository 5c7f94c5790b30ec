"""stitchlab compare on speech models and audio: .wav folders and waveform arrays written by
hand into ``tmp_path`` (no espeak-ng needed), the in-network resampler, end to end runs."""

from __future__ import annotations

import json
import struct
import wave

import numpy as np
import pandas as pd
import pytest
import torch

from stitchlab import models
from stitchlab.cli import main
from stitchlab.compare import CompareSettings, run_compare
from stitchlab.data import DataFileError
from stitchlab.data.speech import PCM_SCALE, WaveformDataset, resample
from stitchlab.data.user import centre_padding, load_user_data, read_wav
from stitchlab.models.sources import AudioSpec, WithAudioInput, _Resample, load_model_source

RATE = 8000


def _wav(path, frames: bytes, rate: int = RATE, width: int = 2, channels: int = 1):
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(frames)
    return path


def _pcm16(x: np.ndarray) -> bytes:
    return np.round(np.clip(x, -1, 1) * PCM_SCALE).astype("<i2").tobytes()


def _tone_folder(root, rate=RATE, seconds=0.25, n=12, freqs=(300, 900, 2000), seed=0):
    """Class folders of noisy tones, one frequency per class (a learnable task)."""
    g = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    for k, f in enumerate(freqs):
        for i in range(n):
            f_i = f * (1 + 0.03 * g.standard_normal())
            noise = 0.02 * g.standard_normal(len(t))
            x = 0.4 * np.sin(2 * np.pi * f_i * t + g.uniform(0, 6)) + noise
            _wav(root / f"c{k}" / f"{i}.wav", _pcm16(x), rate)
    return root


# --- reading WAV files -----------------------------------------------------------------


def test_read_wav_scales_like_waveform_dataset(tmp_path):
    """16 bits: levels / 32767 (PCM_SCALE, as WaveformDataset reads int16), -32768 clipped
    to -1; 8 bits unsigned: (level - 128) / 127; stereo averaged; 24 and 32 bits."""
    levels = np.array([32767, -32767, 0, 16384, -32768, 1], "<i2")
    x, rate = read_wav(_wav(tmp_path / "a.wav", levels.tobytes(), 16000))
    assert rate == 16000 and x.dtype == np.float64
    np.testing.assert_array_equal(x, [1.0, -1.0, 0.0, 16384 / 32767, -1.0, 1 / 32767])
    ds = WaveformDataset(torch.from_numpy(levels[:4].copy()).view(1, 1, 4), [0], sample_rate=RATE)
    np.testing.assert_allclose(x[:4], ds[0][0][0].double().numpy(), rtol=0, atol=1e-7)
    x8, _ = read_wav(_wav(tmp_path / "b.wav", bytes([128, 255, 1, 0, 192]), width=1))
    np.testing.assert_array_equal(x8, [0.0, 1.0, -1.0, -1.0, 64 / 127])
    stereo = np.array([[100, 300], [-32767, 32767], [1000, 0]], "<i2")
    xs, _ = read_wav(_wav(tmp_path / "s.wav", stereo.tobytes(), channels=2))
    np.testing.assert_array_equal(xs, [200 / 32767, 0.0, 500 / 32767])
    v = np.array([8388607, -8388607, 4194304, -1], np.int64)
    b24 = np.stack([(v >> s) & 255 for s in (0, 8, 16)], 1).astype(np.uint8).tobytes()
    x24, _ = read_wav(_wav(tmp_path / "c.wav", b24, width=3))
    np.testing.assert_array_equal(x24, [1.0, -1.0, 4194304 / 8388607, -1 / 8388607])
    x32, _ = read_wav(_wav(tmp_path / "d.wav", np.array([2**31 - 1, -(2**30)], "<i4").tobytes(),
                           width=4))  # fmt: skip
    np.testing.assert_array_equal(x32, [1.0, -(2**30) / (2**31 - 1)])


def test_compressed_or_damaged_wav_is_refused_naming_the_file(tmp_path):
    # an IEEE float WAV (format tag 3): a valid file, but not integer PCM
    data = np.zeros(4, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, RATE, RATE * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    path = tmp_path / "c0" / "float.wav"
    path.parent.mkdir()
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    with pytest.raises(DataFileError, match=r"float\.wav.*uncompressed PCM.*ffmpeg"):
        read_wav(path)
    (tmp_path / "c1").mkdir()
    (tmp_path / "c1" / "junk.wav").write_bytes(b"not a wav file")
    with pytest.raises(DataFileError, match=r"junk\.wav"):
        read_wav(tmp_path / "c1" / "junk.wav")
    for i in range(4):  # a folder of good clips and the float one
        _wav(tmp_path / "mixed" / f"{i}.wav", _pcm16(np.zeros(10)))
    (tmp_path / "mixed" / "float.wav").write_bytes(path.read_bytes())
    with pytest.raises(DataFileError, match=r"float\.wav"):  # read when the data is loaded
        load_user_data(tmp_path / "mixed", sample_rate=RATE, samples=100)


# --- audio data ------------------------------------------------------------------------


def test_wav_folders_mirror_image_folders(tmp_path):
    for split, n in (("train", 3), ("test", 2)):
        for c in ("no", "yes"):
            for i in range(n):
                _wav(tmp_path / "tt" / split / c / f"{i}.wav", _pcm16(np.full(100, 0.5)))
    ud = load_user_data(tmp_path / "tt")
    assert (ud.modality, ud.kind, ud.classes, ud.image_size) == ("audio", "wav-folder",
                                                                 ("no", "yes"), None)  # fmt: skip
    assert (len(ud.stitch), len(ud.test), ud.sample_rate, ud.samples) == (6, 4, RATE, 100)
    assert isinstance(ud.stitch, WaveformDataset) and ud.item_shape == (1, 100)
    assert sorted(ud.test.targets.tolist()) == [0, 0, 1, 1] and "train/ and test/" in ud.split
    x, y = ud.stitch[0]
    assert x.dtype == torch.float32 and x.shape == (1, 100) and isinstance(y, int)
    # ROOT/<class>/*.wav: split stratified by fraction
    flat = _tone_folder(tmp_path / "flat", n=10, freqs=(300, 900))
    ud = load_user_data(flat, test_fraction=0.3, seed=1)
    assert torch.bincount(ud.test.targets).tolist() == [3, 3] and len(ud.stitch) == 14
    assert "fraction 0.3 of 20 clips" in ud.split and "stratified" in ud.split
    # loose files: unlabelled
    for i in range(5):
        _wav(tmp_path / "loose" / f"{i}.wav", _pcm16(np.zeros(50)))
    ud = load_user_data(tmp_path / "loose")
    assert not ud.labelled and ud.classes is None and set(ud.stitch.targets.tolist()) == {-1}


def test_wav_clips_are_resampled_and_centred(tmp_path):
    t = np.arange(16000) / 16000
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)
    for c in ("a", "b"):
        for i in range(3):
            _wav(tmp_path / c / f"{i}.wav", _pcm16(tone), 16000)
    ud = load_user_data(tmp_path, sample_rate=RATE)
    assert (ud.sample_rate, ud.samples) == (RATE, 8000)  # 1 s at 16 kHz -> 8000 samples
    assert "resampled from 16000 Hz to 8000 Hz" in ud.split
    expected = resample(read_wav(tmp_path / "a" / "0.wav")[0], 16000, RATE)
    torch.testing.assert_close(ud.stitch[0][0][0].double(), torch.from_numpy(expected),
                               rtol=0, atol=1e-6)  # fmt: skip
    short = load_user_data(tmp_path, sample_rate=RATE, samples=9000)  # padded: centred
    x = short.stitch[0][0][0]
    assert x[:500].abs().max() == 0 and x[-500:].abs().max() == 0
    torch.testing.assert_close(x[500:8500].double(), torch.from_numpy(expected), rtol=0,
                               atol=1e-6)  # fmt: skip
    crop = load_user_data(tmp_path, sample_rate=RATE, samples=1000)  # cropped: the middle
    middle = torch.from_numpy(expected[3500:4500])
    torch.testing.assert_close(crop.stitch[0][0][0].double(), middle, rtol=0, atol=1e-6)
    assert centre_padding(7, 10) == (1, 2) and centre_padding(10, 7) == (-1, -2)
    _wav(tmp_path / "a" / "odd.wav", _pcm16(tone[:100]), 22050)
    with pytest.raises(DataFileError, match="different sample rates.*sample_rate="):
        load_user_data(tmp_path)


def test_npz_and_safetensors_waveforms(tmp_path):
    from safetensors.torch import save_file

    g = np.random.default_rng(0)
    x = g.uniform(-0.5, 0.5, (20, 400)).astype(np.float32)
    y = np.arange(20) % 2
    np.savez(tmp_path / "w.npz", waveforms=x, labels=y, sample_rate=np.array(16000))
    ud = load_user_data(tmp_path / "w.npz", sample_rate=RATE, samples=200)  # read as audio
    assert (ud.modality, ud.sample_rate, ud.samples, ud.labelled) == ("audio", RATE, 200, True)
    assert len(ud.stitch) + len(ud.test) == 20
    assert sorted(ud.stitch.targets.tolist() + ud.test.targets.tolist()) == sorted(y.tolist())
    np.savez(tmp_path / "x.npz", x=x[:, None, :])  # (N, 1, T), no rate: the models' rate
    ud = load_user_data(tmp_path / "x.npz", audio=True, sample_rate=RATE, samples=400)
    k = int(ud.stitch.targets.numel())
    assert not ud.labelled and k == 16
    assert any(torch.equal(ud.stitch[0][0][0], torch.from_numpy(row)) for row in x)
    with pytest.raises(DataFileError, match="sample rate .* is not known"):
        load_user_data(tmp_path / "x.npz", audio=True)
    save_file({"x_train": torch.from_numpy(x[:12]), "x_test": torch.from_numpy(x[12:])},
              str(tmp_path / "w.safetensors"), metadata={"sample_rate": "8000"})  # fmt: skip
    ud = load_user_data(tmp_path / "w.safetensors")
    assert (ud.modality, len(ud.stitch), len(ud.test), ud.samples) == ("audio", 12, 8, 400)
    np.savez(tmp_path / "loud.npz", waveforms=3 * x)
    with pytest.raises(DataFileError, match=r"must lie in \[-1, 1\]"):
        load_user_data(tmp_path / "loud.npz", audio=True, sample_rate=RATE)


def test_audio_data_errors(tmp_path):
    from PIL import Image

    (tmp_path / "empty" / "c0").mkdir(parents=True)
    (tmp_path / "empty" / "c0" / "notes.txt").write_text("no audio here")
    with pytest.raises(DataFileError, match=r"No \.wav files in .*ROOT/<class>/\*\.wav"):
        load_user_data(tmp_path / "empty", audio=True)
    (tmp_path / "imgs" / "c0").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "imgs" / "c0" / "0.png")
    with pytest.raises(DataFileError, match=r"No \.wav files"):
        load_user_data(tmp_path / "imgs", audio=True)
    np.savez(tmp_path / "i.npz", images=np.zeros((4, 3, 8, 8), np.uint8))
    with pytest.raises(DataFileError, match="No waveforms in .*'waveforms' or 'audio' or 'x'"):
        load_user_data(tmp_path / "i.npz", audio=True, sample_rate=RATE)


# --- the audio pipeline inside the network ---------------------------------------------


@pytest.mark.parametrize(("rate_in", "rate_out", "length"),
                         [(16000, 8000, 1600), (8000, 16000, 800), (22050, 8000, 2205),
                          (8000, 12000, 777)])  # fmt: skip
def test_in_network_resampling_matches_speech_resample(rate_in, rate_out, length):
    x = np.random.default_rng(0).uniform(-1, 1, length)
    ref = resample(x, rate_in, rate_out)
    out = _Resample(rate_in, rate_out, length)(torch.from_numpy(x).float().view(1, 1, -1))
    assert out.shape == (1, 1, len(ref)) == (1, 1, length * rate_out // rate_in)
    np.testing.assert_allclose(out[0, 0].double().numpy(), ref, rtol=0, atol=2e-6)


def test_with_audio_input_resamples_then_centres_and_traces():
    import stitchlab as sl

    torch.manual_seed(0)
    net = models.create("wave_cnn", width=4).eval()
    x = torch.rand(3, 1, 2000) * 2 - 1
    same = WithAudioInput(net, AudioSpec(RATE, 2000), RATE, 2000, ["blocks.1"]).eval()
    x16 = torch.cat([x, x], -1)  # 4000 samples "at 16 kHz"
    with torch.no_grad():
        assert torch.equal(same(x), net(x))
        half = WithAudioInput(net, AudioSpec(RATE, 1500), 16000, 4000, ["blocks.1"]).eval()
        down = _Resample(16000, RATE, 4000)(x16)[..., 250:1750]  # 2000 samples, centre 1500
        torch.testing.assert_close(half(x16), net(down))
        front, back = sl.split(half, "net.blocks.1")  # traced through the resampler
        torch.testing.assert_close(back(front(x16)), net(down))
    src = load_model_source("mel_cnn", random_init=True, options={"sample_rate": 16000})
    assert src.modality == "audio" and src.input.sample_rate == 16000
    assert src.input.samples == 16000 and "16000 Hz" in str(src.input)


# --- compare end to end ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tones(tmp_path_factory):
    return _tone_folder(tmp_path_factory.mktemp("wavs"))


def _trained(name: str, data, steps: int = 10, seed: int = 1, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = models.create(name, num_classes=3, width=4, **options)
    x = torch.stack([data.stitch[i][0] for i in range(len(data.stitch))])
    y = torch.tensor([data.stitch[i][1] for i in range(len(data.stitch))])
    opt = torch.optim.Adam(m.parameters(), 0.02)
    for _ in range(steps):  # a little training, so that the predictions vary
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return m.eval()


def test_compare_mel_to_wave_end_to_end(tmp_path, tones):
    data = load_user_data(tones, sample_rate=RATE, samples=2000)
    mel = models.save(_trained("mel_cnn", data), tmp_path / "mel.safetensors")
    wav = models.save(_trained("wave_cnn", data, seed=0), tmp_path / "wave.safetensors")
    out = tmp_path / "out"
    rc = main(["compare", str(mel), str(wav), "--data", str(tones), "--out", str(out), "--quick",
               "--n-points", "2", "--clip-seconds", "0.25", "--iri-steps", "5",
               "--no-progress"])  # fmt: skip
    assert rc == 0
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 2 * 2 and set(df["front_point"]) == {"blocks.1", "blocks.3"}
    assert (df["agreement_ci_low"] <= df["agreement"]).all()
    assert (df["agreement"] <= df["agreement_ci_high"]).all()
    assert df[df.protocol == "iris"]["iri_median_error"].notna().all()
    assert df["null_agreement"].between(0, 100).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["modality"] == "audio" and "8000 Hz" in summary["front_input"]
    assert summary["iri_recipe"]["precision"] == "int16" and summary["iri_recipe"]["steps"] == 5
    assert "clips of 2000 samples" in (out / "report.html").read_text()
    assert (out / "figures" / "profile.png").stat().st_size > 1000
    # IRIs of waveforms: the audio preset (box (-1, 1), int16 storage)
    metas = [json.loads(p.read_text()) for p in (out / "store" / "iris").rglob("meta.json")]
    assert metas and all(m["recipe"]["precision"] == "int16" for m in metas)
    assert all(m["recipe"]["box"] == [-1.0, 1.0] for m in metas)


def test_compare_speech_model_to_itself_scores_100(tmp_path, tones):
    """A speech model stitched into itself at the same point (least-squares init, no
    training) reproduces the back exactly: agreement 100, interval [100, 100]."""
    data = load_user_data(tones, sample_rate=RATE, samples=2000)
    m = _trained("wave_cnn", data)
    path = models.save(m, tmp_path / "w.safetensors")
    s = CompareSettings.quick(front=str(path), back=str(path), data=str(tones),
                              points=("blocks.1",), epochs=0, protocols=("standard",),
                              clip_seconds=0.25)  # fmt: skip
    df = run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    row = df.iloc[0]
    assert row["agreement"] == 100 and row["agreement_ci_low"] == row["agreement_ci_high"] == 100
    x = torch.stack([data.test[i][0] for i in range(len(data.test))])
    with torch.no_grad():
        assert len(set(m(x).argmax(1).tolist())) > 1
    assert row["null_seeds"] == 1 and 0 <= row["null_agreement"] <= 100


def test_compare_models_at_different_rates(tmp_path, tones):
    """A wave CNN at 8 kHz into a mel CNN at 16 kHz: the data is read at 16 kHz and the
    front resamples it to 8 kHz inside the network (its IRIs are 16 kHz waveforms)."""
    wav = models.save(models.create("wave_cnn", num_classes=3, width=4), tmp_path / "w.safetensors")
    mel = models.save(models.create("mel_cnn", num_classes=3, width=4, sample_rate=16000),
                      tmp_path / "m.safetensors")  # fmt: skip
    lines: list[str] = []
    s = CompareSettings.quick(front=str(wav), back=str(mel), data=str(tones), n_points=1,
                              clip_seconds=0.25, iri_steps=5, protocols=("iris",))  # fmt: skip
    df = run_compare(s, tmp_path / "o", progress=False, echo=lines.append)
    text = "\n".join(lines)
    assert "2000 samples (0.25 s) at 8000 Hz" in text  # the front's own pipeline
    assert "4000 samples (0.25 s) at 16000 Hz" in text  # the back's
    assert "clips of 4000 samples (0.25 s) at 16000 Hz" in text and "resampled from 8000" in text
    assert len(df) == 1 and df["agreement"].between(0, 100).all()
    with pytest.raises(ValueError, match="reads 8000 Hz audio .* --front-rate"):
        run_compare(CompareSettings.quick(front=str(wav), back=str(mel), data=str(tones),
                                          front_rate=16000), tmp_path / "e")  # fmt: skip


def test_compare_refuses_mixed_modalities(tmp_path, tones):
    img = models.save(models.create("small_cnn", num_classes=3, width=4), tmp_path / "i.st")
    wav = models.save(models.create("wave_cnn", num_classes=3, width=4), tmp_path / "w.st")
    s = CompareSettings.quick(front=str(img), back=str(wav), data=str(tones))
    with pytest.raises(ValueError, match="speech model .* and .* an image model"):
        run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    s = CompareSettings.quick(front=str(img), back=str(img), data=str(tones))
    with pytest.raises(ValueError, match="holds audio clips, but .* image models"):
        run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    s = CompareSettings.quick(front=str(wav), back=str(wav), data=str(tones), front_size=32)
    with pytest.raises(ValueError, match="front_size: image options"):
        run_compare(s, tmp_path / "o", progress=False, echo=lambda _: None)
    assert main(["compare", "small_cnn", "wave_cnn", "--random-init", "--data", str(tones),
                 "--out", str(tmp_path / "c")]) == 2  # fmt: skip
    assert CompareSettings(front="a", back="b", data="d", clip_seconds=1).clip_seconds == 1
    with pytest.raises(ValueError, match="front_rate must be > 0"):
        CompareSettings(front="a", back="b", data="d", front_rate=0)


def test_iri_recipe_follows_the_modality():
    from stitchlab.compare.sides import _recipe

    s = CompareSettings(front="a", back="b", data="d")
    audio, image = _recipe(s, "audio"), _recipe(s, "image")
    assert (audio.steps, audio.box, audio.precision, audio.start) == (
        300, (-1.0, 1.0), "int16", "scaled_noise")  # fmt: skip
    assert (image.steps, image.box, image.precision) == (270, (0.0, 1.0), "uint8")  # the default
    assert _recipe(CompareSettings.quick(front="a", back="b", data="d"), "audio").steps == 20
