"""keep_freed_memory: a freed large buffer is reused, not faulted in again."""

import resource
import sys

import pytest
import torch

from stitchlab._allocator import keep_freed_memory


def _faults_of_a_fresh_buffer(mb: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buf = torch.empty(mb * 2**20 // 4).fill_(1.0)  # touches every page
    del buf
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_buffer_is_reused():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # once per process; the second call changes nothing
    pages = 256 * 2**20 // resource.getpagesize()
    _faults_of_a_fresh_buffer(256)  # the heap grows to hold it once
    again = _faults_of_a_fresh_buffer(256)
    assert again < pages // 20  # glibc's default would map and fault all 65,536 pages again
