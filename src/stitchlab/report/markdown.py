"""Markdown tables for the text reports (benchmarks, validation pages)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd


def markdown_table(
    rows: pd.DataFrame | Sequence[Mapping[str, Any]], float_format: str | None = None
) -> str:
    """A markdown table of ``rows`` (dicts, or a DataFrame's rows).

    Columns are the union of the rows' keys in first-seen order; a missing value, ``None``
    or NaN is an empty cell; floats use ``float_format`` (e.g. ``".1f"``) when given.
    """
    if isinstance(rows, pd.DataFrame):
        cols = [str(c) for c in rows.columns]
        records = [{str(k): v for k, v in r.items()} for r in rows.to_dict("records")]
    else:
        records, cols = list(rows), []
        for r in records:
            cols += [c for c in r if c not in cols]

    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float) and float_format:
            return format(v, float_format)
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in records]
    return "\n".join(lines)
