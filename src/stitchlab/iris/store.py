"""Stored IRI sets: a data set's IRIs in checksummed chunks under a key of what determines
them (front weights, point, source data, seed, chunk size, recipe), resumable, each chunk
checked on load; a set of an earlier store format is refused."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from .._batchnorm import folded
from .._data import DataLike, _module_device, as_dataset, batches
from .._memory_format import memory_format_for
from ..store import DamagedEntry, atomic_write, file_sha256, lock, read_json, write_json
from .descent import _check_images, _run_batch
from .front import _recipe_front
from .quality import MIN_NULL_RATIO, THRESHOLD, IRIError, IRIQuality, dequantise
from .recipe import IRIRecipe
from .smooth import SATURATING_RULE, smooths_saturating

#: The store format of IRI sets, in every set's key and metadata. 4: the recipe's fields of
#: the lean package (earlier presets and options removed); a set of another format is
#: refused by :class:`IRISet` and made again by :func:`generate_iris_set`.
FORMAT_VERSION = 4


def _hash_tensor(h, t: Tensor) -> None:
    t = t.detach().cpu().contiguous().reshape(-1)
    h.update(str(t.dtype).encode())
    h.update(str(t.numel()).encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def model_fingerprint(module: nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers (names, shapes, values)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        _hash_tensor(h, t)
    return h.hexdigest()


def data_fingerprint(dataset: Dataset, batch_size: int = 512) -> str:
    """SHA-256 of every ``(image, label)`` of a data set, streamed."""
    h = hashlib.sha256()
    for x, y in batches(dataset, batch_size, torch.device("cpu")):
        _hash_tensor(h, x.float())
        _hash_tensor(h, y.long())
    return h.hexdigest()


class IRISet(Dataset):
    """A stored IRI set: ``(iri, source label)`` items read chunk by chunk from disk."""

    def __init__(
        self, root: str | Path, threshold: float = THRESHOLD, min_null_ratio: float = MIN_NULL_RATIO
    ) -> None:
        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if not meta_path.exists():
            raise IRIError(f"{self.root} holds no IRI set (no meta.json).")
        try:
            self.meta = read_json(meta_path)
        except DamagedEntry as exc:
            raise IRIError(
                f"The IRI set's metadata {meta_path} is damaged ({exc.why}); run "
                "generate_iris_set (or the experiment) again to regenerate the set."
            ) from None
        made = self.meta.get("format") if isinstance(self.meta, dict) else None
        if made != FORMAT_VERSION:
            raise IRIError(
                f"The IRI set in {self.root} is of store format {made} (this stitchlab reads "
                f"format {FORMAT_VERSION}: its recipes and presets differ); make it again "
                "with generate_iris_set, stitchlab iris or the experiment (the old folder "
                "can be deleted)."
            )
        if not self.meta.get("complete"):
            raise IRIError(
                f"The IRI set in {self.root} is incomplete; run generate_iris_set again to "
                "resume it."
            )
        try:
            self.chunk_size = int(self.meta["chunk_size"])
            self.n = int(self.meta["n"])
            self.box = tuple(float(v) for v in self.meta["recipe"]["box"])
            self.precision = str(self.meta["recipe"].get("precision", "uint8"))
            if self.chunk_size < 1 or self.n < 1 or len(self.box) != 2:
                raise ValueError("chunk_size and n must be >= 1, box two numbers")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IRIError(
                f"The IRI set's metadata {meta_path} is not what generate_iris_set writes "
                f"({type(exc).__name__}: {exc}); run it again to regenerate the set."
            ) from None
        self._cached: tuple[int, dict[str, Tensor]] | None = None
        stats = [self._chunk(i) for i in range(self.num_chunks)]
        self.rel_error = torch.cat([s["rel_error"] for s in stats])
        self.pixel_rms = torch.cat([s["pixel_rms"] for s in stats])
        self.labels = torch.cat([s["labels"] for s in stats])
        if not len(self.labels) == len(self.rel_error) == self.n:
            raise IRIError(
                f"The IRI set in {self.root} holds {len(self.labels)} IRIs where its metadata "
                f"says {self.n}; run generate_iris_set again to regenerate the set."
            )
        self.null_error = (
            torch.cat([s["null_error"] for s in stats])
            if all("null_error" in s for s in stats)
            else None
        )
        self.quality = IRIQuality.of(
            self.rel_error,
            self.pixel_rms,
            threshold,
            self.null_error,
            min_null_ratio,
            self.precision,
        )

    @property
    def num_chunks(self) -> int:
        """Number of chunk files."""
        return math.ceil(self.n / self.chunk_size)

    def _chunk(self, i: int) -> dict[str, Tensor]:
        if self._cached is not None and self._cached[0] == i:
            return self._cached[1]
        path = self.root / f"chunk_{i:05d}.safetensors"
        data = _load_chunk(path, self.meta["chunks"].get(str(i)))
        if data is None:
            raise IRIError(
                f"IRI chunk {path} is missing or damaged (checksum mismatch); run "
                "generate_iris_set again to regenerate it."
            )
        self._cached = (i, data)
        return data

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError(index)
        c = self._chunk(index // self.chunk_size)
        j = index % self.chunk_size
        return dequantise(c["iris"][j], self.box), int(c["labels"][j])

    def images(self) -> Tensor:
        """All IRIs as one float tensor (loads every chunk)."""
        return torch.cat(
            [dequantise(self._chunk(i)["iris"], self.box) for i in range(self.num_chunks)]
        )


def _load_chunk(path: Path, expected_sha: str | None) -> dict[str, Tensor] | None:
    from safetensors.torch import load_file

    if not path.exists() or expected_sha is None:
        return None
    if file_sha256(path) != expected_sha:
        return None
    try:
        return load_file(str(path))
    except Exception:
        return None


def generate_iris_set(
    model: nn.Module,
    point: str,
    data: DataLike,
    cache_dir: str | Path,
    *,
    seed: int = 0,
    chunk_size: int = 1024,
    threshold: float = THRESHOLD,
    min_null_ratio: float = MIN_NULL_RATIO,
    data_key: str | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    on_chunk: Callable[[int, int], None] | None = None,
    leaf_modules: tuple[type, ...] = (),
    output: int | str | None = None,
    **recipe,
) -> IRISet:
    """Generate (or reuse, or resume) the IRI set of ``data`` for ``model`` at ``point``.

    The set lives in ``cache_dir/<key>/`` where the key hashes the front prefix's weights,
    the point, the source data (or ``data_key``), the seed, the chunk size and the recipe.
    Chunks are written atomically with a checksum; a rerun skips finished chunks and
    regenerates missing or damaged ones, so an interrupted run finishes with the same
    bytes as an uninterrupted one. Memory does not grow with the data set size.

    ``on_chunk(i, num_chunks)`` is called after each finished chunk (progress, tests);
    ``leaf_modules`` and ``output`` say how to trace ``model`` (see :func:`stitchlab.split`).
    Returns the :class:`IRISet`; a set whose median error exceeds ``threshold``, or that is
    less than ``min_null_ratio`` times closer to its sources' representations than another
    real image is, is flagged (a warning here; :func:`stitchlab.stitch` refuses it unless
    told otherwise).
    """
    rec, dataset, front, dev, key_parts, key = _iris_set_key(
        model, point, data, seed, chunk_size, data_key, device, leaf_modules, output, recipe
    )
    root = Path(cache_dir) / key
    root.mkdir(parents=True, exist_ok=True)
    with lock(root / ".lock", f"the IRI set {root}"):  # a second process waits, then reuses
        return _fill_iris_set(
            root, key, key_parts, dataset, front, rec, seed, chunk_size, dev, progress,
            on_chunk, point, threshold, min_null_ratio,
        )  # fmt: skip


def _iris_set_key(
    model: nn.Module, point: str, data: DataLike, seed: int, chunk_size: int,
    data_key: str | None, device: str | torch.device | None, leaf_modules: tuple[type, ...],
    output: int | str | None, recipe: dict[str, Any],
) -> tuple[IRIRecipe, Dataset, nn.Module, torch.device, dict[str, Any], str]:  # fmt: skip
    """What :func:`generate_iris_set` keys a set by: the resolved recipe, the dataset, the
    front prefix, the device, the key's parts and the key."""
    rec = IRIRecipe.from_kwargs(**recipe)
    if chunk_size % rec.batch_size and chunk_size > rec.batch_size:
        raise ValueError(
            f"chunk_size ({chunk_size}) must be a multiple of the batch size ({rec.batch_size})"
        )
    dataset, _ = as_dataset(data, "data")
    dev = torch.device(device) if device is not None else _module_device(model)
    front = _recipe_front(model, point, leaf_modules, output, rec)
    if len(dataset):  # "auto" resolved against the front, so the key names what runs
        rec = rec.for_front(front, dataset[0][0].unsqueeze(0), dev)
    key_parts = {
        "format": FORMAT_VERSION,
        "front": model_fingerprint(front),
        "point": point,
        "data": data_key or data_fingerprint(dataset),
        "n": len(dataset),
        "seed": seed,
        "chunk_size": chunk_size,
        "recipe": rec.key_dict(),
    }
    if smooths_saturating(front):  # only a front made for the smooth gradient has them
        key_parts["saturating"] = SATURATING_RULE
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:24]
    return rec, dataset, front, dev, key_parts, key


def iris_set_stored(
    model: nn.Module, point: str, data: DataLike, cache_dir: str | Path, **options: Any
) -> bool:
    """Whether :func:`generate_iris_set` with these arguments (``options``: its keywords
    and the recipe's fields) would find its set complete in ``cache_dir`` (its chunks are
    not verified here; generating does that). For plans and time estimates: nothing is
    generated or written."""
    import inspect

    params = inspect.signature(generate_iris_set).parameters
    kw = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    recipe = {k: v for k, v in options.items() if k not in kw}
    kw.update({k: v for k, v in options.items() if k in kw})
    *_, key = _iris_set_key(
        model, point, data, kw["seed"], kw["chunk_size"], kw["data_key"], kw["device"],
        kw["leaf_modules"], kw["output"], recipe,
    )  # fmt: skip
    try:
        meta = read_json(Path(cache_dir) / key / "meta.json")
    except (FileNotFoundError, DamagedEntry):
        return False
    return meta.get("key") == key and bool(meta.get("complete"))


def _fill_iris_set(
    root: Path, key: str, key_parts: dict, dataset: Dataset, front: nn.Module,
    rec: IRIRecipe, seed: int, chunk_size: int, dev: torch.device, progress: bool,
    on_chunk: Callable[[int, int], None] | None, point: str, threshold: float,
    min_null_ratio: float,
) -> IRISet:  # fmt: skip
    from safetensors.torch import save_file

    meta_path = root / "meta.json"
    meta = None
    if meta_path.exists():
        try:
            meta = read_json(meta_path)
        except DamagedEntry as exc:
            warnings.warn(
                f"IRI metadata {meta_path} is damaged ({exc.why}); regenerating the set.",
                stacklevel=3,
            )
    if meta is None or meta.get("key") != key:
        meta = {**key_parts, "key": key, "chunks": {}, "complete": False}
        write_json(meta_path, meta)
    n = len(dataset)
    num_chunks = math.ceil(n / chunk_size)
    front = front.to(dev)
    fmt = None  # the front's memory format, chosen on the first batch that is generated
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_chunks, desc=f"IRIs {point}", leave=False)
    for c in range(num_chunks):
        path = root / f"chunk_{c:05d}.safetensors"
        expected = meta["chunks"].get(str(c))
        if expected is not None and path.exists() and file_sha256(path) == expected:
            if bar is not None:
                bar.update(1)
            continue
        if expected is not None:
            warnings.warn(f"IRI chunk {path} is damaged; regenerating it.", stacklevel=3)
        lo_i, hi_i = c * chunk_size, min(n, (c + 1) * chunk_size)
        subset = torch.utils.data.Subset(dataset, range(lo_i, hi_i))
        parts = []
        offset = lo_i
        for x, y in batches(subset, rec.batch_size, dev):
            _check_images(x, rec.box)  # outside the box they would be silently clamped
            if fmt is None:  # BatchNorm folded, and channels-last (in place) where chosen
                front, meta["batchnorm_folded"] = folded(front, x)
                fmt = memory_format_for(front, x)
                cl = fmt == torch.channels_last
                meta["memory_format"] = "channels_last" if cl else "contiguous"
            q, err_q, err_f, rms, null = _run_batch(front, x, rec, seed, offset, fmt)
            parts.append((q, y.cpu().long(), err_q, err_f, rms, null))
            offset += x.shape[0]
        tensors = {
            "iris": torch.cat([p[0] for p in parts]).contiguous(),
            "labels": torch.cat([p[1] for p in parts]).contiguous(),
            "rel_error": torch.cat([p[2] for p in parts]).float().contiguous(),
            "rel_error_float": torch.cat([p[3] for p in parts]).float().contiguous(),
            "pixel_rms": torch.cat([p[4] for p in parts]).float().contiguous(),
            "null_error": torch.cat([p[5] for p in parts]).float().contiguous(),
        }
        atomic_write(path, lambda p, t=tensors: save_file(t, p))
        meta["chunks"][str(c)] = file_sha256(path)
        write_json(meta_path, meta)
        if bar is not None:
            bar.update(1)
        if on_chunk is not None:
            on_chunk(c, num_chunks)
    if bar is not None:
        bar.close()
    meta["complete"] = True
    write_json(meta_path, meta)
    result = IRISet(root, threshold, min_null_ratio)
    if result.quality.flagged:
        warnings.warn(str(result.quality), stacklevel=3)
    return result


def clear_cache(cache_dir: str | Path) -> None:
    """Remove every stored IRI set under ``cache_dir``."""
    shutil.rmtree(cache_dir, ignore_errors=True)
