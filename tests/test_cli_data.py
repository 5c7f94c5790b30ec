"""`stitchlab stitch` and `stitchlab iris` read the user's data as `compare --data` does."""

import numpy as np
import pytest
import torch

from stitchlab import models
from stitchlab.cli import main
from stitchlab.data import shapes


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    ckpt = models.save(models.create("small_cnn", num_classes=4, width=4), root / "m.safetensors")
    x, y = shapes(80, seed=0, num_classes=4)
    np.savez(root / "d.npz", images=(x * 255).round().byte().numpy(), labels=y.numpy())
    return root, str(ckpt), str(root / "d.npz")


def test_stitch_reads_a_data_file(files, capsys):
    _, ckpt, data = files
    argv = ["stitch", ckpt, ckpt, "blocks.1", "--data", data, "--n", "40", "--n-test", "16",
            "--epochs", "0"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    agreement = next(line for line in out.splitlines() if line.split()[0] == "agreement")
    assert float(agreement.split()[1]) == pytest.approx(100.0, abs=1e-3)  # self-stitch


@pytest.mark.filterwarnings("ignore:IRIs")  # 2 steps: a flagged set, on purpose
def test_iris_reads_a_data_file(files, capsys):
    root, ckpt, data = files
    argv = ["iris", ckpt, "blocks.1", "--data", data, "--n", "16", "--steps", "2",
            "--cache", str(root / "iris")]  # fmt: skip
    assert main(argv) == 0
    assert "median" in capsys.readouterr().out
    assert list((root / "iris").iterdir())


def test_data_and_its_older_name_are_not_both_given(files, capsys):
    _, ckpt, data = files
    argv = ["stitch", ckpt, ckpt, "blocks.1", "--data", data, "--data-root", data]
    assert main(argv) == 2
    assert "--data only" in capsys.readouterr().err
