"""Experiments as configuration: validated TOML configs, a resumable job graph, executors.

* :func:`load_config` reads and checks a config (an unknown key, point or model is an
  error that names it) before anything runs.
* :func:`run_experiment` runs it: base models, IRI sets, stitch runs, scores; finished
  jobs are stored and reused, in-process or on Ray.
* :func:`builtin_config` gives the packaged configs (``demo``, ``demo_quick``).
"""

from pathlib import Path

from ..store import stable_hash
from .config import ConfigError, Experiment, load_config
from .runner import (
    RESULT_COLUMNS,
    LocalExecutor,
    RayExecutor,
    RunSummary,
    preflight,
    run_experiment,
    with_fingerprints,
)

__all__ = [
    "ConfigError",
    "Experiment",
    "load_config",
    "stable_hash",
    "run_experiment",
    "preflight",
    "with_fingerprints",
    "RunSummary",
    "LocalExecutor",
    "RayExecutor",
    "RESULT_COLUMNS",
    "builtin_config",
]


def builtin_config(name: str) -> Path:
    """Path of a packaged config (``demo`` or ``demo_quick``)."""
    path = Path(__file__).parent / "configs" / f"{name}.toml"
    if not path.exists():
        names = sorted(p.stem for p in path.parent.glob("*.toml"))
        raise ConfigError(f"no built-in config {name!r}; available: {', '.join(names)}")
    return path
