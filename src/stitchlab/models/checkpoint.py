"""Checkpoints: safetensors weights with a JSON description; loading never runs code.

A checkpoint is one ``.safetensors`` file. Its metadata holds a JSON description under the
key ``stitchlab``: ``architecture`` and ``options`` (what :func:`stitchlab.models.create`
needs), ``num_classes``, and whatever the writer adds (data, recipe, seed, accuracy, ...).

External PyTorch files (``.pt``, ``.pth``, ``.bin``) are read only through
``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["CheckpointError", "save", "load", "describe", "read_weights", "FORMAT"]

FORMAT = "stitchlab-checkpoint-1"
_META_KEY = "stitchlab"
_MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged, unsafe or does not fit the model."""


def _jsonable(value: Any, key: str) -> Any:
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Path):
        return str(value)
    if (isinstance(value, Tensor) and value.numel() == 1) or (
        hasattr(value, "item") and getattr(value, "ndim", None) == 0  # numpy scalars
    ):
        return _jsonable(value.item(), key)
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{key}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"description value {key!r} of type {type(value).__name__} cannot be written as "
        "JSON; pass numbers, strings, lists or dicts."
    )


def _description_of(model: nn.Module, description: dict[str, Any]) -> dict[str, Any]:
    desc: dict[str, Any] = {
        "format": FORMAT,
        "architecture": getattr(model, "stitchlab_name", None),
        "num_classes": getattr(model, "stitchlab_num_classes", None),
        "options": dict(getattr(model, "stitchlab_options", {}) or {}),
    }
    for k, v in description.items():
        desc[k] = _jsonable(v, k)
    desc["options"] = _jsonable(desc["options"], "options")
    return desc


def _atomic_write(path: Path, write) -> None:
    from ..store import atomic_write

    atomic_write(path, write)


def tensors_sha256(tensors: dict[str, Tensor]) -> str:
    """SHA-256 of named tensors: names, dtypes, shapes and bytes, in sorted name order."""
    import hashlib

    from ..data.fingerprint import hash_tensor

    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(f"{name}|".encode())
        hash_tensor(h, tensors[name])
    return h.hexdigest()


def _verify(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None) -> None:
    """Refuse tensors whose checksum differs from the one stored at save time."""
    expected = (metadata or {}).get("sha256")
    if expected is not None and tensors_sha256(tensors) != expected:
        raise CheckpointError(
            f"{str(path)!r} is damaged: its tensors do not match the checksum written with "
            "them (the file was changed after it was saved, e.g. a header dtype or the "
            "bytes). Retrain or restore the file; stitchlab will not use it."
        )


def save(model: nn.Module, path: str | os.PathLike, **description: Any) -> Path:
    """Write ``model``'s weights to ``path`` (safetensors) with a JSON description.

    The architecture, class count and options of a model built by
    :func:`stitchlab.models.create` are recorded automatically; keyword arguments
    (data, recipe, seed, accuracy, ...) are added to the description. The file is
    written atomically. Returns the path.
    """
    from safetensors.torch import save_file

    path = Path(path)
    desc = _description_of(model, description)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    metadata = {
        _META_KEY: json.dumps(desc, sort_keys=True),
        "format": FORMAT,
        "sha256": tensors_sha256(tensors),
    }
    _atomic_write(path, lambda p: save_file(tensors, p, metadata=metadata))
    return path


def _safetensors_header(path: Path) -> dict[str, Any] | None:
    """The JSON header of a safetensors file, or None when the file is not one."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > _MAX_HEADER:
            return None
        raw = f.read(n)
    if len(raw) < n or not raw.lstrip().startswith(b"{"):
        return None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return header if isinstance(header, dict) else None


def _check_exists(path: Path) -> None:
    if not path.exists():
        raise CheckpointError(f"Checkpoint {str(path)!r} does not exist.")
    if path.is_dir():
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is a folder; pass the .safetensors file inside it."
        )


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON description stored in a stitchlab checkpoint (reads the header only)."""
    path = Path(path)
    _check_exists(path)
    header = _safetensors_header(path)
    if header is None:
        raise CheckpointError(
            f"{str(path)!r} is not a safetensors file (or it is damaged); only stitchlab "
            "checkpoints carry a description."
        )
    meta = header.get("__metadata__") or {}
    if _META_KEY not in meta:
        raise CheckpointError(
            f"{str(path)!r} is a safetensors file without a stitchlab description; load its "
            "weights with read_weights() or load(path, architecture=...)."
        )
    try:
        desc = json.loads(meta[_META_KEY])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"The description in {str(path)!r} is damaged: {exc}") from exc
    if not isinstance(desc, dict):
        raise CheckpointError(f"The description in {str(path)!r} is not a JSON object.")
    return desc


def _unwrap_state_dict(obj: Any, path: Path) -> dict[str, Tensor]:
    """The state dict inside a loaded ``.pt`` object (plain, or under a common key)."""
    for key in ("state_dict", "model", "model_state_dict", "net"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(
            f"{str(path)!r} does not hold a state dict of tensors (found "
            f"{type(obj).__name__}); save weights with model.state_dict()."
        )
    prefix = "module."
    if obj and all(k.startswith(prefix) for k in obj):  # DataParallel checkpoints
        obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return dict(obj)


def read_weights(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> dict:
    """The tensors of a checkpoint: safetensors, or a ``.pt`` file via weights_only loading."""
    path = Path(path)
    _check_exists(path)
    if _safetensors_header(path) is not None:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                metadata = f.metadata()
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(
                f"{str(path)!r} is damaged (truncated or corrupt safetensors): {exc}"
            ) from exc
        _verify(path, tensors, metadata)
        _check_no_nan(path, tensors)
        return tensors
    try:
        obj = torch.load(str(path), map_location=device, weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"{str(path)!r} could not be read safely: it is neither a safetensors file nor a "
            f"PyTorch file of plain tensors (loading refuses stored code). Detail: {exc}"
        ) from exc
    weights = _unwrap_state_dict(obj, path)
    _check_no_nan(path, weights)
    return weights


def _check_no_nan(path: Path, tensors: dict[str, Tensor]) -> None:
    """Refuse weights with a NaN: every score of such a model would be NaN or meaningless.
    (Infinite values are allowed: some models store -inf attention masks as buffers.)"""
    bad = [k for k, t in tensors.items() if t.is_floating_point() and bool(t.isnan().any())]
    if bad:
        raise CheckpointError(
            f"{str(path)!r} holds NaN weights in {len(bad)} tensor(s) ({', '.join(bad[:3])}): "
            "the model diverged in training or the file is damaged; stitchlab does not score "
            "it. Use a checkpoint saved before the divergence."
        )


def _load_into(model: nn.Module, weights: dict[str, Tensor], path: Path) -> None:
    _load_check(model, weights, path)
    model.load_state_dict(weights, strict=True)


def _load_check(model: nn.Module, weights: dict[str, Tensor], path: Path) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    wrong = [
        f"{k}: file {tuple(weights[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in weights and tuple(weights[k].shape) != tuple(v.shape)
    ]
    wrong_dtype = [
        f"{k}: file dtype {weights[k].dtype} vs model {v.dtype}"
        for k, v in expected.items()
        if k in weights and weights[k].dtype != v.dtype and v.is_floating_point()
    ]
    if missing or unexpected or wrong or wrong_dtype:
        parts = []
        if wrong:
            parts.append(f"shape mismatch ({len(wrong)}): " + "; ".join(wrong[:3]))
        if wrong_dtype:
            parts.append(f"dtype mismatch ({len(wrong_dtype)}): " + "; ".join(wrong_dtype[:3]))
        if missing:
            parts.append(f"missing ({len(missing)}): " + ", ".join(missing[:5]))
        if unexpected:
            parts.append(f"unexpected ({len(unexpected)}): " + ", ".join(unexpected[:5]))
        raise CheckpointError(
            f"The weights in {str(path)!r} do not fit the model "
            f"{getattr(model, 'stitchlab_name', type(model).__name__)}: "
            + " | ".join(parts)
            + ". Check the architecture and its options (width, stem, num_classes)."
        )


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}  # fmt: skip


def _build(path: Path, create, arch: str, num_classes: int, opts: dict, meta: bool = False):
    """The described model (on the meta device: no memory for its weights)."""
    try:  # the weights come from the file: the caller's random state is not consumed
        with torch.random.fork_rng(devices=[]):
            if meta:
                with torch.device("meta"):
                    return create(arch, num_classes=num_classes, **opts)
            return create(arch, num_classes=num_classes, **opts)
    except (KeyError, TypeError, ValueError, RuntimeError, NotImplementedError) as exc:
        if meta and not isinstance(exc, (KeyError, TypeError, ValueError)):
            return None  # a model that cannot be built on the meta device: checked later
        msg = exc.args[0] if exc.args else exc
        raise CheckpointError(
            f"Cannot rebuild the model of {str(path)!r} ({arch}, options {opts}): {msg}"
        ) from None


def _check_header_fits(path: Path, header: dict, model: nn.Module | None) -> None:
    """Refuse a file whose tensor table does not fit the described model, before the model
    is allocated (a small file claiming a huge width is refused at no memory cost)."""
    if model is None:
        return
    entries = {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    weights = {
        k: torch.empty(tuple(v.get("shape", ())), dtype=_DTYPES.get(v.get("dtype"), torch.uint8),
                       device="meta")
        for k, v in entries.items()
    }  # fmt: skip
    _load_check(model, weights, path)


def _check_description(path: Path, desc: dict[str, Any]) -> None:
    """Refuse a (hand-edited) description whose fields that rebuild the model do not have
    their types: ``architecture`` a name, ``num_classes`` a count >= 1, ``options`` a
    table."""
    arch = desc.get("architecture")
    k = desc.get("num_classes")
    opts = desc.get("options")
    bad = None
    if arch is not None and (not isinstance(arch, str) or not arch.strip()):
        bad = f"architecture must be a model name, got {arch!r}"
    elif k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        bad = f"num_classes must be a whole number >= 1, got {k!r}"
    elif opts is not None and not isinstance(opts, dict):
        bad = f"options must be a table of model options, got {opts!r}"
    if bad:
        raise CheckpointError(
            f"The description in {str(path)!r} is not one stitchlab wrote: {bad}. Repair "
            "the description, or pass architecture=, num_classes= and the options to load()."
        )


def load(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    architecture: str | None = None,
    num_classes: int | None = None,
    **options: Any,
) -> nn.Module:
    """Rebuild a model from a checkpoint, in eval mode, on ``device``.

    A stitchlab checkpoint describes its architecture; for other files (safetensors or
    ``.pt`` state dicts) pass ``architecture``, ``num_classes`` and the model options.
    Arguments given here override the description. The description is attached to the
    model as ``model.stitchlab_description``.
    """
    from . import create

    path = Path(path)
    _check_exists(path)
    desc: dict[str, Any] = {}
    header = _safetensors_header(path)
    if header is not None and _META_KEY in (header.get("__metadata__") or {}):
        desc = describe(path)
        _check_description(path, desc)
    arch = architecture or desc.get("architecture")
    if not arch:
        raise CheckpointError(
            f"{str(path)!r} does not say which architecture it holds; pass "
            "architecture=... (and num_classes=..., options) to load()."
        )
    k = num_classes if num_classes is not None else desc.get("num_classes")
    opts = {**(desc.get("options") or {}), **options}
    num = int(k) if k is not None else 10
    if header is not None:  # shapes and dtypes checked before any weight is allocated
        _check_header_fits(path, header, _build(path, create, arch, num, opts, meta=True))
    model = _build(path, create, arch, num, opts)
    weights = read_weights(path)
    _load_into(model, weights, path)
    model.stitchlab_description = desc  # type: ignore[assignment]
    return model.to(device).eval()
