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
    _faults_of_a_fresh_buffer(256)  # the heap grows to hold it
    # the heap may still grow in a later round (measured: in one test run the third buffer
    # faulted every page again, in a plain process none after the first); glibc's default
    # maps and faults all 65,536 pages in every round
    rounds = [_faults_of_a_fresh_buffer(256) for _ in range(8)]
    reused = sum(r < pages // 20 for r in rounds)
    assert reused >= 6, rounds
