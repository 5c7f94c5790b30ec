"""The data of an experiment, rebuilt deterministically from its ``[data]`` table.

One seeding convention: the training and test sets are the seeded subsets
``subset(reader(...), n, seed=seed)``; the stitching set is the subset of the training
set with seed ``seed + 1``; generated data use ``seed`` for training and ``seed + 7919``
for testing. Markers use ``seed``.

A data table is keyed by what it holds, not by its text: :func:`content_key` is the
table without its ``root`` plus the :func:`stitchlab.data.fingerprint` of the data read
from it, so pointing ``$STITCHLAB_DATA`` at another data set never reuses stored results,
and moving the data folder does not invalidate them. The driver computes the fingerprints
once (:func:`fingerprints`); every job checks that the data it reads still has them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..store import stable_hash
from ..vocabulary import GENERATED_KINDS, SPEECH_KINDS
from .config import ConfigError

__all__ = [
    "ProcessCache",
    "CACHE",
    "model_data",
    "base_data",
    "marked",
    "stitch_data",
    "fingerprints",
    "content_key",
    "expected_fingerprint",
    "resolve_root",
    "test_data",
    "with_speech_cache",
    "SPEECH_CACHE_KEY",
]

#: The key of a data table that says where synthesised speech is cached (set by the
#: runner to ``store/data``; not part of any store key: the clips are keyed by content).
SPEECH_CACHE_KEY = "cache"


class ProcessCache:
    """What one process keeps between jobs: data sets, loaded models, reference logits.

    Each process (the driver, every Ray worker) has one; it holds only things rebuilt
    deterministically from the config, so dropping it never changes a result."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._items: dict[str, Any] = {}

    def get(self, key: str, make: Callable[[], Any]) -> Any:
        """The cached value of ``key``, made by ``make()`` the first time."""
        if key not in self._items:
            if len(self._items) >= self.size:
                self._items.clear()
            self._items[key] = make()
        return self._items[key]

    def clear(self) -> None:
        """Forget everything."""
        self._items.clear()


CACHE = ProcessCache()


def model_data(exp_raw: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The data table a model is trained on (``[data]`` with the model's overrides)."""
    data = exp_raw["data"]
    if name is None:
        return data
    return {**data, **exp_raw["models"][name].get("data", {})}


def resolve_root(data: dict[str, Any]) -> str:
    """The data folder of a table, with ``~`` and ``$VARIABLES`` expanded; an unset
    variable or a missing folder is a :class:`ConfigError` that says what to set."""
    raw = str(data["root"])
    root = os.path.expandvars(os.path.expanduser(raw))
    if "$" in root:
        var = root[root.index("$") :].split("/")[0]
        raise ConfigError(
            f"[data] root {raw!r}: the variable {var} is not set; set it to the data folder "
            f"(e.g. {var.strip('${}')}=/path/to/data) or write the path in the config."
        )
    if not os.path.isdir(root):
        raise ConfigError(
            f"[data] root {raw!r} is {root!r}, which is not a folder; point it at the folder "
            "that holds the data (see ../shared/data/README.md for CIFAR-10 and MNIST)."
        )
    return root


def base_data(data: dict[str, Any], expected: str | None = None):
    """``(train, test)`` data sets of a data table; with ``expected``, check that their
    fingerprint is the one the run was keyed by."""
    from torch.utils.data import TensorDataset

    from .. import data as D

    def make():
        kind, opts, seed = data["kind"], dict(data["options"]), data["seed"]
        if kind in ("cues", "shapes"):
            gen = D.cues if kind == "cues" else D.shapes
            x, y = gen(data["n_train"], seed=seed, **opts)[:2]
            xt, yt = gen(data["n_test"], seed=seed + 7919, **opts)[:2]
            return TensorDataset(x, y), TensorDataset(xt, yt)
        if kind in SPEECH_KINDS:  # espeak-ng, cached by content next to the store
            words = D.DIGITS if kind == "spoken_digits" else opts.pop("words")
            return D.spoken_words(
                words, data["n_train"], data["n_test"], seed=seed,
                cache=data.get(SPEECH_CACHE_KEY) or None, **opts,
            )  # fmt: skip
        root = resolve_root(data)
        if kind == "mnist":  # padded to 32x32 in colour, so that CIFAR-sized models take it
            opts = {"channels": 3, "size": 32, **opts}
        reader = getattr(D, kind)  # cifar10, mnist, coloured_mnist, ImageNet folders
        train, test = reader(root, train=True, **opts), reader(root, train=False, **opts)
        return (
            D.subset(train, data["n_train"], seed=seed),
            D.subset(test, data["n_test"], seed=seed),
        )

    sets = CACHE.get("data:" + _where(data), make)
    if expected is not None and _fingerprint(data, sets) != expected:
        raise RuntimeError(
            f"The {data['kind']} data under {data.get('root')!r} changed while the "
            "experiment ran (its fingerprint differs from the one the run started with); "
            "rerun the experiment so that every job reads the same data."
        )
    return sets


def _where(data: dict[str, Any]) -> str:
    """A process-cache key of a table: its text and the folder it resolves to now."""
    root = resolve_root(data) if data["kind"] not in GENERATED_KINDS else ""
    return stable_hash([data, os.path.realpath(root) if root else ""])


def _fingerprint(data: dict[str, Any], sets) -> str:
    from ..data import fingerprint

    return CACHE.get(
        "fp:" + _where(data), lambda: stable_hash([fingerprint(s) for s in sets], 24)
    )


def fingerprints(exp_raw: dict[str, Any]) -> dict[str, str]:
    """``{stable_hash(table): fingerprint}`` of every data table the experiment reads."""
    tables = [model_data(exp_raw)] + [model_data(exp_raw, m) for m in exp_raw["models"]]
    out: dict[str, str] = {}
    for table in tables:
        key = stable_hash(table)
        if key not in out:
            out[key] = _fingerprint(table, base_data(table))
    return out


def content_key(exp_raw: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """What identifies a data table in a store key: the table without its folder, and
    the fingerprint of its content (from ``exp_raw["fingerprints"]``)."""
    fps = exp_raw.get("fingerprints")
    if not fps or stable_hash(table) not in fps:
        raise RuntimeError(
            "internal: the experiment's data fingerprints are missing; jobs are made by "
            "run_experiment, which computes them."
        )
    return {
        "table": {k: v for k, v in table.items() if k not in ("root", SPEECH_CACHE_KEY)},
        "content": fps[stable_hash(table)],
    }


def expected_fingerprint(exp_raw: dict[str, Any], table: dict[str, Any]) -> str | None:
    """The fingerprint the run was keyed by for ``table`` (None outside a run)."""
    return (exp_raw.get("fingerprints") or {}).get(stable_hash(table))


def marked(
    dataset, marker: str | None, data: dict[str, Any], rolled: bool = False, rate: float = 1.0
):
    """``dataset`` with the pair's marker (unchanged without one): an image marker
    (:class:`~stitchlab.data.Marked`) or the beep of speech (:class:`~stitchlab.data.Beeped`:
    class-coded, or of a random class for ``"beep-rand"``). With ``rate`` < 1 only that
    fraction of the items (a fixed draw from the data seed) carry it: a partial shortcut to
    train on."""
    if marker is None:
        return dataset
    from ..data import Beeped, Marked

    if marker in ("beep", "beep-rand"):
        rate_hz = data["options"].get("sample_rate", 8000)
        uninformative = marker == "beep-rand"  # rolled or not, the tone is a random class's
        out = Beeped(dataset, num_classes=data["num_classes"], seed=data["seed"],
                     rolled=rolled and not uninformative, random_class=uninformative,
                     sample_rate=rate_hz)  # fmt: skip
    else:
        out = Marked(dataset, marker, num_classes=data["num_classes"], seed=data["seed"],
                     rolled=rolled)  # fmt: skip
    if rate < 1.0:
        from ..data import PartlyMarked

        out = PartlyMarked(dataset, out, rate, seed=data["seed"])
    return out


def with_speech_cache(raw: dict[str, Any], folder: str) -> dict[str, Any]:
    """``raw`` with every speech data table caching its clips under ``folder``."""
    def table(t: dict[str, Any]) -> dict[str, Any]:
        return {**t, SPEECH_CACHE_KEY: folder} if t.get("kind") in SPEECH_KINDS else t

    models = {
        name: {**spec, "data": table(spec["data"])} if spec.get("data") else spec
        for name, spec in raw["models"].items()
    }
    return {**raw, "data": table(raw["data"]), "models": models}


def test_data(exp_raw: dict[str, Any]):
    """The experiment's test set (checked against the run's fingerprint)."""
    data = exp_raw["data"]
    return base_data(data, expected_fingerprint(exp_raw, data))[1]


def stitch_data(exp_raw: dict[str, Any], marker: str | None):
    """The stitching subset of the training data (with the pair's marker)."""
    from ..data import subset

    data = exp_raw["data"]
    train, _ = base_data(data, expected_fingerprint(exp_raw, data))
    n = min(exp_raw["stitch"]["n_stitch"], len(train))
    return marked(subset(train, n, seed=data["seed"] + 1), marker, data)
