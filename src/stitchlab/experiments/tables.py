"""An experiment's per-pair table and its example IRIs (the tables themselves are written by
:func:`stitchlab.runs.write_table`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..store import atomic_write

__all__ = ["pair_rows", "write_examples"]


def pair_rows(fronts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per pair (means over its front seeds) from the front jobs' results."""
    by_pair: dict[str, list[dict[str, Any]]] = {}
    for r in fronts:
        by_pair.setdefault(r["pair"], []).append(r)
    rows = []
    for pair, rs in by_pair.items():
        rows.append({
            "pair": pair, "front": "+".join(r["front"] for r in rs), "back": rs[0]["back"],
            "front_agreement": sum(r["front_agreement"] for r in rs) / len(rs),
            "front_accuracy": sum(r["front_accuracy"] for r in rs) / len(rs),
            "back_accuracy": rs[0]["back_accuracy"],
        })  # fmt: skip
    return rows


def write_examples(path: Path, exp_raw: dict[str, Any], iri_paths: dict, k: int) -> None:
    """A few IRIs per (front, point) next to their sources, for the report."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    from ..iris import IRISet, quantise
    from ..vocabulary import SPEECH_KINDS
    from .datasets import stitch_data

    data_table = exp_raw["data"]
    audio = data_table["kind"] in SPEECH_KINDS  # waveforms: float32, with their sample rate

    def stored(xs: list) -> np.ndarray:
        x = torch.stack(xs)
        return x.float().numpy() if audio else quantise(x).numpy()

    tensors: dict[str, np.ndarray] = {}
    meta: dict[str, str] = {}
    if audio:
        meta["sample_rate"] = str(int(data_table["options"].get("sample_rate", 8000)))
    # keys (front, point, marker, random start): each (front, point)'s lowest start
    order = sorted(iri_paths.items(), key=lambda kv: (str(kv[0][:3]), kv[0][3]))
    for (front, point, marker, _), info in order:
        key = f"iris/{front}/{point}"
        if key in tensors:
            continue
        iri_set = IRISet(info["path"])
        n = min(k, len(iri_set))
        tensors[key] = stored([iri_set[i][0] for i in range(n)])
        meta[f"errors/{front}/{point}"] = json.dumps(
            [round(float(e), 4) for e in iri_set.rel_error[:n]]
        )
        if "source" not in tensors:
            data = stitch_data(exp_raw, marker)
            tensors["source"] = stored([data[i][0] for i in range(n)])
    atomic_write(path, lambda p: save_file(tensors, p, metadata=meta))
