"""Reading and checking the result files of a run directory (no torch, no stitching code)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..vocabulary import IRI_TRANSFER_COLUMNS, describe_iri_recipe

__all__ = [
    "ReportInputError",
    "MissingColumnError",
    "MissingResultsError",
    "RunData",
    "IRIExamples",
    "RESULTS_REQUIRED",
    "load_results",
    "load_pairs",
    "load_cka",
    "load_iris_examples",
    "load_run",
    "wav_bytes",
]

RESULTS_FILE = "results.csv"
PAIRS_FILE = "pairs.csv"
CKA_FILE = "cka.csv"
EXAMPLES_FILE = "iris_examples.safetensors"
RUN_FILE = "run.json"

RESULTS_REQUIRED: tuple[str, ...] = (
    "experiment", "pair", "front", "back", "point", "point_index", "objective", "protocol",
    "seed", "agreement", "agreement_normalized", "accuracy", "hard_agreement",
    "error_consistency", "reference_accuracy", "init_residual", "seconds",
)  # fmt: skip
RESULTS_OPTIONAL_NUMERIC: tuple[str, ...] = (
    "agreement_ci_low", "agreement_ci_high", "iri_median_error", "iri_p90_error",
    "iri_pixel_rms", "iri_null_median", "iri_null_ratio", "agreement_rolled",
    "excess_agreement", "robust_agreement", "stitch_seed", "iri_seed", *IRI_TRANSFER_COLUMNS,
)  # fmt: skip
_RESULTS_TEXT = ("experiment", "pair", "front", "back", "point", "objective", "protocol")
_RESULTS_INT = ("point_index", "seed")
PAIRS_REQUIRED: tuple[str, ...] = ("pair", "front_agreement")
CKA_REQUIRED: tuple[str, ...] = ("pair", "point", "point_index", "data", "cka")

_NA = {"", "nan", "NaN", "NAN", "NA", "N/A", "n/a", "null", "None", "none", "<NA>"}
_TRUE = {"true", "1", "1.0", "yes", "y", "t"}
_FALSE = {"false", "0", "0.0", "no", "n", "f"}


class ReportInputError(ValueError):
    """A result file of a run directory cannot be used for the report."""


class MissingColumnError(ReportInputError):
    """A table lacks required columns; ``path`` and ``columns`` say which."""

    def __init__(self, path: Path, columns: Sequence[str], required: Sequence[str]) -> None:
        self.path = Path(path)
        self.columns = tuple(columns)
        names = ", ".join(repr(c) for c in self.columns)
        plural = "s" if len(self.columns) > 1 else ""
        super().__init__(
            f"{self.path.name} ({self.path}) is missing required column{plural} {names}; "
            f"required columns: {', '.join(required)}"
        )


class MissingResultsError(ReportInputError, FileNotFoundError):
    """The run directory has no ``results.csv``."""


@dataclass
class IRIExamples:
    """Example IRIs: ``source`` (k, C, H, W) uint8 and ``iris[(front, point)]`` likewise,
    with the relative errors ``errors[(front, point)]`` when the file records them. Audio
    examples (``sample_rate`` set) are float32 waveforms (k, 1, T) in [-1, 1]."""

    source: np.ndarray
    iris: dict[tuple[str, str], np.ndarray]
    errors: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    sample_rate: int | None = None  # None: images

    @property
    def is_audio(self) -> bool:
        """True for waveform examples."""
        return self.sample_rate is not None


@dataclass
class RunData:
    """Everything the report reads from a run directory; ``notes`` lists what was missing."""

    run_dir: Path
    results: pd.DataFrame
    pairs: pd.DataFrame | None = None
    cka: pd.DataFrame | None = None
    examples: IRIExamples | None = None
    iri_recipe: str | None = None  # the resolved IRI recipe, described (from run.json)
    notes: list[str] = field(default_factory=list)


def _read_text_table(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError as exc:
        raise ReportInputError(f"{path.name} ({path}) is empty: no header row") from exc
    except pd.errors.ParserError as exc:
        raise ReportInputError(f"{path.name} ({path}) is not a readable CSV table: {exc}") from exc
    df.columns = [str(c).strip() for c in df.columns]
    return df


def _require(df: pd.DataFrame, path: Path, required: Sequence[str]) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise MissingColumnError(path, missing, required)


def _numeric(df: pd.DataFrame, column: str, path: Path, *, integer: bool = False) -> None:
    """Parse a text column in place; a value that is neither a number nor empty is an error."""
    text = df[column].astype(str).str.strip()
    empty = text.isin(_NA)
    values = pd.to_numeric(text.where(~empty), errors="coerce")
    bad = values.isna() & ~empty
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ReportInputError(
            f"{path.name} ({path}): column {column!r} has a non-numeric value "
            f"{text.iloc[row]!r} in data row {row + 1}"
        )
    if integer:
        if empty.any():
            row = int(np.flatnonzero(empty.to_numpy())[0])
            raise ReportInputError(
                f"{path.name} ({path}): column {column!r} is empty in data row {row + 1}"
            )
        if not np.allclose(values, np.round(values)):
            raise ReportInputError(f"{path.name} ({path}): column {column!r} must hold integers")
        df[column] = np.round(values).astype(np.int64)
    else:
        df[column] = values.astype(float)


def _boolean(df: pd.DataFrame, column: str, path: Path) -> None:
    text = df[column].astype(str).str.strip()
    low = text.str.lower()
    bad = ~(low.isin(_TRUE) | low.isin(_FALSE) | text.isin(_NA))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ReportInputError(
            f"{path.name} ({path}): column {column!r} has a non-boolean value "
            f"{text.iloc[row]!r} in data row {row + 1}"
        )
    df[column] = low.isin(_TRUE)


def _text(df: pd.DataFrame, column: str) -> None:
    df[column] = df[column].astype(str).str.strip()


def load_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read and check ``results.csv``; raise :class:`MissingColumnError` naming missing columns.

    Text columns become ``str`` ("" when empty; ``objective`` and ``protocol`` lower-case),
    ``point_index`` and ``seed`` integers, scores floats (NaN when empty), ``adversarial``
    bool; ``marker`` ("" when absent) and ``adversarial`` (False when absent) always exist.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingResultsError(f"no {path.name} at {path}: nothing to report")
    df = _read_text_table(path)
    if "front_point" in df.columns and "experiment" not in df.columns:
        raise ReportInputError(
            f"{path} is a table of stitchlab compare, which wrote its own report.html beside "
            f"it ({path.parent / 'report.html'}); stitchlab report reads the results of "
            "stitchlab run (experiments)."
        )
    _require(df, path, RESULTS_REQUIRED)
    if df.empty:
        raise ReportInputError(f"{path.name} ({path}) has a header but no result rows")
    for c in _RESULTS_TEXT:
        _text(df, c)
    for c in ("objective", "protocol"):
        df[c] = df[c].str.lower()
    for c in _RESULTS_INT:
        _numeric(df, c, path, integer=True)
    numeric = [c for c in RESULTS_REQUIRED if c not in _RESULTS_TEXT + _RESULTS_INT]
    for c in numeric + [c for c in RESULTS_OPTIONAL_NUMERIC if c in df.columns]:
        _numeric(df, c, path)
    _percentages(df, path)
    if "marker" in df.columns:
        _text(df, "marker")
    else:
        df["marker"] = ""
    if "adversarial" in df.columns:
        _boolean(df, "adversarial", path)
    else:
        df["adversarial"] = False
    if "iri_flagged" in df.columns:
        _boolean(df, "iri_flagged", path)
    return df.reset_index(drop=True)


#: Scores in percent: every row must have the first two, the others where present.
_PERCENT_REQUIRED = ("agreement", "hard_agreement")
_PERCENT_OPTIONAL = ("agreement_ci_low", "agreement_ci_high", "agreement_rolled",
                     "robust_agreement")  # fmt: skip


def _percentages(df: pd.DataFrame, path: Path) -> None:
    """Refuse a missing score, or a percentage that is not a number in [0, 100]: a report
    would average it in (or leave the run out) without a word."""
    for c in _PERCENT_REQUIRED + tuple(c for c in _PERCENT_OPTIONAL if c in df.columns):
        values = df[c]
        missing = values.isna() if c in _PERCENT_REQUIRED else False  # optional: may be empty
        bad = missing | (values.notna() & ~values.between(0, 100))
        if bool(bad.any()):
            rows = [int(i) + 2 for i in df.index[bad][:3]]  # + header, 1-based lines
            raise ReportInputError(
                f"{path.name} ({path}): column {c!r} must hold percentages in [0, 100] in "
                f"every row; line(s) {rows} hold {values[bad].tolist()[:3]}. Rerun the "
                "experiment to rewrite the table, or remove those rows on purpose."
            )


def load_pairs(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read ``pairs.csv`` (``pair``, ``front_agreement`` required; accuracies optional)."""
    path = Path(path)
    df = _read_text_table(path)
    _require(df, path, PAIRS_REQUIRED)
    for c in ("pair", "front", "back"):
        if c in df.columns:
            _text(df, c)
    for c in ("front_agreement", "front_accuracy", "back_accuracy"):
        if c in df.columns:
            _numeric(df, c, path)
    return df.reset_index(drop=True)


def load_cka(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read ``cka.csv`` (``pair``, ``point``, ``point_index``, ``data``, ``cka`` required)."""
    path = Path(path)
    df = _read_text_table(path)
    _require(df, path, CKA_REQUIRED)
    for c in ("pair", "front", "back", "point", "data"):
        if c in df.columns:
            _text(df, c)
    _numeric(df, "point_index", path, integer=True)
    _numeric(df, "cka", path)
    if "seed" in df.columns:
        _numeric(df, "seed", path)
    return df.reset_index(drop=True)


def load_iris_examples(path: str | os.PathLike[str]) -> IRIExamples:
    """Read ``iris_examples.safetensors`` with numpy only (no torch)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    path = Path(path)
    try:
        arrays = load_file(str(path))
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # the safetensors errors differ between versions
        raise ReportInputError(f"{path.name} ({path}) cannot be read: {exc}") from exc
    if "source" not in arrays:
        raise ReportInputError(f"{path.name} ({path}) has no 'source' tensor")
    iris: dict[tuple[str, str], np.ndarray] = {}
    errors: dict[tuple[str, str], list[float]] = {}
    for key, value in arrays.items():
        if not key.startswith("iris/") or key.count("/") < 2:
            continue
        front, point = key[len("iris/") :].rsplit("/", 1)
        iris[(front, point)] = value
        raw = meta.get(f"errors/{front}/{point}")
        if raw is not None:
            try:
                errs = [float(e) for e in json.loads(raw)]
            except (ValueError, TypeError):
                continue
            errors[(front, point)] = errs
    named = {"source": arrays["source"], **{f"iris/{f}/{p}": a for (f, p), a in iris.items()}}
    if "sample_rate" in meta:  # waveforms
        try:
            rate = int(meta["sample_rate"])
        except ValueError:
            raise ReportInputError(f"{path.name} ({path}): sample_rate {meta['sample_rate']!r} "
                                   "is not an integer") from None  # fmt: skip
        for name, a in named.items():
            if a.ndim != 3 or a.dtype != np.float32:
                raise ReportInputError(
                    f"{path.name} ({path}): audio tensor {name!r} has shape {a.shape} "
                    f"({a.dtype}), expected float32 (k, 1, T)"
                )
        return IRIExamples(source=arrays["source"], iris=iris, errors=errors, sample_rate=rate)
    for name, a in named.items():
        if a.ndim != 4 or a.shape[1] not in (1, 3):
            raise ReportInputError(
                f"{path.name} ({path}): tensor {name!r} has shape {a.shape}, expected (k, 3, H, W)"
            )
    return IRIExamples(source=arrays["source"], iris=iris, errors=errors)


def wav_bytes(x: np.ndarray, sample_rate: int) -> bytes:
    """A waveform in [-1, 1] (any shape; channels averaged when (C, T)) as 16-bit mono
    WAV file bytes, for the report's audio players."""
    import io
    import wave

    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2:
        x = x.mean(axis=0)
    pcm = np.round(np.clip(x.reshape(-1), -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def _header_only(path: Path) -> bool:
    """True for an empty file or a table without data rows."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return sum(1 for line in f if line.strip()) <= 1


def load_run(run_dir: str | os.PathLike[str]) -> RunData:
    """Read every result file of ``run_dir``; optional files that are absent are noted."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MissingResultsError(f"run directory {run_dir} does not exist")
    data = RunData(run_dir=run_dir, results=load_results(run_dir / RESULTS_FILE))
    if (run_dir / PAIRS_FILE).is_file() and not _header_only(run_dir / PAIRS_FILE):
        data.pairs = load_pairs(run_dir / PAIRS_FILE)
    else:
        data.notes.append(f"No {PAIRS_FILE} (or no rows): curves have no Front reference point.")
    if (run_dir / CKA_FILE).is_file() and not _header_only(run_dir / CKA_FILE):
        data.cka = load_cka(run_dir / CKA_FILE)
    else:
        data.notes.append(f"No {CKA_FILE} (or no rows): the CKA comparison is skipped.")
    if (run_dir / EXAMPLES_FILE).is_file():
        data.examples = load_iris_examples(run_dir / EXAMPLES_FILE)
    else:
        data.notes.append(f"No {EXAMPLES_FILE}: the example IRIs are skipped.")
    data.iri_recipe = _iri_recipe(run_dir / RUN_FILE, data.notes)
    return data


def _iri_recipe(path: Path, notes: list[str]) -> str | None:
    """The IRI recipe that run.json records (written by stitchlab run when IRI sets were
    made), described in one line; None, with a note, when it is not recorded or not
    readable. Never guessed from the config: stitchlab's default may have changed since."""
    if not path.is_file():
        return None
    try:
        iris = json.loads(path.read_text(encoding="utf-8")).get("iris") or {}
    except (OSError, ValueError, AttributeError) as exc:
        notes.append(f"{path.name} is not readable JSON ({exc}): the IRI recipe is not shown.")
        return None
    if not iris.get("total") and not iris.get("cka_sets"):  # no IRI sets in this run
        return None
    if "recipe" not in iris:
        notes.append(f"{path.name} records no IRI recipe (a run made before stitchlab did).")
        return None
    recipe = iris["recipe"]
    ran = iris.get("amp_ran") or []  # absent: a run from before stitchlab recorded it
    ran_text = ""
    resolved = recipe.get("amp") in ("auto", "fast")  # a rule, resolved where IRIs were made
    if resolved and ran in (["bf16"], ["off"]):
        recipe = {**recipe, "amp": ran[0]}  # what ran on the run's hardware, not the rule
    elif resolved and ran:  # several machines, or rows from before
        names = {"bf16": "bfloat16", "off": "float32", "unrecorded": "an unrecorded arithmetic"}
        ran_text = "; this run's IRI steps ran in " + " and ".join(names.get(a, a) for a in ran)
    try:
        seed = iris.get("seed") or 0  # absent: a run from before the option, seed 0
        if iris.get("per_stitch_seed"):
            start = f"; random start seed {seed} + the stitch seed" if seed else (
                "; random start: the stitch seed")
        else:
            start = f"; random start seed {seed}" if seed else ""
        return describe_iri_recipe(recipe) + start + ran_text
    except (KeyError, TypeError, ValueError) as exc:
        notes.append(f"{path.name}: the IRI recipe it records is not readable ({exc}).")
        return None
