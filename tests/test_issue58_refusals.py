"""What stops instead of becoming a number (issue 58): labels outside the model's
classes, a (features, logits) output, unknown devices, layouts of missing points,
hand-edited checkpoint descriptions, config mistakes --check used to pass, and
``stitchlab iris`` on a 1-channel model."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import stitchlab as sl
from stitchlab import models
from stitchlab._data import DataError
from stitchlab.experiments import ConfigError, load_config
from stitchlab.splitting import SplitError


def _data(n=24, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 16, 16, generator=g), torch.randint(0, classes, (n,), generator=g)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return models.create("small_cnn", num_classes=3, width=4).eval()


@pytest.mark.parametrize("objective", ["slm", "hlm"])
def test_stitch_refuses_labels_outside_the_classes(net, objective):
    x, y = _data()
    y[5] = 12  # a 3-class model: label 12 would count as a wrong prediction
    with pytest.raises(DataError, match=r"label 12 \(index 5\) is outside 0..2"):
        sl.stitch(net, net, "blocks.1", (x, y), objective=objective, epochs=1)


def test_evaluate_refuses_labels_outside_the_classes(net):
    x, y = _data()
    s = sl.stitch(net, net, "blocks.1", (x, y), epochs=0)
    y[7] = 3
    with pytest.raises(DataError, match=r"label 3 \(index 7\) is outside 0..2"):
        sl.evaluate(s, (x, y), net)


@pytest.mark.parametrize("device, message", [
    ("tpu", "device 'tpu' is none of cpu, cuda, mps"),
    ("gpu0", "none of cpu, cuda, mps"),
])  # fmt: skip
def test_unknown_device_is_refused_by_name(net, device, message):
    x, y = _data()
    with pytest.raises(ValueError, match=message):
        sl.stitch(net, net, "blocks.1", (x, y), epochs=0, device=device)
    with pytest.raises(ValueError, match=message):
        sl.Stitcher(net, net, "blocks.1", device=device)


def test_layouts_of_a_point_the_model_does_not_have_are_refused(net):
    x, y = _data()
    with pytest.raises(SplitError, match=r"layouts names 'block.1', which is no point.*"
                       r"did you mean 'blocks.1'"):  # fmt: skip
        sl.stitch(net, net, "blocks.1", (x, y), epochs=0, layouts={"block.1": "NCHW"})
    # two models, one mapping: each takes its own points; a name of neither is refused
    other = copy.deepcopy(net)
    s = sl.stitch(net, other, "blocks.1", (x, y), epochs=0, layouts={"blocks.1": "NCHW"})
    assert s.stitch_layer is not None
    with pytest.raises(SplitError, match=r"'block.1', which is a point of neither the front"):
        sl.stitch(net, other, "blocks.1", (x, y), epochs=0, layouts={"block.1": "NCHW"})


@pytest.mark.parametrize("field, value, message", [
    ("architecture", 5, "architecture must be a model name"),
    ("num_classes", "ten", "num_classes must be a whole number >= 1"),
    ("num_classes", 0, "num_classes must be a whole number >= 1"),
    ("options", [16], "options must be a table"),
])  # fmt: skip
def test_hand_edited_checkpoint_descriptions_are_refused(tmp_path, net, field, value, message):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = models.save(net, tmp_path / "m.safetensors")
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    desc = json.loads(meta["stitchlab"])
    desc[field] = value
    meta["stitchlab"] = json.dumps(desc)
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(models.CheckpointError, match=message):
        models.load(path)


@pytest.mark.parametrize("change, message", [
    (lambda c: c["iris"].update(preset="audio"), r"preset 'audio' is for waveforms"),
    (lambda c: c["models"]["back"].update(output=3), r"returns a single value; output=3"),
    (lambda c: c["models"]["other"].update(output=3), r"\[models.other\].*output=3"),
    (lambda c: c["models"]["back"]["options"].update(width=0), r"with empty layers"),
    (lambda c: c["models"]["back"].update(layouts={"nope": "NCHW"}),
     r"layouts names 'nope', which is no point"),
    (lambda c: c["data"].update(n_train="x"), "n_train must be an integer"),
    (lambda c: c["data"].update(n_train=0), "n_train must be a positive integer"),
])  # fmt: skip
def test_config_mistakes_are_caught_before_training(change, message):
    from test_experiments import TINY

    config = copy.deepcopy(TINY)
    change(config)
    with pytest.raises(ConfigError, match=message):
        load_config(config)


def test_iris_command_on_a_one_channel_model(tmp_path):
    from stitchlab.cli import main

    torch.manual_seed(0)
    grey = models.create("small_cnn", num_classes=3, width=4, in_channels=1)
    path = models.save(grey, tmp_path / "grey.safetensors")
    rc = main(["iris", str(path), "blocks.1", "--cache", str(tmp_path / "iris"), "--n", "4",
               "--steps", "1"])  # fmt: skip
    assert rc == 0
