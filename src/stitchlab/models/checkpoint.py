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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


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
    metadata = {_META_KEY: json.dumps(desc, sort_keys=True), "format": FORMAT}
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
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device=str(device))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(
                f"{str(path)!r} is damaged (truncated or corrupt safetensors): {exc}"
            ) from exc
    try:
        obj = torch.load(str(path), map_location=device, weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"{str(path)!r} could not be read safely: it is neither a safetensors file nor a "
            f"PyTorch file of plain tensors (loading refuses stored code). Detail: {exc}"
        ) from exc
    return _unwrap_state_dict(obj, path)


def _load_into(model: nn.Module, weights: dict[str, Tensor], path: Path) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    wrong = [
        f"{k}: file {tuple(weights[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in weights and weights[k].shape != v.shape
    ]
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            parts.append(f"shape mismatch ({len(wrong)}): " + "; ".join(wrong[:3]))
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
    model.load_state_dict(weights, strict=True)


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
    arch = architecture or desc.get("architecture")
    if not arch:
        raise CheckpointError(
            f"{str(path)!r} does not say which architecture it holds; pass "
            "architecture=... (and num_classes=..., options) to load()."
        )
    k = num_classes if num_classes is not None else desc.get("num_classes")
    opts = {**(desc.get("options") or {}), **options}
    try:
        model = create(arch, num_classes=int(k) if k is not None else 10, **opts)
    except (KeyError, TypeError, ValueError) as exc:
        msg = exc.args[0] if exc.args else exc
        raise CheckpointError(f"Cannot rebuild the model of {str(path)!r}: {msg}") from exc
    weights = read_weights(path)
    _load_into(model, weights, path)
    model.stitchlab_description = desc  # type: ignore[assignment]
    return model.to(device).eval()
