"""One test per finding of the reliability audit (issue 12): the tool stops with a clear
error, or recomputes, instead of reporting a wrong number."""

import copy
import json
import os
import pickle
import stat
import struct
import threading
import time

import numpy as np
import pytest
import torch

import stitchlab as sl
from stitchlab import models
from stitchlab.cli import main
from stitchlab.errors import DataError
from stitchlab.experiments import ConfigError, load_config, preflight, run_experiment
from stitchlab.store import DamagedEntry, lock, read_json, write_json
from test_experiments import TINY, _rows


@pytest.fixture
def cnn():
    torch.manual_seed(0)
    return models.create("small_cnn", width=8)


def _data(n=32, k=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 32, 32, generator=g), torch.randint(0, k, (n,), generator=g)


# ---------------------------------------------------------------------------
# the store: atomic, checksummed, locked, shareable


def test_store_json_is_checksummed_and_damage_names_the_file(tmp_path):
    path = tmp_path / "entry.json"
    write_json(path, {"agreement": 91.5, "point": "layer1.1"})
    assert read_json(path) == {"agreement": 91.5, "point": "layer1.1"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~_umask()  # not 0600
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # truncated
    with pytest.raises(DamagedEntry, match="entry.json.*not valid JSON"):
        read_json(path)
    path.write_text(text.replace("91.5", "99.5"))  # edited
    with pytest.raises(DamagedEntry, match="checksum mismatch"):
        read_json(path)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_lock_makes_a_second_writer_wait_then_reuse(tmp_path):
    result = tmp_path / "result.json"
    order = []
    holding = threading.Event()

    def first():
        with lock(tmp_path / ".lock"):
            order.append("first in")
            holding.set()  # the second writer starts only once the lock is held
            time.sleep(0.4)
            write_json(result, {"v": 1})
            order.append("first out")

    t = threading.Thread(target=first)
    t.start()
    assert holding.wait(30)
    t0 = time.monotonic()
    with lock(tmp_path / ".lock"):
        waited = time.monotonic() - t0
        order.append("second in")
        assert read_json(result) == {"v": 1}  # the second one finds the first one's result
    t.join()
    assert order == ["first in", "first out", "second in"] and waited > 0.2


def _generate_into(cache, conn):
    import torch

    from stitchlab import models
    from stitchlab.iris import generate_iris_set

    torch.manual_seed(0)
    model = models.create("small_cnn", width=4)
    x, y = _data(16)
    s = generate_iris_set(model, "blocks.1", (x, y), cache, steps=3, batch_size=8,
                          chunk_size=8, threshold=100.0, min_null_ratio=0.0)  # fmt: skip
    conn.send(s.images().sum().item())


def test_two_processes_generating_one_iri_set(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_generate_into, args=(tmp_path, c)) for _, c in pipes]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    sums = [r.recv() for r, _ in pipes]
    assert sums[0] == sums[1]
    sets = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(sets) == 1 and not list(sets[0].glob("*.tmp"))


def test_damaged_iri_metadata_is_named_and_regenerated(tmp_path, cnn):
    from stitchlab.iris import IRIError, IRISet, generate_iris_set

    x, y = _data(16)
    opts = dict(steps=3, batch_size=8, chunk_size=8, threshold=100.0, min_null_ratio=0.0)
    first = generate_iris_set(cnn, "blocks.1", (x, y), tmp_path, **opts)
    expected = first.images()
    meta = first.root / "meta.json"
    meta.write_text(meta.read_text()[:40])
    with pytest.raises(IRIError, match=r"meta\.json is damaged"):
        IRISet(first.root)
    with pytest.warns(UserWarning, match="damaged"):
        again = generate_iris_set(cnn, "blocks.1", (x, y), tmp_path, **opts)
    assert torch.equal(again.images(), expected)


# ---------------------------------------------------------------------------
# experiments: keyed by data content, damaged entries recomputed, nothing leaks


def _fake_cifar(root, seed):
    """A CIFAR-10 folder with 20 training and 10 test images of one seed."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i, name in enumerate([*(f"data_batch_{j}" for j in range(1, 6)), "test_batch"]):
        n = 4 if i < 5 else 10
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, n)]}  # fmt: skip
        (folder / name).write_bytes(pickle.dumps(batch))
    return root


def _cifar_config():
    config = copy.deepcopy(TINY)
    config["data"] = {"kind": "cifar10", "root": "$FAKE_CIFAR", "n_train": 20, "n_test": 10}
    config["pairs"] = {"identical": {"front": "back", "back": "back"}}
    config["models"] = {"back": config["models"]["back"]}
    config["stitch"].update(points=["blocks.1"], objectives=["dm"], protocols=["standard"],
                            n_stitch=20, n_init=20)  # fmt: skip
    return config


def test_store_keys_follow_the_data_not_the_config_text(tmp_path, monkeypatch):
    a, b = _fake_cifar(tmp_path / "a", 0), _fake_cifar(tmp_path / "b", 1)
    store = tmp_path / "store"
    monkeypatch.setenv("FAKE_CIFAR", str(a))
    first = run_experiment(_cifar_config(), tmp_path / "run_a", progress=False, store=store)
    monkeypatch.setenv("FAKE_CIFAR", str(b))  # same config text, other data
    second = run_experiment(_cifar_config(), tmp_path / "run_b", progress=False, store=store)
    assert first["models"]["run"] == 1 and second["models"]["run"] == 1
    assert second["stitch"]["run"] == second["stitch"]["total"]
    os.rename(a, tmp_path / "moved")  # the same data elsewhere: everything reused
    monkeypatch.setenv("FAKE_CIFAR", str(tmp_path / "moved"))
    third = run_experiment(_cifar_config(), tmp_path / "run_c", progress=False, store=store)
    assert third["models"]["run"] == 0 and third["stitch"]["run"] == 0


def test_check_refuses_unset_variables_and_missing_folders(tmp_path, monkeypatch):
    monkeypatch.delenv("FAKE_CIFAR", raising=False)
    exp = load_config(_cifar_config())
    with pytest.raises(ConfigError, match=r"variable \$FAKE_CIFAR is not set"):
        preflight(exp)
    monkeypatch.setenv("FAKE_CIFAR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="not a folder"):
        preflight(exp)
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "x"\n[data]\nkind = "cifar10"\nroot = "$FAKE_CIFAR"\nn_train = 5\n'
                   'n_test = 5\n[models.m]\narch = "small_cnn"\n[pairs.p]\nfront = "m"\n'
                   'back = "m"\n')  # fmt: skip
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--check"]) == 2


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["stitch"]["training"].update(lr="fast"), "lr must be float"),
        (lambda c: c["stitch"]["training"].update(epochs=8.5), "epochs must be int"),
        (lambda c: c["models"]["back"]["recipe"].update(epochs=8.5), "recipe: recipe epochs"),
        (lambda c: c["run"].update(threads=0), "[run] threads must be a positive integer"),
        (lambda c: c["run"].update(device="tpu"), "[run] device is 'tpu'"),
        (lambda c: c["stitch"].update(n_init=-1), "[stitch] n_init must be a positive"),
        (lambda c: c["stitch"].update(seeds=[0.5]), "[stitch] seeds entry must be an integer"),
        (lambda c: c["data"].update(test_iris=True), "test_iris is not supported"),
        (lambda c: c["pairs"]["identical"].update(back_point_map={}), "back_point_map is not"),
        (lambda c: c["iris"].update(steps=2.5), "IRI recipe steps must be int"),
        (lambda c: c["iris"].update(threshold="high"), "[iris] threshold must be a positive"),
    ],
)
def test_config_types_ranges_and_dead_keys(change, message):
    config = copy.deepcopy(TINY)
    change(config)
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert message in str(err.value)


def test_damaged_or_bogus_stitch_entries_are_recomputed(tmp_path):
    config = copy.deepcopy(TINY)
    config["stitch"].update(points=["blocks.1"], protocols=["standard"], objectives=["dm"])
    run_experiment(config, tmp_path, progress=False)
    before = _rows(tmp_path / "results.csv")
    entries = sorted((tmp_path / "store" / "stitch").glob("*.json"))
    entries[0].write_text(entries[0].read_text()[:30])  # truncated
    row = json.loads(entries[1].read_text())
    row["agreement"] = 250.0  # bogus, checksum kept as it was
    entries[1].write_text(json.dumps(row))
    summary = run_experiment(config, tmp_path, progress=False)
    assert summary["stitch"]["run"] == 2
    after = _rows(tmp_path / "results.csv")
    assert [r["agreement"] for r in after] == [r["agreement"] for r in before]


def test_damaged_model_file_is_retrained(tmp_path):
    config = copy.deepcopy(TINY)
    config["stitch"].update(points=["blocks.1"], protocols=["standard"], objectives=["dm"])
    run_experiment(config, tmp_path, progress=False)
    model_file = next((tmp_path / "store" / "models").glob("back-*/model.safetensors"))
    raw = bytearray(model_file.read_bytes())
    raw[-8:] = b"\x00" * 8  # flip the last weights' bytes
    model_file.write_bytes(bytes(raw))
    summary = run_experiment(config, tmp_path, progress=False)
    assert summary["models"]["run"] == 1


def test_runs_leave_global_rng_and_threads_alone(tmp_path, cnn):
    config = copy.deepcopy(TINY)
    config["stitch"].update(points=["blocks.1"], protocols=["standard"], objectives=["slm"])
    torch.set_num_threads(2)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    run_experiment(config, tmp_path, progress=False)
    x, y = _data(32)
    sl.stitch(cnn, cnn, "blocks.1", (x, y), epochs=1, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.get_num_threads() == 2


# ---------------------------------------------------------------------------
# bad numbers and bad inputs: clear errors, never a silent score


def test_nan_images_are_refused_by_every_path(cnn):
    x, y = _data(32)
    x[5, 0, 3, 3] = float("nan")
    for kwargs in ({"objective": "slm"}, {"objective": "dm", "solver": "closed_form"}):
        with pytest.raises(DataError, match=r"image\(s\) \[5\] contain NaN"):
            sl.stitch(cnn, cnn, "blocks.1", (x, y), epochs=1, **kwargs)
    with pytest.raises(DataError, match="NaN"):
        sl.generate_iris(cnn, "blocks.1", x, steps=2)


def test_nan_iris_are_flagged():
    from stitchlab.iris import IRIQuality

    q = IRIQuality.of(torch.tensor([0.01, float("nan")]), torch.tensor([0.1, 0.1]), 0.5,
                      torch.tensor([1.0, 1.0]))  # fmt: skip
    assert q.flagged


def test_labels_outside_the_classes_or_float_labels_are_refused(cnn):
    x, y = _data(32)
    bad = y.clone()
    bad[0] = 12
    s = sl.stitch(cnn, cnn, "blocks.1", (x, y), epochs=1)
    with pytest.raises(DataError, match=r"label 12 \(index 0\) is outside 0..9"):
        sl.evaluate(s, (x, bad), cnn)
    with pytest.raises(DataError, match=r"label 12 \(index 0\) is outside 0..9"):
        sl.stitch(cnn, cnn, "blocks.1", (x, bad), objective="hlm", epochs=1)
    with pytest.raises(DataError, match="labels must be integers"):
        sl.stitch(cnn, cnn, "blocks.1", (x, y.float()), epochs=1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_images_and_models_must_be_float32(cnn, dtype):
    x, y = _data(16)
    with pytest.raises(DataError, match=f"must be float32, got {dtype}"):
        sl.stitch(cnn, cnn, "blocks.1", (x.to(dtype), y), epochs=1)
    with pytest.raises(ValueError, match=f"has {dtype} weights.*model.float"):
        sl.stitch(copy.deepcopy(cnn).to(dtype), cnn, "blocks.1", (x, y), epochs=1)


def test_shape_errors_say_what_the_model_takes(cnn):
    y = torch.zeros(8, dtype=torch.long)
    with pytest.raises(ValueError, match="expected input.*3 channels"):
        sl.stitch(cnn, cnn, "blocks.1", (torch.rand(8, 1, 32, 32), y), epochs=1)
    vit = models.create("vit_tiny_patch4_32", width=24, depth=2)
    point = sl.stitch_points(vit)[1]
    with pytest.raises(ValueError, match="doesn't match model"):
        sl.stitch(vit, vit, point, (torch.rand(8, 3, 64, 64), y), epochs=1)


def test_a_point_that_returns_a_tuple_is_refused():
    from torch import nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Conv2d(3, 8, 8, 8)
            self.att = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 10)

        def forward(self, x):
            t = self.emb(x).flatten(2).transpose(1, 2)
            return self.head(self.att(t, t, t)[0].mean(1))

    m = Attn()
    with pytest.raises(ValueError, match="returns tuple at run time"):
        sl.stitch(m, m, "att", _data(8), epochs=1)


def test_iri_sources_outside_the_box_are_refused(tmp_path, cnn):
    x, y = _data(8)
    with pytest.raises(ValueError, match="outside the box"):
        sl.generate_iris_set(cnn, "blocks.1", (x * 2, y), tmp_path, steps=1)


def test_objective_options_are_given_once(cnn):
    from stitchlab.objectives import SLM

    x, y = _data(16)
    with pytest.raises(TypeError, match="carries its own options"):
        sl.stitch(cnn, cnn, "blocks.1", (x, y), objective=SLM(2.0), temperature=5.0)
    with pytest.raises(TypeError, match="do not apply to objective 'dm'"):
        sl.stitch(cnn, cnn, "blocks.1", (x, y), objective="dm", temperature=5.0)


def test_settings_objects_are_accepted(cnn):
    from stitchlab.fit import TrainingConfig

    x, y = _data(32)
    by_keywords = sl.stitch(cnn, cnn, "blocks.1", (x, y), epochs=1, lr=1e-3)
    by_object = sl.stitch(cnn, cnn, "blocks.1", (x, y), settings=TrainingConfig(epochs=1))
    assert by_keywords.history == by_object.history
    with pytest.raises(TypeError, match="settings= and training options"):
        sl.stitch(cnn, cnn, "blocks.1", (x, y), settings=TrainingConfig(), epochs=2)
    with pytest.raises(TypeError, match="epochs must be int, got 1.5"):
        sl.stitch(cnn, cnn, "blocks.1", (x, y), epochs=1.5)


# ---------------------------------------------------------------------------
# checkpoints and the CLI


def _edit_header(path, edit):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * ((8 - len(new) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def test_checkpoint_dtype_edit_is_refused(tmp_path, cnn):
    path = models.save(cnn, tmp_path / "m.safetensors")

    def to_int(header):
        name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
        header[name]["dtype"] = "I32"

    _edit_header(path, to_int)
    with pytest.raises(models.CheckpointError, match="damaged|dtype mismatch"):
        models.load(path)


def test_checkpoint_description_is_checked_before_allocation(tmp_path, cnn, monkeypatch):
    from stitchlab.models import checkpoint

    path = models.save(cnn, tmp_path / "m.safetensors")

    def wide(header):
        desc = json.loads(header["__metadata__"]["stitchlab"])
        desc["options"]["width"] = 1024
        header["__metadata__"]["stitchlab"] = json.dumps(desc)

    _edit_header(path, wide)
    builds = []
    real = checkpoint._build
    monkeypatch.setattr(checkpoint, "_build", lambda *a, **k: builds.append(k) or real(*a, **k))
    with pytest.raises(models.CheckpointError, match=r"shape mismatch.*\(1024, 3, 3, 3\)"):
        models.load(path)
    assert builds == [{"meta": True}]  # only the weightless model was ever built


def test_cli_refuses_a_model_name_without_weights(tmp_path, capsys):
    args = ["stitch", "small_cnn", "small_cnn", "blocks.1", "--n", "16", "--n-test", "8",
            "--epochs", "1"]  # fmt: skip
    assert main(args) == 2
    assert "--random-init" in capsys.readouterr().err
    assert main([*args, "--random-init"]) == 0


def test_ctrl_c_says_how_to_resume(monkeypatch, capsys):
    from stitchlab import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_layers", interrupted)
    assert main(["layers", "small_cnn"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "rerun the same command to resume" in err.lower()
    assert "Traceback" not in err
