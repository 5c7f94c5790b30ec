"""Content fingerprints of data sets: what a store key of data hashes."""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset

from .folders import ImageFolderDataset
from .mnist import ColouredMNIST
from .speech import WaveformDataset
from .tensors import ImageTensorDataset

__all__ = ["fingerprint", "hash_tensor"]


def hash_tensor(h, t: Tensor) -> None:
    """Feed ``dtype|shape|`` and the raw bytes of ``t`` into the hash ``h``."""
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def fingerprint(dataset: Dataset) -> str:
    """SHA-256 of what a data set holds: its tensors (in-memory sets), its files' names,
    sizes and modification times (image folders), its indices (subsets); other data sets
    are read item by item. Two data sets with one fingerprint give the same items."""
    h = hashlib.sha256()
    _fingerprint_into(h, dataset)
    return h.hexdigest()


def _fingerprint_into(h, ds: Dataset) -> None:
    h.update(type(ds).__name__.encode())
    if isinstance(ds, Subset):
        hash_tensor(h, torch.as_tensor(ds.indices, dtype=torch.long))
        _fingerprint_into(h, ds.dataset)
    elif isinstance(ds, ImageTensorDataset) and ds.transform is None:
        hash_tensor(h, ds.images)
        hash_tensor(h, ds.targets)
    elif isinstance(ds, WaveformDataset) and ds.transform is None:
        h.update(f"{ds.sample_rate}|{ds.classes}".encode())
        hash_tensor(h, ds.waveforms)
        hash_tensor(h, ds.targets)
    elif isinstance(ds, TensorDataset):
        for t in ds.tensors:
            hash_tensor(h, t)
    elif isinstance(ds, ImageFolderDataset) and ds.transform is None:
        h.update(f"{ds.size}|{ds.classes}".encode())
        for path, label in ds.samples:
            st = path.stat()
            h.update(f"{path.relative_to(ds.root)}|{label}|{st.st_size}|{st.st_mtime_ns}".encode())
    elif isinstance(ds, ColouredMNIST) and ds.transform is None:
        h.update(ds.variant.encode())
        hash_tensor(h, ds.colour_index)
        hash_tensor(h, ds.targets)
        _fingerprint_into(h, ds.digits)
    else:  # read every item (slow for big sets, but never wrong)
        for i in range(len(ds)):  # type: ignore[arg-type]
            x, y = ds[i][:2]
            hash_tensor(h, torch.as_tensor(x))
            h.update(str(int(y)).encode())
