"""The one way stitchlab writes and reads its files: atomic, checksummed, locked.

Every file the store writes (stitch-run rows, IRI metadata and chunks, checkpoints, training
state, tables) goes through :func:`atomic_write`: a temporary file with a unique name in the
same folder, then one ``os.replace``, so a reader never sees half a file and two processes
never share a temporary file. Files are created with the process's umask (``0644`` under
the usual ``022``), so a store can be shared by a group.

JSON entries carry a SHA-256 checksum of their content (:func:`write_json`,
:func:`read_json`): a truncated, edited or otherwise damaged entry raises
:class:`DamagedEntry` naming its path, and the job that owns it recomputes it.

:func:`lock` is an exclusive advisory lock (``flock``) on a lock file: a second process that
wants to compute the same job waits for the first one and then reuses its result. The lock
is released by the kernel when its holder dies, so a killed run never leaves a stale lock.

This module does not import torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DamagedEntry",
    "atomic_write",
    "write_bytes",
    "write_text",
    "write_json",
    "read_json",
    "json_checksum",
    "stable_hash",
    "file_sha256",
    "lock",
]

log = logging.getLogger("stitchlab.store")

CHECKSUM_KEY = "_sha256"


class DamagedEntry(RuntimeError):
    """A store file exists but cannot be trusted (truncated, edited, wrong checksum)."""

    def __init__(self, path: str | os.PathLike, why: str) -> None:
        self.path = Path(path)
        self.why = why
        super().__init__(f"{self.path}: {why}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a uniquely named temporary file beside ``path``, then
    move it into place in one step. The file gets the umask's permissions (not 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda p: Path(p).write_bytes(data))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes(path, text.encode())


def stable_hash(obj: Any, length: int = 16) -> str:
    """A store key: the SHA-256 of a JSON-serialisable object's text (keys sorted, so
    independent of their order), its first ``length`` hex digits."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def json_checksum(obj: dict[str, Any]) -> str:
    """SHA-256 of a JSON object's canonical text, without its checksum field."""
    body = {k: v for k, v in obj.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def write_json(path: str | os.PathLike, obj: dict[str, Any]) -> Path:
    """Write a JSON object atomically, with its checksum under ``"_sha256"``."""
    if not isinstance(obj, dict):
        raise TypeError(f"write_json writes JSON objects (dicts), got {type(obj).__name__}")
    body = {k: v for k, v in obj.items() if k != CHECKSUM_KEY}
    body[CHECKSUM_KEY] = json_checksum(body)
    return write_text(path, json.dumps(body, indent=1, sort_keys=True))


def read_json(path: str | os.PathLike, *, checksum: bool = True) -> dict[str, Any]:
    """Read a JSON object written by :func:`write_json`; raise :class:`DamagedEntry` if it
    is not valid JSON, not an object, or (with ``checksum``) its checksum is missing or
    wrong. A missing file raises ``FileNotFoundError``."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedEntry(path, f"not valid JSON ({exc}); it was probably truncated") from None
    if not isinstance(obj, dict):
        raise DamagedEntry(path, f"expected a JSON object, found {type(obj).__name__}")
    if checksum:
        stored = obj.get(CHECKSUM_KEY)
        if stored is None:
            raise DamagedEntry(path, "no checksum (written by an older stitchlab, or by hand)")
        if stored != json_checksum(obj):
            raise DamagedEntry(path, "checksum mismatch: the file was changed after it was written")
    obj.pop(CHECKSUM_KEY, None)
    return obj


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def lock(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed) for the ``with`` block.

    Another process holding it makes this one wait (logged once, naming ``what``). On
    systems without ``fcntl`` the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process computing %s (%s)", what or path, path)
            t0 = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            log.info("lock on %s acquired after %.1f s", path, time.monotonic() - t0)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
