"""Model checkpoints: exact round trips, descriptions, and refusal of bad or unsafe files."""

import json
import os
import struct

import pytest
import torch

import stitchlab as sl
from stitchlab import models
from stitchlab.models import CheckpointError

ROUND_TRIP = {
    "small_cnn": dict(width=8),
    "resnet18": dict(width=8, stem="imagenet"),
    "vgg16_bn": dict(width=8),
    "vit_tiny_patch4_32": dict(width=48, depth=2),
}


def _perturbed(name, **options):
    """A model whose weights and BatchNorm statistics are not the initial ones."""
    torch.manual_seed(0)
    model = models.create(name, num_classes=7, **options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
        model.train()
        model(torch.rand(4, 3, 32, 32))
    return model.eval()


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_save_load_round_trips_exactly(tmp_path, name):
    model = _perturbed(name, **ROUND_TRIP[name])
    path = models.save(model, tmp_path / "m.safetensors", seed=3, data={"name": "shapes"})
    loaded = models.load(path)
    assert type(loaded) is type(model) and not loaded.training
    a, b = model.state_dict(), loaded.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
    assert sl.stitch_points(loaded) == sl.stitch_points(model)
    desc = loaded.stitchlab_description
    assert desc["architecture"] == name and desc["num_classes"] == 7
    assert desc["options"] == ROUND_TRIP[name] and desc["seed"] == 3
    assert models.describe(path) == desc and desc["data"] == {"name": "shapes"}


def test_description_must_be_json(tmp_path):
    model = models.create("small_cnn", width=4)
    with pytest.raises(TypeError, match="'bad' of type object cannot be written as JSON"):
        models.save(model, tmp_path / "m.safetensors", bad=object())
    path = models.save(model, tmp_path / "m.safetensors", acc=torch.tensor(91.5), p=tmp_path)
    assert models.describe(path)["acc"] == 91.5 and models.describe(path)["p"] == str(tmp_path)


def test_damaged_checkpoints_give_clear_errors(tmp_path):
    path = models.save(models.create("small_cnn", width=4), tmp_path / "m.safetensors")
    raw = path.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(raw[: len(raw) - 100])
    with pytest.raises(CheckpointError, match="damaged"):
        models.load(cut)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="could not be read safely"):
        models.load(junk, architecture="small_cnn")
    with pytest.raises(CheckpointError, match="does not exist"):
        models.load(tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match="is a folder"):
        models.load(tmp_path)


def _rewrite_description(path, **changes):
    """Rewrite a checkpoint's description in place (same tensors)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    desc = json.loads(header["__metadata__"]["stitchlab"])
    desc.update(changes)
    header["__metadata__"]["stitchlab"] = json.dumps(desc)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def test_mismatched_checkpoint_says_what_differs(tmp_path):
    path = models.save(models.create("small_cnn", width=8), tmp_path / "m.safetensors")
    _rewrite_description(path, options={"width": 16})
    with pytest.raises(CheckpointError, match=r"shape mismatch.*blocks\.0\.0\.weight.*width"):
        models.load(path)
    _rewrite_description(path, architecture="resnet18", options={"width": 8})
    with pytest.raises(CheckpointError, match="missing .*unexpected"):
        models.load(path)
    _rewrite_description(path, architecture="no_such_net")
    with pytest.raises(CheckpointError, match="Unknown model 'no_such_net'"):
        models.load(path)
    # arguments override the description
    assert isinstance(models.load(path, architecture="small_cnn", width=8), models.SmallCNN)


def test_external_pt_state_dict_loads_with_weights_only(tmp_path):
    model = _perturbed("small_cnn", width=8)
    path = tmp_path / "released.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    with pytest.raises(CheckpointError, match="does not say which architecture"):
        models.load(path)
    loaded = models.load(path, architecture="small_cnn", num_classes=7, width=8)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


class _RunsCode:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_malicious_checkpoint_is_refused_without_side_effects(tmp_path, suffix):
    marker = tmp_path / "pwned"
    weights = models.create("small_cnn", width=4).state_dict()
    path = tmp_path / f"evil{suffix}"
    torch.save({"state_dict": weights, "hook": _RunsCode(f"touch {marker}")}, path)
    with pytest.raises(CheckpointError, match="could not be read safely"):
        models.load(path, architecture="small_cnn", width=4)
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        models.describe(path)
    assert not marker.exists()


def test_classifier_head_of_each_family():
    assert models.classifier_head(models.create("resnet18", width=8))[0] == "fc"
    assert models.classifier_head(models.create("vgg16_bn", width=8))[0] == "classifier"
    assert models.classifier_head(models.create("vit_tiny_patch4_32", width=48, depth=1))[0] == (
        "head"
    )
    with pytest.raises(ValueError, match="no single Linear classifier"):
        models.classifier_head(models.create("vgg16_bn", width=8, head="torchvision"))
