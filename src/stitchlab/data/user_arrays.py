"""Images or waveforms in a ``.npz`` file (``numpy.load`` with ``allow_pickle=False``) or
a ``.safetensors`` file."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .tensors import DataFileError, ImageTensorDataset
from .user_common import _Loaded, _Options, _resizer, _split_by_fraction
from .user_wav import _ArrayClips


@dataclass
class _Arrays:
    keys: set[str]
    get: Callable[[str], Tensor | np.ndarray]
    classes: list[str] | None
    where: str
    sample_rate: int | None = None  # a waveform file's rate entry


def _sample_rate(value: Any, where: str) -> int:
    """A ``sample_rate`` entry as a positive int."""
    try:
        rate = float(np.asarray(value).reshape(()).item())
    except (TypeError, ValueError):
        rate = float("nan")
    if not (rate >= 1 and rate == int(rate)):
        raise DataFileError(f"The sample_rate of {where} must be one positive integer (Hz), "
                            f"got {value!r}.")  # fmt: skip
    return int(rate)


def _read_npz(path: Path) -> _Arrays:
    import zipfile

    where = repr(str(path))
    try:
        npz = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise DataFileError(
            f"{where} is not a .npz archive of plain arrays ({exc}); pickled Python objects "
            "are never read (unpickling can run code): save numeric arrays with numpy.savez."
        ) from exc
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataFileError(f"Cannot read {where} as a .npz file: {exc}") from exc
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise DataFileError(f"{where} is a single .npy array, not a .npz archive of named arrays.")

    def get(key: str) -> np.ndarray:
        try:
            return npz[key]
        except ValueError as exc:
            raise DataFileError(
                f"Array {key!r} in {where} holds Python objects (pickled data), which are not "
                "read because unpickling can run code: save plain numeric arrays (uint8 or "
                "float images, integer labels)."
            ) from exc
        except (OSError, EOFError, zipfile.BadZipFile) as exc:
            raise DataFileError(f"Cannot read array {key!r} of {where}: {exc}") from exc

    keys = set(npz.files)
    classes = None
    for key in ("classes", "class_names"):
        if key in keys:
            arr = get(key)
            if arr.dtype.kind not in "US" or arr.ndim != 1:
                raise DataFileError(f"{key!r} in {where} must be a 1-D array of strings.")
            classes = [str(c.decode() if isinstance(c, bytes) else c) for c in arr.tolist()]
            break
    rate = _sample_rate(get("sample_rate"), where) if "sample_rate" in keys else None
    return _Arrays(keys, get, classes, where, rate)


def _read_safetensors(path: Path) -> _Arrays:
    from safetensors import SafetensorError, safe_open

    where = repr(str(path))
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise DataFileError(f"Cannot read {where} as a .safetensors file: {exc}") from exc
    classes = None
    if "classes" in meta:
        try:
            classes = json.loads(meta["classes"])
        except json.JSONDecodeError:
            classes = None
        if not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
            raise DataFileError(
                f"The 'classes' metadata of {where} must be a JSON list of strings."
            )

    def get(key: str) -> Tensor:
        try:
            with safe_open(str(path), framework="pt") as f:
                return f.get_tensor(key)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise DataFileError(f"Cannot read tensor {key!r} of {where}: {exc}") from exc

    rate = _sample_rate(meta["sample_rate"], where) if "sample_rate" in meta else None
    return _Arrays(keys, get, classes, where, rate)


def _pick_keys(
    keys: set[str], where: str, names: Sequence[str] = ("images", "x"), unit: str = "images"
) -> list[tuple[str, str | None]]:
    """[(images key, labels key or None)]: one entry, or two for a train/test split."""
    if "x_train" in keys or "x_test" in keys:
        if not {"x_train", "x_test"} <= keys:
            raise DataFileError(f"{where} has only one of 'x_train' and 'x_test'; give both.")
        has = ("y_train" in keys, "y_test" in keys)
        if has[0] != has[1]:
            raise DataFileError(
                f"{where} has only one of 'y_train' and 'y_test': give both, or neither "
                "for unlabelled images."
            )
        return [
            ("x_train", "y_train" if has[0] else None),
            ("x_test", "y_test" if has[1] else None),
        ]
    for key in names:
        if key in keys:
            return [(key, next((k for k in ("labels", "y") if k in keys), None))]
    expected = " or ".join(repr(n) for n in names)
    raise DataFileError(
        f"No {unit} in {where}: expected an array {expected} (labels, optional: 'labels' "
        "or 'y'), or 'x_train' and 'x_test' (optional 'y_train' and 'y_test'); found "
        f"{', '.join(sorted(keys)) or 'no arrays'}."
    )


def _dtype_error(key: str, dtype: object, where: str) -> DataFileError:
    return DataFileError(
        f"Images {key!r} in {where} have dtype {dtype}: expected uint8 (0-255) or float "
        "in [0, 1]; convert them first (e.g. to uint8)."
    )


def _as_images(raw: Tensor | np.ndarray, key: str, where: str) -> Tensor:
    """Validated images as a contiguous uint8 or float32 tensor (N, 3, H, W)."""
    if isinstance(raw, np.ndarray):
        if raw.dtype.kind not in "uf" or (raw.dtype.kind == "u" and raw.dtype != np.uint8):
            raise _dtype_error(key, raw.dtype, where)
        if raw.dtype.byteorder == ">":
            raw = raw.astype(raw.dtype.newbyteorder("="))
        x = torch.from_numpy(np.ascontiguousarray(raw))
    else:
        x = raw
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise _dtype_error(key, x.dtype, where)
    shape = tuple(x.shape)
    if x.dim() == 3:
        x = x.unsqueeze(1)
    elif x.dim() == 4:
        if x.shape[1] not in (1, 3):
            if x.shape[3] not in (1, 3):
                raise DataFileError(
                    f"Images {key!r} in {where} have shape {shape}: expected (N, C, H, W) or "
                    "(N, H, W, C) with 1 or 3 channels, or greyscale (N, H, W)."
                )
            x = x.permute(0, 3, 1, 2)
    else:
        raise DataFileError(
            f"Images {key!r} in {where} have shape {shape}: expected (N, C, H, W), "
            "(N, H, W, C) or greyscale (N, H, W)."
        )
    if len(x) == 0:
        raise DataFileError(f"Images {key!r} in {where} are empty (no images).")
    if x.is_floating_point():
        bad = ~torch.isfinite(x).flatten(1).all(1)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise DataFileError(
                f"Image {i} of {key!r} in {where} has NaN or infinite values "
                f"({int(bad.sum())} such image(s) in all)."
            )
        x = x.float()
        lo, hi = float(x.min()), float(x.max())
        if lo < 0 or hi > 1:
            raise DataFileError(
                f"Float images {key!r} in {where} have values in [{lo:g}, {hi:g}], but must lie "
                "in [0, 1]: scale them first (e.g. divide 0-255 values by 255), or save uint8."
            )
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    return x.contiguous()


def _as_labels(raw: Tensor | np.ndarray, key: str, n: int, where: str) -> Tensor:
    if isinstance(raw, Tensor):
        raw = (raw.float() if raw.dtype == torch.bfloat16 else raw).numpy()
    y = raw
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.dtype.kind not in "iu":
        raise DataFileError(f"Labels {key!r} in {where} must be integers, got dtype {y.dtype}.")
    if y.ndim != 1 or len(y) != n:
        raise DataFileError(
            f"Labels {key!r} in {where} have shape {tuple(y.shape)}; expected ({n},): one "
            "label per image."
        )
    if y.size and int(y.min()) < 0:
        raise DataFileError(f"Labels {key!r} in {where} must not be negative (min {y.min()}).")
    return torch.from_numpy(y.astype(np.int64))


def _as_waveforms(raw: Tensor | np.ndarray, key: str, where: str) -> Tensor:
    """Validated waveforms as a float32 tensor (N, T) in [-1, 1] (channels averaged)."""
    if isinstance(raw, np.ndarray):
        if raw.dtype.kind != "f" and raw.dtype != np.int16:
            raise DataFileError(f"Waveforms {key!r} in {where} have dtype {raw.dtype}: expected "
                                "float in [-1, 1] or int16 PCM.")  # fmt: skip
        raw = torch.from_numpy(np.ascontiguousarray(raw.astype(raw.dtype.newbyteorder("="))))
    x = raw
    if x.dtype == torch.int16:
        x = x.float() / 32767
    elif not x.is_floating_point():
        raise DataFileError(f"Waveforms {key!r} in {where} have dtype {x.dtype}: expected "
                            "float in [-1, 1] or int16 PCM.")  # fmt: skip
    shape = tuple(x.shape)
    if x.dim() == 3 and x.shape[1] > x.shape[2]:
        raise DataFileError(
            f"Waveforms {key!r} in {where} have shape {shape}, read as (N, channels, T) with "
            f"{shape[1]} channels of {shape[2]} samples: more channels than samples, so they "
            "are probably (N, T, channels), as soundfile reads them; transpose them with "
            "np.transpose(waveforms, (0, 2, 1))."
        )
    if x.dim() == 3:
        x = x.float().mean(1)
    elif x.dim() != 2:
        raise DataFileError(f"Waveforms {key!r} in {where} have shape {shape}: expected (N, T) "
                            "or (N, channels, T).")  # fmt: skip
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise DataFileError(f"Waveforms {key!r} in {where} are empty (shape {shape}).")
    x = x.float()
    bad = ~torch.isfinite(x).all(1)
    if bool(bad.any()):
        raise DataFileError(f"Waveform {int(bad.nonzero()[0])} of {key!r} in {where} has NaN or "
                            "infinite values.")  # fmt: skip
    lo, hi = float(x.min()), float(x.max())
    if lo < -1 or hi > 1:
        raise DataFileError(
            f"Waveforms {key!r} in {where} have values in [{lo:g}, {hi:g}], but must lie in "
            "[-1, 1]: scale them first (divide int16 PCM by 32767), or save int16."
        )
    return x.contiguous()


def _checked_classes(arrays: _Arrays, parts: list, labelled: bool) -> tuple | None:
    """The class names of labelled arrays (None without), checked against the labels."""
    classes = arrays.classes
    if classes is None or not labelled:
        return None
    top = max(int(y.max()) for _, y in parts if y is not None)
    if top >= len(classes):
        raise DataFileError(f"{arrays.where} names {len(classes)} classes but has label {top}.")
    return tuple(classes)


def _load_waveform_tensors(arrays: _Arrays, kind: str, opts: _Options) -> _Loaded:
    where = arrays.where
    plan = _pick_keys(arrays.keys, where, ("waveforms", "audio", "x"), "waveforms")
    parts = []
    for xkey, ykey in plan:
        x = _as_waveforms(arrays.get(xkey), xkey, where)
        y = None if ykey is None else _as_labels(arrays.get(ykey), ykey, len(x), where)
        parts.append((x, y))
    labelled = parts[0][1] is not None
    cls = _checked_classes(arrays, parts, labelled)

    def clips(x: Tensor, y: Tensor | None) -> _ArrayClips:
        labels = y if y is not None else torch.full((len(x),), -1, dtype=torch.long)
        return _ArrayClips(x, labels, arrays.sample_rate)

    if len(parts) == 2:
        return _Loaded(clips(*parts[0]), clips(*parts[1]), labelled, cls, kind,
                       "arrays x_train and x_test", None, True)  # fmt: skip
    ds = clips(*parts[0])
    stitch, test, words = _split_by_fraction(ds, ds.targets, opts, labelled, "clips")
    return _Loaded(stitch, test, labelled, cls, kind, words, None, True)


def _load_tensors(path: Path, arrays: _Arrays, kind: str, opts: _Options) -> _Loaded:
    if opts.audio or arrays.sample_rate is not None:
        return _load_waveform_tensors(arrays, kind, opts)
    where = arrays.where
    plan = _pick_keys(arrays.keys, where)
    parts: list[tuple[Tensor, Tensor | None]] = []
    for xkey, ykey in plan:
        x = _as_images(arrays.get(xkey), xkey, where)
        y = None if ykey is None else _as_labels(arrays.get(ykey), ykey, len(x), where)
        parts.append((x, y))
    if len(parts) == 2 and parts[0][0].shape[2:] != parts[1][0].shape[2:]:
        raise DataFileError(
            f"x_train and x_test in {where} have different image sizes "
            f"{tuple(parts[0][0].shape[2:])} and {tuple(parts[1][0].shape[2:])}."
        )
    labelled = parts[0][1] is not None
    cls = _checked_classes(arrays, parts, labelled)
    transform = _resizer(opts.size)

    def dataset(x: Tensor, y: Tensor | None) -> ImageTensorDataset:
        labels = y if y is not None else torch.full((len(x),), -1, dtype=torch.long)
        return ImageTensorDataset(x, labels, transform=transform, classes=cls)

    h, w = parts[0][0].shape[2:]
    image_size = (opts.size, opts.size) if opts.size else (int(h), int(w))
    if len(parts) == 2:
        words = "arrays x_train and x_test"
        return _Loaded(
            dataset(*parts[0]), dataset(*parts[1]), labelled, cls, kind, words, image_size
        )
    ds = dataset(*parts[0])
    stitch, test, words = _split_by_fraction(ds, ds.targets, opts, labelled)
    return _Loaded(stitch, test, labelled, cls, kind, words, image_size)
