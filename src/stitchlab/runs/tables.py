"""The one writer of a run's tables: CSV for people and spreadsheets, Parquet with the exact
typed values for pandas, both written atomically through :mod:`stitchlab.store`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store import atomic_write, write_text

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["write_table", "read_table"]

#: Floats in CSV files: six significant digits (Parquet keeps every digit).
CSV_FLOAT_FORMAT = "%.6g"


def write_table(
    path: str | Path,
    rows: pd.DataFrame | Sequence[dict[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    parquet: bool = False,
) -> pd.DataFrame:
    """Write a table as CSV at ``path`` (and as Parquet beside it, ``path`` with the
    suffix ``.parquet``, when ``parquet``); returns it as a DataFrame.

    ``rows``: a DataFrame or dicts; ``columns``: the columns and their order (others
    dropped, missing ones empty; default: all, in order of first appearance). Missing
    values and NaN are empty cells in the CSV; floats have six significant digits there.
    Raises ``ValueError`` for a table without columns."""
    import pandas as pd

    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if columns is not None:
        df = df.reindex(columns=list(columns))
    if not len(df.columns):
        raise ValueError(f"{Path(path).name}: a table needs at least one column")
    path = Path(path)
    write_text(path, df.to_csv(index=False, float_format=CSV_FLOAT_FORMAT))
    if parquet:
        atomic_write(path.with_suffix(".parquet"), lambda p: df.to_parquet(p, index=False))
    return df


def read_table(path: str | Path) -> pd.DataFrame:
    """A table written by :func:`write_table`: its Parquet file where there is one (exact
    values and types), else its CSV."""
    import pandas as pd

    path = Path(path)
    exact = path.with_suffix(".parquet")
    return pd.read_parquet(exact) if exact.exists() else pd.read_csv(path)
