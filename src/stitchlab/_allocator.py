"""Keeping freed memory in the process on the CPU (glibc).

glibc's ``malloc`` serves every block above 32 MB (its largest ``mmap`` threshold) with a
fresh ``mmap`` and returns it to the kernel on ``free``; it also trims freed memory at the
top of the heap. A network at ImageNet sizes allocates and frees activation buffers of
hundreds of megabytes in every forward and backward pass, so every step touches new pages,
and the kernel's page faults take more CPU time than the arithmetic
(``benchmarks/iri_memory.py``). :func:`keep_freed_memory` tells glibc to serve large blocks
from the heap and never trim it, so buffers freed by one step are reused by the next: the
process keeps its peak memory (as it would with the caching allocators of CUDA, jemalloc or
tcmalloc) instead of asking the kernel for it again. The two places that allocate such
buffers apply it on the CPU: IRI generation and the :class:`~stitchlab.Stitcher`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (once per process); True where it applies
    (Linux with glibc), False elsewhere, where nothing changes."""
    global _applied
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):  # not glibc (musl has no mallopt)
                return False
            mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            # no mmap for large blocks (they come from the heap), and never trim the heap
            _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(
                mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
            )
    return _applied
