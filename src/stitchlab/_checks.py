"""Checks of settings objects at the edge: every field has the type it declares."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

__all__ = ["check_field_types", "read_table_config", "check_class_labels", "check_device"]


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits ``hint`` (None when the hint is not one we check)."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        results = [_matches(value, h) for h in typing.get_args(hint)]
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list) or hint in (tuple, list):
        return isinstance(value, (tuple, list))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return None


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "None"
    return getattr(hint, "__name__", str(hint))


def check_field_types(obj: Any, what: str) -> None:
    """Raise ``TypeError`` naming the field when a dataclass field's value does not have
    its declared type (``epochs = 8.5`` for an ``int``, ``lr = "fast"`` for a ``float``)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        hint = hints.get(f.name)
        value = getattr(obj, f.name)
        if hint is None or _matches(value, hint) is not False:
            continue
        raise TypeError(
            f"{what} {f.name} must be {_describe(hint)}, got {value!r} ({type(value).__name__})"
        )


def read_table_config(path: Any, table: str) -> dict[str, Any]:
    """The ``[table]`` of a TOML config that holds that one table (plus ``name`` and
    ``description``): the shared form of the oracle and compare configs."""
    import tomllib

    with open(path, "rb") as f:
        raw = tomllib.load(f)
    extra = sorted(set(raw) - {table, "name", "description"})
    if extra or table not in raw:
        article = "an" if table[0] in "aeiou" else "a"
        raise ValueError(f"{path}: {article} {table} config has one [{table}] table (and "
                         f"name, description); got {sorted(raw)}")  # fmt: skip
    return dict(raw[table])


def check_class_labels(labels: Any, num_classes: int, what: str = "data") -> None:
    """Refuse labels that are not classes of a model with ``num_classes`` outputs: the
    error names the first label outside ``0..num_classes - 1`` and its index (such a label
    would count as a wrong prediction, or reach an index error inside a loss)."""
    import torch

    from ._data import DataError

    y = torch.as_tensor(labels).flatten()
    if not y.numel():
        return
    bad = ((y < 0) | (y >= num_classes)).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{what}: label {y[i].item()} (index {i}) is outside 0..{num_classes - 1}, the "
            f"classes of the model's {num_classes} outputs ({len(bad)} such label"
            f"{'s' if len(bad) > 1 else ''}); check the labels or the model's num_classes."
        )


def check_device(device: Any, what: str = "device") -> Any:
    """``device`` as a ``torch.device``, or a clear error: a kind stitchlab runs on (cpu,
    cuda, cuda:N, mps) that this machine has."""
    import torch

    from .vocabulary import DEVICE_KINDS

    kinds = f"{', '.join(DEVICE_KINDS)} (or cuda:N)"
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{what} must be a string such as 'cpu' or 'cuda:0', got {device!r}")
    kind = device.type if isinstance(device, torch.device) else device.split(":")[0]
    if kind not in DEVICE_KINDS:
        raise ValueError(f"{what} {str(device)!r} is none of {kinds}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{what} {device!r} is not a device name; use one of {kinds}") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise ValueError(f"{what} is {str(device)!r} but this machine has no CUDA GPU; "
                             "use device='cpu'")  # fmt: skip
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{what} is {str(device)!r} but this machine has {count} CUDA "
                             f"GPU(s): cuda:0..cuda:{count - 1}")  # fmt: skip
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{what} is 'mps' but MPS is not available here; use device='cpu'")
    return dev
