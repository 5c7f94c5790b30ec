"""Data: safe CIFAR reading, MNIST idx files, coloured MNIST, folders, generated data, markers."""

import gzip
import os
import pickle
import struct

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from stitchlab import data
from stitchlab.data import DataFileError, Marked, UnsafePickleError

# ---------------------------------------------------------------------------
# CIFAR-10: the standard python layout, read without running pickled code


def _cifar_batch(n: int, seed: int) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).tolist()


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 str and the numpy name of the original CIFAR release."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    def save_global(self, obj, name=None):
        if getattr(obj, "__name__", None) == "_reconstruct":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
            return
        super().save_global(obj, name)

    dispatch[bytes] = _save_str


def _write_cifar(root, py2: bool) -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        images, labels = _cifar_batch(4, i)
        written[name] = (images, labels)
        with open(folder / name, "wb") as f:
            if py2:
                batch = {b"data": images, b"labels": labels, b"batch_label": b"x"}
                _Py2Pickler(f, protocol=2).dump(batch)
            else:
                pickle.dump({"data": images, "labels": labels, "filenames": ["a.png"]}, f, 4)
    return written


@pytest.mark.parametrize("py2", [True, False], ids=["python2-layout", "python3-pickle"])
def test_cifar10_reads_the_standard_layout(tmp_path, py2):
    written = _write_cifar(tmp_path, py2)
    train = data.cifar10(tmp_path, train=True)
    test = data.cifar10(tmp_path / "cifar-10-batches-py", train=False)  # the folder itself
    assert len(train) == 20 and len(test) == 4
    images, labels = written["data_batch_2"]
    x, y = train[5]  # second item of the second batch
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert torch.equal(x, torch.from_numpy(images[1].reshape(3, 32, 32)).float() / 255)
    assert y == labels[1]
    assert train.classes[0] == "airplane"
    assert data.labels_of(test).tolist() == written["test_batch"][1]


class _RunsCode:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _NumpyGadget:
    """A numpy function that executes a string: must be refused like any other global."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        from numpy.testing._private.utils import runstring

        return (runstring, (self.code, {}))


@pytest.mark.parametrize("payload", ["os.system", "numpy runstring"])
def test_malicious_cifar_batch_is_refused_without_side_effects(tmp_path, payload):
    _write_cifar(tmp_path, py2=False)
    marker = tmp_path / "pwned"
    if payload == "os.system":
        evil = _RunsCode(f"touch {marker}")
    else:
        evil = _NumpyGadget(f"open({str(marker)!r}, 'w').close()")
    images, labels = _cifar_batch(4, 0)
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_3", "wb") as f:
        pickle.dump({"data": images, "labels": labels, "x": evil}, f, protocol=4)
    with pytest.raises(UnsafePickleError, match="Refusing to load .*data_batch_3.*nothing was"):
        data.cifar10(tmp_path, train=True)
    assert not marker.exists()


def test_damaged_or_missing_cifar_files_give_clear_errors(tmp_path):
    with pytest.raises(DataFileError, match="No CIFAR-10 batches.*cifar-10-batches-py"):
        data.cifar10(tmp_path)
    _write_cifar(tmp_path, py2=False)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataFileError, match="damaged or not a pickle"):
        data.cifar10(tmp_path, train=False)
    with open(path, "wb") as f:
        pickle.dump({"data": np.zeros((2, 10), np.uint8), "labels": [0, 1]}, f, 4)
    with pytest.raises(DataFileError, match=r"expected uint8 data of shape \(N, 3072\)"):
        data.cifar10(tmp_path, train=False)
    with open(path, "wb") as f:  # Python 3, protocol 2: bytes via _codecs.encode
        pickle.dump({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}, f, 2)
    with pytest.raises(UnsafePickleError, match="re-written by Python 3"):
        data.cifar10(tmp_path, train=False)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DataFileError, match="missing.*data_batch_4"):
        data.cifar10(tmp_path, train=True)


# ---------------------------------------------------------------------------
# MNIST and coloured MNIST


def _idx(array: np.ndarray) -> bytes:
    return (
        bytes([0, 0, 0x08, array.ndim])
        + struct.pack(f">{array.ndim}I", *array.shape)
        + (array.astype(np.uint8).tobytes())
    )


def _write_mnist(root, n_train=30, n_test=20, compress=True):
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    out = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = np.arange(n, dtype=np.uint8) % 10
        out[split] = (images, labels)
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{split}-{kind}-ubyte"
            if compress:
                with gzip.open(raw / f"{name}.gz", "wb") as f:
                    f.write(_idx(arr))
            else:
                (raw / name).write_bytes(_idx(arr))
    return out


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_reads_idx_files(tmp_path, compress):
    written = _write_mnist(tmp_path, compress=compress)
    train = data.mnist(tmp_path)
    assert len(train) == 30
    x, y = train[3]
    assert x.shape == (1, 28, 28) and y == 3
    assert torch.equal(x[0], torch.from_numpy(written["train"][0][3]).float() / 255)
    test = data.mnist(tmp_path, train=False, channels=3, size=32)
    x, _ = test[0]
    assert x.shape == (3, 32, 32)
    assert x[:, :2].abs().sum() == 0 and torch.equal(x[0], x[2])  # black padding, grey


def test_mnist_bad_files(tmp_path):
    with pytest.raises(DataFileError, match="not found"):
        data.mnist(tmp_path)
    _write_mnist(tmp_path, compress=False)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataFileError, match="truncated or damaged"):
        data.mnist(tmp_path)
    path.write_bytes(b"\x01\x02\x03\x04junk")
    with pytest.raises(DataFileError, match="bad magic"):
        data.mnist(tmp_path)


def test_coloured_mnist_variants(tmp_path):
    _write_mnist(tmp_path, n_train=200)
    palette = data.distinct_colours(10)
    digits = data.mnist(tmp_path).targets

    def colour_of(x):  # the colour of the brightest pixel (a 255 one: the colour itself)
        flat = x.flatten(1)
        v = flat[:, flat.sum(0).argmax()]
        return int(((palette - v) ** 2).sum(1).argmin())

    sets = {v: data.coloured_mnist(tmp_path, v, seed=0) for v in data.COLOURED_MNIST_VARIANTS}
    for variant, ds in sets.items():
        colours = torch.tensor([colour_of(ds[i][0]) for i in range(len(ds))])
        labels = data.labels_of(ds)
        assert ds[0][0].shape == (3, 32, 32)
        if variant == "correlated":
            assert torch.equal(labels, digits) and torch.equal(colours, labels)
        elif variant == "digit":
            assert torch.equal(labels, digits)
            assert (colours == labels).float().mean() < 0.25  # colour carries no label
        else:
            assert torch.equal(colours, labels)
            assert (labels == digits).float().mean() < 0.25  # the digit carries no label
    with pytest.raises(ValueError, match="variant must be one of"):
        data.coloured_mnist(tmp_path, "stripes")


# ---------------------------------------------------------------------------
# Image folders and the LS-ImageNet-10 builder


def _png_tree(root, classes, n, size=(40, 30)):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / split / c / f"{c}_{i}.JPEG", format="PNG")


def test_image_folder_reads_classes_in_order(tmp_path):
    _png_tree(tmp_path, ["b", "a", "c"], 2)
    ds = data.image_folder(tmp_path, train=True)
    assert ds.classes == ["a", "b", "c"] and len(ds) == 6
    x, y = ds[2]
    assert x.shape == (3, 30, 40) and 0 <= float(x.min()) and float(x.max()) <= 1 and y == 1
    ds = data.image_folder(tmp_path, train=False, classes=["c", "a"], size=16)
    assert ds.targets.tolist() == [0, 0, 1, 1] and ds[0][0].shape == (3, 16, 16)
    with pytest.raises(DataFileError, match="missing.*zzz"):
        data.image_folder(tmp_path, classes=["a", "zzz"])
    with pytest.raises(DataFileError, match="No train folder"):
        data.image_folder(tmp_path / "train")


def test_build_ls_imagenet10_from_an_imagenet_tree(tmp_path):
    wnids = list(data.LS_IMAGENET10_CLASSES)
    assert len(set(wnids)) == 10 and len(set(data.IMAGENET100_CLASSES)) == 100
    src, out = tmp_path / "imagenet", tmp_path / "ls10"
    _png_tree(src, wnids + ["n01440764"], 3, size=(50, 40))
    data.build_ls_imagenet10(src, out, per_class=2)
    assert sorted(p.name for p in (out / "train").iterdir()) == sorted(wnids)  # extra skipped
    train, val = data.ls_imagenet10(out), data.ls_imagenet10(out, train=False)
    assert len(train) == 20 and len(val) == 20
    assert train[0][0].shape == (3, 32, 32) and train.classes == wnids
    with pytest.raises(DataFileError, match="missing"):
        data.build_ls_imagenet10(src, tmp_path / "x", classes=wnids + ["n99999999"])


def test_imagenet_b100_must_be_disjoint_from_imagenet100(tmp_path):
    _png_tree(tmp_path / "ok", ["n01440764", "n01443537"], 1)
    assert len(data.imagenet_b100(tmp_path / "ok", size=8)) == 2
    assert data.choose_imagenet_b100(tmp_path / "ok", k=1, seed=0)[0] in ("n01440764", "n01443537")
    _png_tree(tmp_path / "bad", ["n01440764", data.IMAGENET100_CLASSES[0]], 1)
    with pytest.raises(DataFileError, match="disjoint from ImageNet-100"):
        data.imagenet_b100(tmp_path / "bad")


# ---------------------------------------------------------------------------
# Generated data


def test_shapes_output_is_unchanged():
    x, y = data.shapes(50, seed=3)
    assert y.tolist()[:10] == [6, 8, 7, 7, 0, 0, 0, 5, 1, 9]
    assert float(x.sum()) == pytest.approx(55437.8125, rel=1e-5)
    x, _ = data.shapes(50, seed=3, colour=True)
    assert float(x.sum()) == pytest.approx(49733.15234375, rel=1e-5)
    x, y = data.shapes(50, seed=3, size=16, num_classes=4, noise=0.0)
    assert x.shape == (50, 3, 16, 16) and int(y.max()) <= 3
    assert float(x.sum()) == pytest.approx(14376.267578125, rel=1e-5)


def test_cues_put_the_label_in_the_chosen_cues():
    x, y, f = data.cues(
        300, seed=1, label_cues=("colour",), nuisance=("shape",), noise=0.0, return_factors=True
    )
    assert torch.equal(f["colour"], y) and (f["shape"] == y).float().mean() < 0.25
    assert (f["texture"] == -1).all()  # neither a cue nor random: absent
    palette = data.distinct_colours(10)
    flat = x.flatten(2)  # (N, 3, P); without noise: background or object pixels only
    background = flat.median(2, keepdim=True).values  # most pixels are background
    far = (flat - background).norm(dim=1).argmax(1)
    colour = flat[torch.arange(len(x)), :, far]  # the object's colour times a brightness
    cosine = (
        torch.nn.functional.normalize(colour, dim=1)
        @ torch.nn.functional.normalize(palette, dim=1).T
    )
    assert (cosine.argmax(1) == y).float().mean() > 0.95
    a = data.cues(20, seed=5, label_cues=("shape", "texture"))
    b = data.cues(20, seed=5, label_cues=("shape", "texture"))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="unknown cue"):
        data.cues(5, label_cues=("smell",))
    with pytest.raises(ValueError, match="cannot carry the label and be random"):
        data.cues(5, label_cues=("shape",), nuisance=("shape",))


# ---------------------------------------------------------------------------
# Markers


def test_marker_colours_are_distinct_saturated_and_permuted_by_seed():
    c0, c1 = data.marker_colours(10, seed=0), data.marker_colours(10, seed=1)
    assert c0.shape == (10, 3)
    assert torch.cdist(c0, c0).add(torch.eye(10) * 9).min() >= 0.5  # well separated
    assert (c0.max(1).values - c0.min(1).values).min() >= 0.5  # no greys
    assert not torch.equal(c0, c1)
    assert sorted(map(tuple, c0.tolist())) == sorted(map(tuple, c1.tolist()))
    assert data.marker_size(32) == 4 and data.marker_size(224) == 28


def _grey_set(n=40, size=32):
    x = torch.full((n, 3, size, size), 0.5)
    return TensorDataset(x, torch.arange(n) % 10)


def _find_marker(x):
    diff = (x - 0.5).abs().sum(0) > 1e-6
    rows, cols = diff.nonzero(as_tuple=True)
    top, left = int(rows.min()), int(cols.min())
    return x[:, top, left], top, left, int(diff.sum())


def test_pixel_loc_marker_is_the_class_colour_at_the_class_location():
    ds = Marked(_grey_set(), "pixel+loc", seed=3)
    colours = data.marker_colours(10, seed=3)
    where = {}
    for i in range(40):
        x, y = ds[i]
        colour, top, left, area = _find_marker(x)
        assert area == 16 and torch.allclose(colour, colours[y])
        where.setdefault(int(y), set()).add((top, left))
    assert all(len(v) == 1 for v in where.values())  # one location per class
    rolled = Marked(_grey_set(), "pixel+loc", seed=3, rolled=True)
    for i in range(12):
        x, y = rolled[i]
        colour, top, left, _ = _find_marker(x)
        nxt = (int(y) + 1) % 10
        assert torch.allclose(colour, colours[nxt]) and (top, left) in where[nxt]


def test_pixel_and_rand_markers_are_deterministic_per_index():
    for mode in ("pixel", "rand"):
        ds = Marked(_grey_set(), mode, seed=0)
        again = Marked(_grey_set(), mode, seed=0)
        spots = {_find_marker(ds[i][0])[1:3] for i in range(40)}
        assert len(spots) > 20  # random locations ...
        for i in (0, 7, 39):
            assert torch.equal(ds[i][0], ds[i][0]) and torch.equal(ds[i][0], again[i][0])
        assert not torch.equal(ds[0][0], Marked(_grey_set(), mode, seed=1)[0][0])
    colours = data.marker_colours(10, seed=0)
    pixel = Marked(_grey_set(), "pixel", seed=0)
    assert all(torch.allclose(_find_marker(pixel[i][0])[0], colours[i % 10]) for i in range(40))
    rand, rand_rolled = Marked(_grey_set(), "rand"), Marked(_grey_set(), "rand", rolled=True)
    drawn = [int((colours - _find_marker(rand[i][0])[0]).abs().sum(1).argmin()) for i in range(40)]
    assert sum(d == i % 10 for i, d in enumerate(drawn)) < 12  # no label information
    assert all(torch.equal(rand[i][0], rand_rolled[i][0]) for i in range(10))


def test_marker_scales_with_the_image_and_needs_rgb():
    ds = Marked(_grey_set(n=10, size=224), "pixel+loc")
    assert _find_marker(ds[0][0])[3] == 28 * 28
    grey = TensorDataset(torch.rand(4, 1, 32, 32), torch.arange(4))
    with pytest.raises(ValueError, match="markers need RGB images"):
        Marked(grey, num_classes=10)[0]


def test_subset_per_class_and_size():
    ds = TensorDataset(torch.rand(100, 3, 4, 4), torch.arange(100) % 5)
    sub = data.subset(ds, per_class=3, seed=0)
    assert data.labels_of(sub).bincount().tolist() == [3] * 5
    sub2 = data.subset(ds, 7, seed=1)
    assert len(sub2) == 7 and data.subset(ds, 7, seed=1).indices == sub2.indices
    assert data.subset(ds) is ds
    with pytest.raises(ValueError, match="positive"):
        data.subset(ds, 0)
