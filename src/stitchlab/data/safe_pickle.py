"""Reading data pickles (CIFAR batches) without ever running code stored in them.

A pickle can name any importable callable and call it while loading. CIFAR batches hold
only dicts, lists, strings, bytes, numbers and numpy arrays, so the unpickler below
resolves exactly three names (numpy's array reconstruction, ``numpy.ndarray`` and
``numpy.dtype``) and refuses every other one *before* anything is called.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from .tensors import DataFileError

__all__ = ["UnsafePickleError", "safe_load", "ALLOWED_GLOBALS"]


def _reconstruct() -> Any:
    try:
        from numpy._core.multiarray import _reconstruct as fn
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct as fn  # type: ignore[no-redef]
    return fn


_RECONSTRUCT = _reconstruct()

#: (module, name) -> object: the only globals a data pickle may name.
ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


#: Harmless names that only Python 3 re-writes of data pickles use (refused all the same).
_REWRITTEN = {
    ("_codecs", "encode"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.numeric", "_frombuffer"),
}


class UnsafePickleError(DataFileError):
    """A pickle names something other than plain data; nothing in it was executed."""


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, *, source: str) -> None:
        super().__init__(file, encoding="latin1")
        self._source = source

    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        obj = ALLOWED_GLOBALS.get((module, name))
        if obj is None:
            hint = "The file is damaged or malicious"
            if (module, name) in _REWRITTEN:
                hint = (
                    "It looks re-written by Python 3 with pickle protocol 2 or 5, which this "
                    "reader does not accept; use the original release or re-save it with "
                    "protocol 4"
                )
            raise UnsafePickleError(
                f"Refusing to load {self._source}: it asks to run {module}.{name}, which a "
                "data file never needs (a CIFAR batch holds only dicts, lists, strings and "
                f"numpy arrays). {hint}; nothing was executed. Replace it with a fresh copy "
                "of the data set."
            )
        return obj

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise UnsafePickleError(
            f"Refusing to load {self._source}: it uses persistent ids, which data files do not."
        )


def _check_arrays(obj: Any, source: str, depth: int = 0) -> None:
    """Refuse object arrays (their items could only come from a crafted file)."""
    if depth > 20:
        return
    if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
        raise UnsafePickleError(f"Refusing {source}: it holds an object array, not image data.")
    if isinstance(obj, dict):
        for v in obj.values():
            _check_arrays(v, source, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj[:16]:
            _check_arrays(v, source, depth + 1)


def safe_load(path: str | os.PathLike) -> Any:
    """Unpickle a data file, allowing only plain data and numpy arrays.

    Raises :class:`UnsafePickleError` for a file that names any other global (the name is
    refused before it is imported or called) and :class:`DataFileError` for a damaged one.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{str(path)!r} does not exist or is not a file.")
    data = path.read_bytes()
    source = repr(str(path))
    try:
        obj = _RestrictedUnpickler(io.BytesIO(data), source=source).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # truncated, garbage, wrong format
        raise DataFileError(
            f"{source} is damaged or not a pickle file ({type(exc).__name__}: {exc}). "
            "Replace it with a fresh copy of the data set."
        ) from exc
    _check_arrays(obj, source)
    return obj
