"""User data for ``stitchlab compare``: image folders, CIFAR-10, .npz, .safetensors and
Hugging Face ``save_to_disk`` folders, each written by hand into ``tmp_path``."""

import io
import json
import pathlib
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from stitchlab.data import CIFAR10_CLASSES, DataFileError
from stitchlab.data.user import UserData, load_user_data


def _rgb(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _png(path: pathlib.Path, arr: np.ndarray) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return arr


def _tensor(arr: np.ndarray) -> torch.Tensor:
    """The expected item for an (H, W, 3) uint8 array: exactly uint8 / 255."""
    return torch.from_numpy(arr).permute(2, 0, 1).float() / 255


def _check_items(ud: UserData) -> None:
    for ds in (ud.stitch, ud.test):
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.dtype == torch.float32 and x.shape == (3, *ud.image_size)
            assert 0 <= float(x.min()) and float(x.max()) <= 1
            assert isinstance(y, int) and (y >= 0 if ud.labelled else y == -1)


# ---------------------------------------------------------------------------
# image folders


@pytest.mark.parametrize("test_dir", ["test", "val"])
def test_folder_with_train_and_test_folders(tmp_path, test_dir):
    written = {}
    for split, counts in (("train", {"cat": 3, "dog": 2}), (test_dir, {"cat": 1, "dog": 1})):
        written[split] = []
        for label, (cls, n) in enumerate(counts.items()):
            for k in range(n):
                arr = _png(tmp_path / split / cls / f"{k}.png", _rgb(8, 6, len(written) * 10 + k))
                written[split].append((arr, label))
    ud = load_user_data(tmp_path)
    assert (ud.kind, ud.labelled, ud.classes, ud.num_classes) == ("folder", True, ("cat", "dog"), 2)
    assert ud.split == f"folders train/ and {test_dir}/"
    assert ud.source == str(tmp_path.resolve()) and ud.image_size == (8, 6)
    assert (len(ud.stitch), len(ud.test)) == (5, 2)
    for ds, split in ((ud.stitch, "train"), (ud.test, test_dir)):
        for i, (arr, label) in enumerate(written[split]):  # sorted by class, then file name
            x, y = ds[i]
            assert torch.equal(x, _tensor(arr)) and y == label
    _check_items(ud)


def test_folder_class_lists_must_match(tmp_path):
    for split, cls in (("train", "a"), ("train", "b"), ("test", "a"), ("test", "c")):
        _png(tmp_path / split / cls / "0.png", _rgb(4, 4, 0))
    with pytest.raises(DataFileError, match=r"differ: only in train/: b; only in test/: c"):
        load_user_data(tmp_path)


def test_folder_train_without_test_is_an_error(tmp_path):
    _png(tmp_path / "train" / "a" / "0.png", _rgb(4, 4, 0))
    with pytest.raises(DataFileError, match="no test/ or val/"):
        load_user_data(tmp_path)


def _class_folder(root, counts: dict[str, int]) -> None:
    for c, (cls, n) in enumerate(counts.items()):
        for k in range(n):
            _png(root / cls / f"{k:02d}.png", _rgb(4, 4, 100 * c + k))


def test_flat_class_folder_stratified_split(tmp_path):
    _class_folder(tmp_path, {"a": 8, "b": 8, "c": 8})
    ud = load_user_data(tmp_path, test_fraction=0.25, seed=0)
    assert ud.classes == ("a", "b", "c") and ud.labelled and ud.kind == "folder"
    assert (len(ud.stitch), len(ud.test)) == (18, 6)
    assert ud.split.startswith("fraction 0.25 of 24 images, seed 0, stratified by class")
    stitch, test = ud.stitch.indices, ud.test.indices
    assert sorted(stitch + test) == list(range(24))
    for c in range(3):  # images 8c..8c+7 are class c: 6 stitch and 2 test each
        assert sum(8 * c <= i < 8 * c + 8 for i in test) == 2
        assert [ud.test[j][1] for j in range(6)].count(c) == 2
    again = load_user_data(tmp_path, test_fraction=0.25, seed=0)
    other = load_user_data(tmp_path, test_fraction=0.25, seed=1)
    assert again.test.indices == test and other.test.indices != test
    _check_items(ud)


def test_flat_class_folder_small_classes(tmp_path):
    _class_folder(tmp_path, {"one": 1, "two": 2, "ten": 10})
    ud = load_user_data(tmp_path, test_fraction=0.2)
    # classes sorted: one (1 image: stitch only), ten (10: 2 test), two (2: 1 and 1)
    assert ud.classes == ("one", "ten", "two")
    assert sorted(ud.test[i][1] for i in range(len(ud.test))) == [1, 1, 2]
    assert len(ud.stitch) == 10


def test_flat_class_folder_with_a_single_image_per_class_has_no_test_split(tmp_path):
    _class_folder(tmp_path, {"a": 1, "b": 1})
    with pytest.raises(DataFileError, match="test split .* is empty"):
        load_user_data(tmp_path)


def test_unlabelled_flat_folder(tmp_path):
    for k in range(5):
        _png(tmp_path / f"img{k}.png", _rgb(4, 5, k))
    ud = load_user_data(tmp_path)
    assert (ud.labelled, ud.classes, ud.num_classes) == (False, None, None)
    assert (len(ud.stitch), len(ud.test)) == (4, 1) and ud.image_size == (4, 5)
    assert ud.split.startswith("fraction 0.2 of 5 images, seed 0 (4 stitch, 1 test)")
    assert all(ud.stitch[i][1] == -1 for i in range(4)) and ud.test[0][1] == -1
    _check_items(ud)
    for split, n in (("train", 3), ("test", 2)):  # unlabelled, split by folder
        for k in range(n):
            _png(tmp_path / "split" / split / f"{k}.png", _rgb(4, 5, k))
    ud = load_user_data(tmp_path / "split")
    assert (ud.labelled, len(ud.stitch), len(ud.test)) == (False, 3, 2)
    assert ud.split == "folders train/ and test/"
    _check_items(ud)


def test_folder_mixing_loose_images_and_class_folders_is_an_error(tmp_path):
    _png(tmp_path / "loose.png", _rgb(4, 4, 0))
    _class_folder(tmp_path, {"a": 2})
    with pytest.raises(DataFileError, match="both images .* and class folders"):
        load_user_data(tmp_path)


def test_mixed_sizes_need_size_and_modes_become_rgb(tmp_path):
    _class_folder(tmp_path, {"a": 2, "b": 2})
    _png(tmp_path / "a" / "big.png", _rgb(20, 24, 7))
    with pytest.raises(DataFileError, match="different sizes.*Pass size=N"):
        load_user_data(tmp_path)
    ud = load_user_data(tmp_path, size=16)
    assert ud.image_size == (16, 16)
    _check_items(ud)

    grey = np.arange(16, dtype=np.uint8).reshape(4, 4) * 10
    rgba = np.concatenate([_rgb(4, 4, 1), np.full((4, 4, 1), 7, np.uint8)], axis=2)
    _png(tmp_path / "modes" / "a" / "grey.png", grey)
    _png(tmp_path / "modes" / "a" / "rgba.png", rgba)
    ud = load_user_data(tmp_path / "modes", test_fraction=0.5)
    items = {ud.stitch.dataset.samples[i][0].name: ud.stitch.dataset[i][0] for i in range(2)}
    assert torch.equal(items["grey.png"], torch.from_numpy(grey).float().div(255).expand(3, 4, 4))
    assert torch.equal(items["rgba.png"], _tensor(rgba[..., :3]))


def test_subsets_are_seeded_and_may_ask_for_more(tmp_path):
    _class_folder(tmp_path, {"a": 6, "b": 6})
    ud = load_user_data(tmp_path, n_stitch=3, n_test=100, test_fraction=0.5, seed=2)
    assert (len(ud.stitch), len(ud.test)) == (3, 6)
    assert "random subsets (seed 2): stitch 3 of 6, test 6 of 6" in ud.split
    again = load_user_data(tmp_path, n_stitch=3, n_test=100, test_fraction=0.5, seed=2)
    assert again.stitch.indices == ud.stitch.indices
    _check_items(ud)


# ---------------------------------------------------------------------------
# .npz and .safetensors


def test_npz_nhwc_uint8_with_labels(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 5, 4, 3), dtype=np.uint8)
    labels = np.array([0, 1] * 5)
    np.savez(tmp_path / "d.npz", images=images, labels=labels)
    ud = load_user_data(tmp_path / "d.npz")
    assert (ud.kind, ud.labelled, ud.classes, ud.num_classes) == ("npz", True, None, 2)
    assert (len(ud.stitch), len(ud.test), ud.image_size) == (8, 2, (5, 4))
    for ds in (ud.stitch, ud.test):
        for j, i in enumerate(ds.indices):
            x, y = ds[j]
            assert torch.equal(x, _tensor(images[i])) and y == labels[i]
    assert sorted(ud.test[j][1] for j in range(2)) == [0, 1]
    _check_items(ud)


def test_npz_nchw_float_unlabelled(tmp_path):
    x = torch.rand(6, 3, 4, 4, generator=torch.Generator().manual_seed(0)).numpy()
    x[0, 0, 0, 0], x[1, 0, 0, 0] = 0.0, 1.0  # the ends of [0, 1] are fine
    np.savez(tmp_path / "d.npz", x=x)
    ud = load_user_data(tmp_path / "d.npz", test_fraction=0.5)
    assert (ud.labelled, len(ud.stitch), len(ud.test), ud.image_size) == (False, 3, 3, (4, 4))
    for j, i in enumerate(ud.test.indices):
        img, y = ud.test[j]
        assert torch.equal(img, torch.from_numpy(x[i])) and y == -1
    _check_items(ud)


@pytest.mark.parametrize("shape", [(4, 4, 5), (4, 1, 4, 5), (4, 4, 5, 1)], ids=str)
def test_npz_greyscale_becomes_three_channels(tmp_path, shape):
    grey = np.arange(4 * 20, dtype=np.uint8).reshape(4, 4, 5)
    np.savez(tmp_path / "d.npz", images=grey.reshape(shape))
    ud = load_user_data(tmp_path / "d.npz", test_fraction=0.25)
    assert ud.image_size == (4, 5)
    i = ud.test.indices[0]
    expected = torch.from_numpy(grey[i]).float().div(255).expand(3, 4, 5)
    assert torch.equal(ud.test[0][0], expected)


def test_npz_train_test_arrays_with_class_names(tmp_path):
    rng = np.random.default_rng(1)
    x_train = rng.integers(0, 256, (5, 3, 2, 2), dtype=np.uint8)
    x_test = rng.integers(0, 256, (2, 3, 2, 2), dtype=np.uint8)
    y_train, y_test = np.array([[0], [1], [2], [0], [1]]), np.array([2, 0], dtype=np.uint8)
    np.savez(
        tmp_path / "d.npz",
        x_train=x_train,
        x_test=x_test,
        y_train=y_train,
        y_test=y_test,
        classes=np.array(["ant", "bee", "cow"]),
    )
    ud = load_user_data(tmp_path / "d.npz", size=1)
    assert ud.split == "arrays x_train and x_test" and ud.classes == ("ant", "bee", "cow")
    assert (len(ud.stitch), len(ud.test), ud.image_size) == (5, 2, (1, 1))
    assert [ud.test[i][1] for i in range(2)] == [2, 0]
    _check_items(ud)
    ud = load_user_data(tmp_path / "d.npz")
    assert torch.equal(ud.stitch[3][0], torch.from_numpy(x_train[3]).float() / 255)


def test_npz_bad_values_are_refused(tmp_path):
    x = np.random.default_rng(0).random((5, 4, 4, 3)) * 255
    np.savez(tmp_path / "range.npz", images=x)
    with pytest.raises(DataFileError, match=r"values in \[.*\].*scale them"):
        load_user_data(tmp_path / "range.npz")
    x = x / 255
    x[3, 1, 2, 0] = np.nan
    x[4, 0, 0, 0] = np.inf
    np.savez(tmp_path / "nan.npz", images=x)
    with pytest.raises(DataFileError, match=r"Image 3 of 'images'.*NaN or infinite.*2 such"):
        load_user_data(tmp_path / "nan.npz")
    np.savez(tmp_path / "int.npz", images=np.zeros((2, 3, 4, 4), dtype=np.int64))
    with pytest.raises(DataFileError, match="dtype int64: expected uint8"):
        load_user_data(tmp_path / "int.npz")
    np.savez(tmp_path / "rgba.npz", images=np.zeros((2, 4, 4, 4), dtype=np.uint8))
    with pytest.raises(DataFileError, match="1 or 3 channels"):
        load_user_data(tmp_path / "rgba.npz")
    np.savez(tmp_path / "keys.npz", pictures=np.zeros((2, 3, 4, 4), dtype=np.uint8))
    with pytest.raises(DataFileError, match="expected an array 'images' or 'x'.*found pictures"):
        load_user_data(tmp_path / "keys.npz")
    np.savez(tmp_path / "lab.npz", x=np.zeros((2, 3, 4, 4), np.uint8), y=np.array([0.0, 1.0]))
    with pytest.raises(DataFileError, match="must be integers"):
        load_user_data(tmp_path / "lab.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(DataFileError, match="not a .npz archive"):
        load_user_data(tmp_path / "junk.npz")


class _Payload:
    """Unpickling this touches a marker file: proof that pickled code would have run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def test_npz_with_an_object_array_is_refused_unexecuted(tmp_path):
    marker = tmp_path / "executed"
    objects = np.empty(2, dtype=object)
    objects[:] = [_Payload(marker), _Payload(marker)]
    np.savez(tmp_path / "evil.npz", images=objects, labels=np.array([0, 1]))
    np.load(tmp_path / "evil.npz", allow_pickle=True)["images"]  # the payload is live ...
    assert marker.exists()
    marker.unlink()
    with pytest.raises(DataFileError, match="Python objects.*not read"):
        load_user_data(tmp_path / "evil.npz")
    assert not marker.exists()  # ... but load_user_data never runs it


def test_safetensors_file(tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 4, 6), dtype=torch.uint8, generator=g)
    labels = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    meta = {"classes": json.dumps(["no", "yes"])}
    save_file({"images": images, "labels": labels}, tmp_path / "d.safetensors", metadata=meta)
    ud = load_user_data(tmp_path / "d.safetensors", test_fraction=0.25)
    assert (ud.kind, ud.classes, ud.image_size) == ("safetensors", ("no", "yes"), (4, 6))
    assert (len(ud.stitch), len(ud.test)) == (6, 2)
    for j, i in enumerate(ud.stitch.indices):
        x, y = ud.stitch[j]
        assert torch.equal(x, images[i].float() / 255) and y == int(labels[i])
    _check_items(ud)

    x = torch.rand(3, 4, 4, 3, generator=g)
    save_file({"x_train": x, "x_test": x[:1].clone()}, tmp_path / "s.safetensors")
    ud = load_user_data(tmp_path / "s.safetensors")
    assert (ud.labelled, len(ud.stitch), len(ud.test)) == (False, 3, 1)
    assert torch.equal(ud.test[0][0], x[0].permute(2, 0, 1)) and ud.test[0][1] == -1


# ---------------------------------------------------------------------------
# Hugging Face datasets folders, written by hand (no `datasets` package)

_IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _write_hf(folder, columns: dict, features: dict | None, *, stream: bool = True) -> None:
    """A ``Dataset.save_to_disk`` folder: one Arrow shard, state.json, dataset_info.json."""
    folder.mkdir(parents=True)
    table = pa.table(columns)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        new = pa.ipc.new_stream if stream else pa.ipc.new_file
        with new(sink, table.schema) as writer:
            writer.write_table(table)
    state = {
        "_data_files": [{"filename": "data-00000-of-00001.arrow"}],
        "_fingerprint": "0123456789abcdef",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (folder / "state.json").write_text(json.dumps(state))
    if features is not None:
        info = {"citation": "", "description": "", "features": features, "license": ""}
        (folder / "dataset_info.json").write_text(json.dumps(info))


def _hf_columns(arrays: list[np.ndarray], labels: list[int]) -> dict:
    rows = [{"bytes": _png_bytes(a), "path": f"{i}.png"} for i, a in enumerate(arrays)]
    return {
        "id": pa.array(range(len(arrays)), pa.int64()),
        "picture": pa.array(rows, _IMAGE_TYPE),
        "target": pa.array(labels, pa.int64()),
    }


_FEATURES = {
    "id": {"dtype": "int64", "_type": "Value"},
    "picture": {"_type": "Image"},
    "target": {"names": ["cat", "dog", "emu"], "_type": "ClassLabel"},
}


def test_hf_dataset_folder(tmp_path):
    arrays = [_rgb(3, 5, k) for k in range(10)]
    labels = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    _write_hf(tmp_path / "ds", _hf_columns(arrays, labels), _FEATURES)
    ud = load_user_data(tmp_path / "ds", test_fraction=0.3)
    assert (ud.kind, ud.classes, ud.num_classes) == ("hf-datasets", ("cat", "dog", "emu"), 3)
    assert ud.labelled and ud.image_size == (3, 5)
    assert ud.split.startswith("fraction 0.3 of 10 images, seed 0, stratified by class")
    assert (len(ud.stitch), len(ud.test)) == (7, 3)  # one test image of each class
    for ds in (ud.stitch, ud.test):
        for j, i in enumerate(ds.indices):
            x, y = ds[j]
            assert torch.equal(x, _tensor(arrays[i])) and y == labels[i]
    assert sorted(ud.test[j][1] for j in range(3)) == [0, 1, 2]
    small = load_user_data(tmp_path / "ds", n_stitch=2, n_test=1, size=2)
    assert (len(small.stitch), len(small.test), small.image_size) == (2, 1, (2, 2))
    _check_items(small)


def test_hf_dataset_dict_folder(tmp_path):
    train = [_rgb(4, 4, k) for k in range(4)]
    test = [_rgb(4, 4, 10 + k) for k in range(2)]
    _write_hf(tmp_path / "train", _hf_columns(train, [0, 1, 2, 1]), _FEATURES)
    columns = _hf_columns(test, [2, 0])
    columns["picture"] = pa.array(  # an image kept as a path next to the data, not as bytes
        [{"bytes": _png_bytes(test[0]), "path": None}, {"bytes": None, "path": "extra.png"}],
        _IMAGE_TYPE,
    )
    _write_hf(tmp_path / "test", columns, _FEATURES, stream=False)  # an IPC file, not a stream
    _png(tmp_path / "test" / "extra.png", test[1])
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    ud = load_user_data(tmp_path)
    assert (ud.kind, ud.split) == ("hf-datasets", "splits train and test")
    assert ud.classes == ("cat", "dog", "emu")
    assert (len(ud.stitch), len(ud.test)) == (4, 2)
    assert [ud.stitch[i][1] for i in range(4)] == [0, 1, 2, 1]
    for i, arr in enumerate(train):
        assert torch.equal(ud.stitch[i][0], _tensor(arr))
    for i, (arr, label) in enumerate(zip(test, [2, 0], strict=True)):
        x, y = ud.test[i]
        assert torch.equal(x, _tensor(arr)) and y == label
    assert pickle.loads(pickle.dumps(ud.test))[1][1] == 0  # worker processes re-map the files


def test_hf_unlabelled_and_mixed_sizes(tmp_path):
    rows = [{"bytes": _png_bytes(_rgb(4, 4 + (k == 2), k)), "path": None} for k in range(4)]
    _write_hf(tmp_path / "ds", {"img": pa.array(rows, _IMAGE_TYPE)}, None)  # no dataset_info
    with pytest.raises(DataFileError, match="different sizes.*Pass size=N"):
        load_user_data(tmp_path / "ds")
    ud = load_user_data(tmp_path / "ds", size=3, test_fraction=0.25)
    assert (ud.labelled, ud.classes, len(ud.stitch), len(ud.test)) == (False, None, 3, 1)
    _check_items(ud)


def test_hf_folder_written_by_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    arrays = [_rgb(4, 4, k) for k in range(6)]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])}
    )
    rows = {"image": [Image.fromarray(a) for a in arrays], "label": [0, 1, 0, 1, 0, 1]}
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows, features=features),
            "test": datasets.Dataset.from_dict(rows, features=features).select([0, 1]),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    ud = load_user_data(tmp_path / "dd")
    assert (ud.classes, len(ud.stitch), len(ud.test)) == (("a", "b"), 6, 2)
    assert torch.equal(ud.stitch[5][0], _tensor(arrays[5])) and ud.stitch[5][1] == 1


# ---------------------------------------------------------------------------
# CIFAR-10 and unknown inputs


def test_cifar10_folder(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    written = {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        rng = np.random.default_rng(i)
        images, labels = rng.integers(0, 256, (4, 3072), dtype=np.uint8), [i, 9, 0, 5]
        written[name] = images
        with open(folder / name, "wb") as f:
            pickle.dump({"data": images, "labels": labels}, f, 4)
    for where in (tmp_path, folder):
        ud = load_user_data(where)
        assert (ud.kind, ud.classes, ud.image_size) == ("cifar10", CIFAR10_CLASSES, (32, 32))
        assert (len(ud.stitch), len(ud.test), ud.num_classes) == (20, 4, 10)
        x, y = ud.test[0]
        assert torch.equal(x, torch.from_numpy(written["test_batch"][0]).view(3, 32, 32) / 255)
        assert y == 5
    ud = load_user_data(tmp_path, n_stitch=5, size=8)
    assert (len(ud.stitch), ud.image_size) == (5, (8, 8))
    _check_items(ud)


def test_unknown_inputs(tmp_path):
    with pytest.raises(DataFileError, match="does not exist.*Accepted: an image folder"):
        load_user_data(tmp_path / "missing")
    (tmp_path / "table.csv").write_text("a,b\n")
    with pytest.raises(DataFileError, match=r"Unknown data file type '\.csv'.*\.npz or \.safet"):
        load_user_data(tmp_path / "table.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileError, match="No images in .*Hugging Face datasets folder"):
        load_user_data(tmp_path / "empty")
    with pytest.raises(ValueError, match="test_fraction"):
        load_user_data(tmp_path, test_fraction=1.0)
