"""Hugging Face ``datasets`` folders written by ``save_to_disk``, read with pyarrow only
(no ``datasets`` package); images decoded one at a time when read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .tensors import DataFileError
from .user_common import (
    _TEST_SPLITS,
    _decode,
    _header_size,
    _Loaded,
    _Options,
    _read_rgb,
    _split_by_fraction,
)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFileError(f"Cannot read {str(path)!r} as JSON: {exc}") from exc


def _read_arrow(path: Path) -> Any:
    """An Arrow IPC stream (or file) as a pyarrow Table, memory-mapped (no copy)."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(path))
    except (OSError, pa.ArrowException) as exc:
        raise DataFileError(f"Cannot open {str(path)!r}: {exc}") from exc
    try:
        return pa.ipc.open_stream(source).read_all()
    except (OSError, pa.ArrowException):
        source.seek(0)
    try:
        return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise DataFileError(f"{str(path)!r} is not an Arrow IPC stream or file: {exc}") from exc


@dataclass
class _HFSplit:
    folder: Path
    files: list[Path]
    image_column: str
    labels: list[Any] | None  # ints (ClassLabel or int column) or strings
    names: list[str] | None  # ClassLabel names
    column: Any  # the image column (pyarrow ChunkedArray)


def _hf_split(folder: Path) -> _HFSplit:
    import pyarrow as pa

    state_path = folder / "state.json"
    if not state_path.is_file():
        raise DataFileError(
            f"{str(folder)!r} is not a Hugging Face datasets folder (no state.json)."
        )
    state = _read_json(state_path)
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if entries:
        names = [e.get("filename") if isinstance(e, dict) else None for e in entries]
        if not all(isinstance(n, str) and n for n in names):
            raise DataFileError(f"{str(state_path)!r}: _data_files entries need a filename.")
        files = [folder / n for n in names]  # type: ignore[operator]
    else:
        files = sorted(folder.glob("data-*.arrow"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise DataFileError(
            f"Arrow data files missing in {str(folder)!r}: {', '.join(missing) or 'none listed'}."
        )
    tables = [_read_arrow(f) for f in files]
    schema = tables[0].schema
    features: dict[str, Any] | None = None
    if (folder / "dataset_info.json").is_file():
        info = _read_json(folder / "dataset_info.json")
        features = info.get("features") if isinstance(info, dict) else None
    if not isinstance(features, dict) and schema.metadata and b"huggingface" in schema.metadata:
        try:
            meta = json.loads(schema.metadata[b"huggingface"])
            features = meta.get("info", {}).get("features")
        except (ValueError, AttributeError):
            features = None
    if not isinstance(features, dict):
        features = {}

    def typed(kind: str) -> str | None:
        return next(
            (
                k
                for k, v in features.items()
                if isinstance(v, dict) and v.get("_type") == kind and k in schema.names
            ),
            None,
        )

    image_col = typed("Image") or next((c for c in ("image", "img") if c in schema.names), None)
    if image_col is None:
        raise DataFileError(
            f"No image column in {str(folder)!r}: expected a feature of type Image or a column "
            f"named image or img; columns: {', '.join(schema.names)}."
        )
    label_col = typed("ClassLabel")
    names = None
    if label_col is not None:
        names = features[label_col].get("names")
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            names = None
    else:
        label_col = next((c for c in ("label", "labels") if c in schema.names), None)
    for t in tables[1:]:
        if image_col not in t.schema.names or (label_col and label_col not in t.schema.names):
            raise DataFileError(f"The Arrow files of {str(folder)!r} have different columns.")
    chunks = [ch for t in tables for ch in t.column(image_col).chunks]
    column = pa.chunked_array(chunks, type=schema.field(image_col).type)
    labels = None
    if label_col is not None:
        lab_type = schema.field(label_col).type
        if not (
            pa.types.is_integer(lab_type)
            or pa.types.is_string(lab_type)
            or pa.types.is_large_string(lab_type)
        ):
            raise DataFileError(
                f"Label column {label_col!r} in {str(folder)!r} has type {lab_type}: expected "
                "integers (ClassLabel) or strings."
            )
        labels = [v for t in tables for v in t.column(label_col).to_pylist()]
    return _HFSplit(folder, files, image_col, labels, names, column)


class _ArrowImageDataset(Dataset):
    """Rows of an Arrow image column, each decoded with Pillow when read."""

    def __init__(
        self,
        split: _HFSplit,
        targets: Tensor,
        root: Path,
        size: int | None,
        classes: Sequence[str] | None,
    ) -> None:
        self.files = split.files
        self.image_column = split.image_column
        self.folder = split.folder
        self.root = root
        self.targets = targets
        self.size = size
        self.classes = list(classes) if classes is not None else None
        self._column: Any = split.column

    def __getstate__(self) -> dict[str, Any]:  # worker processes map the files again
        state = self.__dict__.copy()
        state["_column"] = None
        return state

    def _col(self) -> Any:
        if self._column is None:
            import pyarrow as pa

            tables = [_read_arrow(f) for f in self.files]
            self._column = pa.chunked_array(
                [ch for t in tables for ch in t.column(self.image_column).chunks],
                type=tables[0].schema.field(self.image_column).type,
            )
        return self._column

    def _source(self, i: int) -> Path | bytes:
        value = self._col()[i].as_py()
        data, path = (
            (value.get("bytes"), value.get("path"))
            if isinstance(value, dict)
            else ((value, None) if isinstance(value, bytes) else (None, value))
        )
        if data is not None:
            return data
        if not path:
            raise DataFileError(
                f"Row {i} of {str(self.folder)!r} has no image (no bytes, no path)."
            )
        p = Path(path)
        for cand in (p,) if p.is_absolute() else (self.folder / p, self.root / p):
            if cand.is_file():
                return cand
        raise DataFileError(
            f"Row {i} of {str(self.folder)!r} has no image bytes and its file {path!r} "
            "was not found (relative paths are looked up in the dataset folder)."
        )

    def raw_size(self, i: int) -> tuple[int, int]:
        return _header_size(self._source(i), f"row {i} of {str(self.folder)!r}")

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        img = _read_rgb(self._source(index), f"row {index} of {str(self.folder)!r}")
        return _decode(img, self.size), int(self.targets[index])


def _load_hf(root: Path, opts: _Options) -> _Loaded:
    if (root / "dataset_dict.json").is_file():
        info = _read_json(root / "dataset_dict.json")
        splits = info.get("splits") if isinstance(info, dict) else None
        if not (isinstance(splits, list) and splits and all(isinstance(s, str) for s in splits)):
            raise DataFileError(f"{str(root / 'dataset_dict.json')!r} lists no splits.")
        test_name = next((s for s in _TEST_SPLITS if s in splits), None)
        if "train" in splits and test_name is not None:
            chosen = ["train", test_name]
        elif "train" in splits or len(splits) == 1:
            chosen = ["train" if "train" in splits else splits[0]]
        else:
            raise DataFileError(
                f"Cannot tell the train and test splits of {str(root)!r}: its splits are "
                f"{', '.join(splits)} (expected train and test or validation). Pass one "
                "split's folder to split it by a fraction."
            )
        parts = [_hf_split(root / s) for s in chosen]
    else:
        chosen = []
        parts = [_hf_split(root)]

    names = parts[0].names
    if len(parts) == 2 and parts[1].names is not None and names is not None:
        if parts[1].names != names:
            raise DataFileError(
                f"The ClassLabel names of splits {chosen[0]} and {chosen[1]} in {str(root)!r} "
                "differ."
            )
    names = names or (parts[1].names if len(parts) == 2 else None)
    label_lists = [p.labels for p in parts]
    labelled = all(lab is not None for lab in label_lists)
    classes: list[str] | None = None
    targets: list[Tensor] = []
    if labelled:
        values = [v for lab in label_lists for v in lab]  # type: ignore[union-attr]
        if any(isinstance(v, str) for v in values):
            classes = sorted({v for v in values if v is not None})
            index = {c: i for i, c in enumerate(classes)}
            targets = [
                torch.tensor([-1 if v is None else index[v] for v in lab], dtype=torch.long)
                for lab in label_lists  # type: ignore[union-attr]
            ]
        else:
            classes = names
            targets = [
                torch.tensor([-1 if v is None else int(v) for v in lab], dtype=torch.long)
                for lab in label_lists  # type: ignore[union-attr]
            ]
        missing = sum(int((t < 0).sum()) for t in targets)
        total = sum(len(t) for t in targets)
        if missing == total:
            labelled, classes = False, None  # every label is -1 (or null): no labels
        elif missing:
            raise DataFileError(
                f"{missing} of {total} rows in {str(root)!r} have no label (null or -1) while "
                "the others have one. Pass the folder of one fully labelled split to split it "
                "by a fraction, or remove the unlabelled rows."
            )
        elif classes is not None:
            top = max(int(t.max()) for t in targets)
            if top >= len(classes):
                raise DataFileError(
                    f"{str(root)!r} names {len(classes)} classes but has label {top}."
                )
    if not labelled:
        targets = [torch.full((len(p.column),), -1, dtype=torch.long) for p in parts]
    datasets = [_ArrowImageDataset(p, t, root, opts.size, classes) for p, t in zip(parts, targets)]
    cls = tuple(classes) if classes is not None else None
    if len(datasets) == 2:
        words = f"splits {chosen[0]} and {chosen[1]}"
        return _Loaded(datasets[0], datasets[1], labelled, cls, "hf-datasets", words, None)
    stitch, test, words = _split_by_fraction(datasets[0], targets[0], opts, labelled)
    if chosen:
        words = f"split {chosen[0]}: " + words
    return _Loaded(stitch, test, labelled, cls, "hf-datasets", words, None)
