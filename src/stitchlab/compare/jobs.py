"""The jobs of a comparison: one Stitcher per (front model, cell), each run stored as soon
as it finishes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..vocabulary import IRI_TRANSFER_COLUMNS
from .settings import CompareSettings, _iri_seed, _pack
from .sides import _layouts, _leaves, _null_front, _Side


@dataclass
class CompareContext:
    """What every job of one comparison shares: the settings, the two models, the data,
    the back's logits on the test images (what a stitched model is scored against), the
    store and the IRI recipe. Built once by the driver; a Ray task receives a copy."""

    settings: CompareSettings
    front: _Side
    back: _Side
    stitch_set: Dataset
    test_set: Dataset
    reference: Tensor
    store: Path
    recipe: Any  # IRIRecipe
    null_fronts: dict[int, nn.Module] = field(default_factory=dict)


@dataclass(frozen=True)
class CellJob:
    """The runs of one (front model, cell): the real front, a null front (``null_seed``)
    or the back into itself (``ceiling``), stitched at ``front_point -> back_point``, on
    one Stitcher."""

    context: CompareContext
    front_point: str
    back_point: str
    null: bool
    null_seed: int
    ceiling: bool
    runs: tuple[dict, ...]


def cell_jobs(context: CompareContext, todo: list[dict]) -> list[CellJob]:
    """The runs of ``todo`` grouped into jobs, one per (front model, cell)."""
    groups: dict[tuple, list[dict]] = {}
    for r in todo:
        groups.setdefault((r["front_point"], r["back_point"], r["null"],
                           r["seed"] if r["null"] else -1, bool(r.get("ceiling"))),
                          []).append(r)  # fmt: skip
    return [CellJob(context, *key, tuple(runs)) for key, runs in groups.items()]


def run_cell(job: CellJob) -> int:
    """Compute the runs of ``job`` that are not stored, each under a lock on its entry
    (another process computing it is waited for, and its result kept), storing each run
    as soon as it is done. Returns the number of runs computed."""
    from .._checks import check_class_labels
    from .._data import predict
    from ..fit import TrainingConfig
    from ..metrics import per_image_agreement
    from ..protocols import InvarianceAware, Standard
    from ..runs.executors import assigned_device
    from ..stitcher import Stitcher
    from ..store import lock, write_json
    from .plan import _stored_run

    c, s = job.context, job.context.settings
    device = assigned_device(s.device)
    front, back, store = c.front, c.back, c.store
    f, b = job.front_point, job.back_point
    front_model = (back.model if job.ceiling else
                   _null_front(front, job.null_seed, c.null_fronts) if job.null
                   else front.model)  # fmt: skip
    st = Stitcher(front_model, back.model, f"net.{f}", f"net.{b}",
                  leaf_modules=_leaves(front, back),
                  layouts=(_layouts(back, back, f, b)[1] if job.ceiling
                           else _layouts(front, back, f, b)),
                  device=device)  # fmt: skip
    sets, transfer = {}, {}
    computed = 0
    for r in sorted(job.runs, key=lambda r: (r["protocol"], r["seed"], r["n_init"])):
        path = store / "compare" / f"{r['key']}.json"
        with lock(path.with_name(f".{r['key']}.lock"), f"compare run {r['key']}"):
            if path.exists() and _stored_run(path, lambda _: None) is not None:
                continue  # another process computed it meanwhile
            iri_seed = _iri_seed(s, r)
            which = (r["protocol"], iri_seed)
            if which not in sets:
                sets.clear()  # one set at a time in memory
                transfer.clear()
                proto = Standard() if r["protocol"] == "standard" else InvarianceAware(
                    cache=str(store / "iris"), recipe=c.recipe, allow_flagged=True)
                sets[which] = st.collect(c.stitch_set, proto, seed=iri_seed)
                transfer[which] = _transfer(sets[which], front_model, back.model)
            sset = sets[which]
            seed = r["seed"]
            init = st.initialise(c.stitch_set, samples=r["n_init"], seed=seed)
            cfg = TrainingConfig(epochs=s.epochs, lr=s.lr, batch_size=s.batch_size,
                                 init_samples=r["n_init"], seed=seed, device=device)  # fmt: skip
            t = time.time()
            model = st.fit(r["objective"], sset, init=init, settings=cfg)
            with torch.no_grad():
                logits, labels = predict(model, c.test_set, device=torch.device(device))
            check_class_labels(labels, logits.shape[1], "the test data")
            values = per_image_agreement(logits, c.reference.to(logits.device))
            reference = c.reference.to(logits.device)
            hard = 100 * float((logits.argmax(1) == reference.argmax(1)).double().mean())
            q = sset.iri_quality
            write_json(path, {
                "run": {k: v for k, v in r.items() if k != "key"},
                "values": _pack(values.cpu()), "n": len(values), "hard_agreement": hard,
                "accuracy": 100 * float((logits.argmax(1) == labels.to(logits.device))
                                        .float().mean()),
                "iri_median_error": None if q is None else q.median_error,
                "iri_null_ratio": None if q is None else q.null_ratio,
                "iri_flagged": None if q is None else bool(q.flagged),
                **transfer[which],
                "init_residual": model.record.init_residual,
                "init_samples": init.samples, "init_images_needed": init.images_needed,
                "init_underdetermined": init.underdetermined, "init_ridge": init.ridge,
                "seconds": round(time.time() - t, 2),
            })  # fmt: skip
            computed += 1
    return computed


def _transfer(sset, front: nn.Module, back: nn.Module) -> dict[str, float | None]:
    """Stitch-free: the whole front and back models on the IRIs against their sources
    (:func:`stitchlab.evaluation.iri_agreement`), and the back's agreement between two different
    real images (its null); None for the standard protocol."""
    from ..evaluation import iri_transfer_columns

    if sset.protocol != "iris":
        return dict.fromkeys(IRI_TRANSFER_COLUMNS)
    return iri_transfer_columns(front, back, sset.dataset, sset.real)


