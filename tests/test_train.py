"""Base-model training: recipes, standard / shortcut / SimCLR networks, resuming, the command."""

import argparse
import math

import pytest
import torch
from torch.utils.data import TensorDataset

import stitchlab as sl
from stitchlab import data, models
from stitchlab.train import (
    MODEL_FILE,
    STATE_FILE,
    Recipe,
    accuracy_on,
    evaluate_classifier,
    fast_recipe,
    paper_recipe,
    train_classifier,
    train_model,
)
from stitchlab.train.command import add_train_arguments, run_train_command
from stitchlab.train.simclr import _features, info_nce, linear_probe

FAST = fast_recipe(epochs=6, augment=False)


@pytest.fixture(scope="module")
def shapes16():
    """Grey shapes at 16x16: 2000 training and 500 test images."""
    return data.shapes(2000, seed=0, size=16), data.shapes(500, seed=1, size=16)


def _marked_sets(test, seed=0):
    ds = TensorDataset(*test)
    return {
        "clean": ds,
        "marked": data.Marked(ds, num_classes=10, seed=seed),
        "rolled": data.Marked(ds, num_classes=10, seed=seed, rolled=True),
    }


@pytest.fixture(scope="module")
def clean_run(shapes16, tmp_path_factory):
    train, test = shapes16
    torch.manual_seed(0)
    model = models.create("small_cnn", width=16)
    out = tmp_path_factory.mktemp("clean")
    result = train_model(model, train, recipe=FAST, test_data=_marked_sets(test), out=out)
    return result, out


def test_recipes_follow_the_paper():
    r = paper_recipe("resnet18")
    assert (r.optimizer, r.lr, r.momentum, r.nesterov, r.weight_decay) == (
        "sgd",
        0.1,
        0.9,
        True,
        1e-4,
    )
    assert (r.epochs, r.batch_size, r.augment) == (200, 128, True)
    assert r.milestone_epochs() == [66, 133]
    assert [r.lr_at(e) for e in (0, 65, 66, 132, 133, 199)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    )
    assert paper_recipe("vgg16_bn").lr == paper_recipe("vit_tiny_patch4_32").lr == 0.01
    assert paper_recipe("resnet18", epochs=30).milestone_epochs() == [10, 20]
    assert (r.adv_eps, r.adv_step, r.adv_steps, r.adv_fraction) == (8 / 255, 2 / 255, 10, 0.5)
    assert (r.temperature, r.projection_hidden, r.projection_dim) == (0.5, 1024, 128)
    f = fast_recipe(epochs=10)
    lrs = [f.lr_at(e, s, 10) for e in range(10) for s in range(10)]
    assert max(lrs) == pytest.approx(f.lr, rel=1e-3) and lrs.index(max(lrs)) in (29, 30)
    assert lrs[0] == pytest.approx(f.lr / 25) and lrs[-1] < f.lr / 1e3
    assert Recipe.from_dict(r.to_dict()) == r
    with pytest.raises(TypeError, match="Unknown recipe option.*epoch"):
        r.replace(epoch=3)
    with pytest.raises(ValueError, match="method must be one of"):
        Recipe(method="magic")


def test_standard_network_trains_well_above_chance_and_is_saved(clean_run, shapes16):
    result, out = clean_run
    assert result.evaluation["clean_accuracy"] > 65
    assert len(result.history) == 6 and result.history[-1]["loss"] < result.history[0]["loss"]
    loaded = models.load(out / MODEL_FILE)
    desc = loaded.stitchlab_description
    assert desc["evaluation"] == result.evaluation and desc["recipe"] == FAST.to_dict()
    assert desc["method"] == "standard" and desc["seed"] == 0 and len(desc["history"]) == 6
    x = shapes16[1][0][:16]
    with torch.no_grad():
        assert torch.equal(loaded(x), result.model(x))
    # a finished run is not trained again: resuming only re-evaluates and re-saves
    torch.manual_seed(1)
    again = train_model(models.create("small_cnn", width=16), shapes16[0], recipe=FAST, out=out)
    assert again.resumed_from == 6 and torch.equal(again.model(x), loaded(x))


def test_shortcut_network_relies_on_the_marker(shapes16, clean_run):
    train, test = shapes16
    marked_train = data.Marked(TensorDataset(*train), num_classes=10, seed=0)
    torch.manual_seed(0)
    model = models.create("small_cnn", width=16)
    result = train_model(model, marked_train, recipe=fast_recipe(epochs=4, augment=False))
    scores = evaluate_classifier(model, _marked_sets(test))
    assert scores["marked_accuracy"] > 95
    assert scores["rolled_accuracy"] < 15  # collapses when the markers move class
    assert scores["clean_accuracy"] < 50
    assert result.history[-1]["train_accuracy"] > 90
    clean = clean_run[0].evaluation
    assert (
        clean["rolled_accuracy"] > 60
        and abs(clean["rolled_accuracy"] - clean["clean_accuracy"]) < 8
    )


def test_adversarially_trained_network_is_more_robust(shapes16, clean_run):
    train, test = shapes16
    torch.manual_seed(0)
    model = models.create("small_cnn", width=16)
    recipe = fast_recipe(epochs=6, augment=False, method="adversarial", adv_steps=3)
    adv = train_model(model, train, recipe=recipe, test_data=test, robust="pgd", robust_samples=300)
    clean = evaluate_classifier(clean_run[0].model, test, robust="pgd", robust_samples=300)
    assert adv.evaluation["accuracy"] > 60
    assert adv.evaluation["robust_accuracy"] > clean["robust_accuracy"] + 15, (adv, clean)
    assert clean["robust_accuracy"] < clean["accuracy"] - 30


def test_resumed_run_ends_with_the_same_weights(tmp_path):
    x, y = data.shapes(192, seed=2, size=16)
    recipe = fast_recipe(epochs=3, method="adversarial", adv_steps=2, batch_size=64)

    def fresh(seed):
        torch.manual_seed(seed)
        return models.create("small_cnn", width=8)

    straight = train_model(fresh(0), (x, y), recipe=recipe, out=tmp_path / "a", seed=5)
    part = train_model(fresh(0), (x, y), recipe=recipe, out=tmp_path / "b", seed=5, until_epoch=1)
    assert part.path is None and not part.finished and (tmp_path / "b" / STATE_FILE).exists()
    assert not (tmp_path / "b" / MODEL_FILE).exists()
    resumed = train_model(fresh(9), (x, y), recipe=recipe, out=tmp_path / "b", seed=5)
    assert resumed.resumed_from == 1 and resumed.finished
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in resumed.history]
    with pytest.raises(sl.models.CheckpointError, match="different run.*lr"):
        train_model(fresh(0), (x, y), recipe=recipe.replace(lr=1e-2), out=tmp_path / "b", seed=5)
    (tmp_path / "b" / STATE_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(sl.models.CheckpointError, match="damaged"):
        train_model(fresh(0), (x, y), recipe=recipe, out=tmp_path / "b", seed=5)


def test_mixed_precision_and_channels_last_paths_run_on_cpu():
    x, y = data.shapes(64, seed=3, size=16)
    torch.manual_seed(0)
    model = models.create("small_cnn", width=8)
    recipe = fast_recipe(epochs=1, amp=True, channels_last=True, method="adversarial", adv_steps=1)
    result = train_model(model, (x, y), recipe=recipe)
    assert torch.isfinite(torch.tensor(result.history[0]["loss"]))
    assert model.blocks[0][0].weight.is_contiguous(memory_format=torch.channels_last)


def test_augmentation_is_applied_before_the_marker():
    x = torch.rand(8, 3, 16, 16)
    ds = data.Marked(TensorDataset(x, torch.arange(8) % 2), num_classes=2)
    from stitchlab.train.loop import Augmented, _with_transform

    flipped = _with_transform(data.subset(ds, 8, seed=0), lambda img: img.flip(-1))
    assert isinstance(flipped.dataset, data.Marked)
    assert isinstance(flipped.dataset.dataset, Augmented)
    i = flipped.indices[0]
    img, _ = flipped[0]
    colour, top, left = ds.marker(i, i % 2, 16, 16)
    assert torch.equal(img[:, top, left], colour)  # the marker is not flipped
    assert torch.equal(img[:, 15, 15], x[i, :, 15, 0]) or top >= 12  # the image is


def test_simclr_network_is_a_classifier_with_the_same_points(shapes16):
    (x, y), test = shapes16
    train = (x[:1500], y[:1500])
    torch.manual_seed(0)
    model = models.create("small_cnn", width=16)
    points = sl.stitch_points(model)
    # a linear classifier on the frozen random network: the baseline SimCLR must beat
    model.fc = torch.nn.Identity()
    feats, labels = _features(model, TensorDataset(*train), torch.device("cpu"))
    model.fc = linear_probe(feats, labels, 10, epochs=20)
    baseline = accuracy_on(model, test)
    torch.manual_seed(0)
    model = models.create("small_cnn", width=16)
    recipe = fast_recipe(epochs=3, method="simclr", lr=1e-2, linear_epochs=20)
    result = train_model(model, train, recipe=recipe, test_data=test)
    assert isinstance(model.fc, torch.nn.Linear) and model.fc.out_features == 10
    assert sl.stitch_points(model) == points
    front, back = sl.split(model, "blocks.2")
    with torch.no_grad():
        torch.testing.assert_close(back(front(test[0][:8])), model(test[0][:8]))
    assert result.evaluation["accuracy"] > max(30, baseline + 8), baseline
    assert result.history[-1]["train_accuracy"] > result.history[0]["train_accuracy"]


def test_info_nce_is_low_for_matching_views():
    z = torch.nn.functional.one_hot(torch.arange(8), 16).float() * 10
    matched = info_nce(z, z.clone(), temperature=0.05)
    shifted = info_nce(z, z.roll(1, 0), temperature=0.05)
    assert matched < 1e-6 and shifted > 15
    # at temperature 0.5 a matched pair among 14 orthogonal negatives: log(1 + 14 / e^2)
    assert float(info_nce(z, z, 0.5)) == pytest.approx(math.log1p(14 / math.e**2))


def test_train_classifier_keeps_its_signature():
    x, y = data.shapes(256, seed=0, size=16)
    torch.manual_seed(0)
    model = models.create("small_cnn", width=8)
    losses = train_classifier(model, (x, y), epochs=2, batch_size=64, lr=3e-3, seed=0)
    assert len(losses) == 2 and losses[1] < losses[0] and not model.training


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args(list(argv))


def test_train_command_shortcut_on_generated_data(tmp_path, capsys):
    common = [
        "--kind=shortcut",
        "--recipe=fast",
        "--epochs=2",
        "--image-size=16",
        "--train-size=400",
        "--test-size=200",
        "--width=8",
        "--no-progress",
        f"--out={tmp_path}",
    ]
    assert run_train_command(_args(*common, "--until-epoch=1")) == 0
    assert "stopped after epoch 1 of 2" in capsys.readouterr().out
    assert run_train_command(_args(*common)) == 0
    assert "saved" in capsys.readouterr().out
    desc = models.describe(tmp_path / MODEL_FILE)
    assert set(desc["evaluation"]) == {"clean_accuracy", "marked_accuracy", "rolled_accuracy"}
    assert desc["kind"] == "shortcut" and desc["data"]["marker"]["mode"] == "pixel+loc"
    assert desc["data"]["train_size"] == 400 and desc["options"] == {"width": 8}
    assert [h["epoch"] for h in desc["history"]] == [1, 2]


def test_train_command_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="pass --root"):
        run_train_command(_args("--data=cifar10", f"--out={tmp_path}"))
    with pytest.raises(ValueError, match="KEY=VALUE"):
        run_train_command(_args("--option=width", f"--out={tmp_path}"))
    with pytest.raises(data.DataFileError, match="No CIFAR-10 batches"):
        run_train_command(_args("--data=cifar10", f"--root={tmp_path}", f"--out={tmp_path}"))
