"""An oracle testbed: networks whose cue reliance is known, so a similarity score can be graded.

Model stitching has no ground truth: nobody can say which score is "right". Here the truth
is built in. Generated images carry four cues that can each carry the class or not,
independently: the object's **shape**, its **colour**, its **texture** and a
class-coloured **marker** square at a class-fixed place (Pixel+Loc, docs/method.md
section 5). A family of small CNNs is trained on data where only a chosen subset of the
cues is predictive (the others random), and each network's reliance is then *measured*:
its accuracy on cue-isolated data (one cue carries the label, the others are random).

The oracle of two networks is measured without stitching: how often their predictions
agree on **cue-conflict** images, where every cue shows its own random class (their
behaviour where the cues disagree), with the overlap of their reliance profiles beside it.
Every similarity method is then run on **aligned** data (every cue agrees with the label:
where standard stitching is fooled) and graded by the rank correlation of its scores with
the oracle over the pairs of the family.

Why this is a fair ground truth, and what it is not: two networks that use the same cues
make the same decisions when the cues disagree, and networks that use different cues do
not, so conflict agreement measures shared *function* on inputs the networks were not
trained on, independent of any stitching choice. It does not capture similarity of the
internal computation (two networks can use one cue through different features), and it
only knows the four cues built in.

    run_oracle(OracleSettings.quick(), out)          # or: stitchlab oracle --quick --out DIR
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .store import read_json, write_json
from .vocabulary import OBJECTIVES, PROTOCOLS

if TYPE_CHECKING:
    from .runs import Plan

__all__ = [
    "TESTBED_CUES",
    "OracleSettings",
    "oracle_data",
    "reliance_profile",
    "conflict_agreement",
    "profile_overlap",
    "spearman",
    "bootstrap_spearman",
    "with_ceiling",
    "run_oracle",
    "load_oracle_config",
    "is_oracle_config",
]

log = logging.getLogger("stitchlab.oracle")

TESTBED_CUES: tuple[str, ...] = ("shape", "colour", "texture", "marker")
_IMAGE_CUES = ("shape", "colour", "texture")
_MODES = ("train", "aligned", "isolated", "conflict")


# ---------------------------------------------------------------------------
# The data


def oracle_data(
    n: int,
    *,
    seed: int,
    mode: str,
    cues: Sequence[str] = TESTBED_CUES,
    num_classes: int = 10,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """``(images, labels, classes)``: ``n`` generated 32x32 images and, per cue, the class it
    shows on each image.

    ``mode``: ``"train"`` (the cues in ``cues`` carry the label, the others are random),
    ``"aligned"`` (every cue carries the label), ``"isolated"`` (``cues`` is one cue: it
    carries the label, the others are random) or ``"conflict"`` (every cue shows its own
    random class, independently; the labels are the shape's classes, for bookkeeping).
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    cues = tuple(cues)
    unknown = [c for c in cues if c not in TESTBED_CUES]
    if unknown or not cues:
        raise ValueError(f"cues must be a non-empty subset of {TESTBED_CUES}, got {cues}")
    if mode == "isolated" and len(cues) != 1:
        raise ValueError(f"isolated data has one label-carrying cue, got {cues}")
    from .data import Marked, render_cues

    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    classes: dict[str, Tensor] = {}
    for cue in TESTBED_CUES:
        draw = torch.randint(0, num_classes, (n,), generator=g)  # always drawn: stable streams
        carries = mode == "aligned" or (mode in ("train", "isolated") and cue in cues)
        classes[cue] = labels.clone() if carries else draw
    if mode == "conflict":
        labels = classes["shape"].clone()
    images = render_cues({c: classes[c] for c in _IMAGE_CUES}, seed=seed + 1)
    marked = Marked(torch.utils.data.TensorDataset(images, classes["marker"]), "pixel+loc",
                    num_classes=num_classes, seed=0)  # fmt: skip
    images = torch.stack([marked[i][0] for i in range(n)])
    return images, labels, classes


# ---------------------------------------------------------------------------
# The oracle


@torch.no_grad()
def _predictions(model: nn.Module, images: Tensor, batch_size: int = 500) -> Tensor:
    from ._modes import evaluating

    with evaluating(model):
        return torch.cat([model(images[i : i + batch_size]).argmax(1)
                          for i in range(0, len(images), batch_size)])  # fmt: skip


def reliance_profile(
    model: nn.Module, isolated: dict[str, tuple[Tensor, Tensor]]
) -> dict[str, float]:
    """Accuracy in percent on each cue-isolated set (``{cue: (images, labels)}``)."""
    return {cue: float((_predictions(model, x) == y).double().mean() * 100)
            for cue, (x, y) in isolated.items()}  # fmt: skip


def conflict_agreement(model_a: nn.Module, model_b: nn.Module, conflict: Tensor) -> float:
    """Percent of cue-conflict images on which the two networks predict the same class."""
    return _agreement_of(_predictions(model_a, conflict), _predictions(model_b, conflict))


def _agreement_of(pred_a: Tensor, pred_b: Tensor) -> float:
    return float((pred_a == pred_b).double().mean() * 100)


def profile_overlap(a: dict[str, float], b: dict[str, float], num_classes: int = 10) -> float:
    """Weighted Jaccard overlap in [0, 1] of two reliance profiles, each accuracy first made
    a reliance above chance: ``max(0, (acc - chance) / (100 - chance))``."""
    chance = 100.0 / num_classes

    def rel(p):
        return {c: max(0.0, (v - chance) / (100.0 - chance)) for c, v in p.items()}

    ra, rb = rel(a), rel(b)
    num = sum(min(ra[c], rb[c]) for c in ra)
    den = sum(max(ra[c], rb[c]) for c in ra)
    return num / den if den > 0 else 1.0


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their average rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson of average ranks); NaN when a side is constant."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("spearman needs two sequences of the same length >= 2")
    rx, ry = _ranks(list(x)), _ranks(list(y))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def bootstrap_spearman(
    x: Sequence[float], y: Sequence[float], *, reps: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Spearman's rho and a percentile bootstrap interval over the pairs (resampled with
    replacement; resamples with a constant side are skipped)."""
    rho = spearman(x, y)
    g = torch.Generator().manual_seed(seed)
    n, stats = len(x), []
    for _ in range(reps):
        idx = torch.randint(0, n, (n,), generator=g).tolist()
        r = spearman([x[i] for i in idx], [y[i] for i in idx])
        if not math.isnan(r):
            stats.append(r)
    if not stats:
        return rho, float("nan"), float("nan")
    stats.sort()
    lo = stats[int((1 - level) / 2 * (len(stats) - 1))]
    hi = stats[int((1 + level) / 2 * (len(stats) - 1))]
    return rho, lo, hi


# ---------------------------------------------------------------------------
# The run


@dataclass(frozen=True)
class OracleSettings:
    """The testbed's size. The defaults are the full size (about 30 minutes on 2 cores);
    :meth:`quick` is a 5-minute version."""

    families: tuple[tuple[str, ...], ...] = (
        ("shape",), ("colour",), ("texture",), ("marker",),
        ("shape", "colour"), ("shape", "texture"), ("colour", "marker"), TESTBED_CUES,
    )  # fmt: skip
    seeds: tuple[int, ...] = (0,)  # network seeds per family
    n_train: int = 5000
    n_test: int = 1000  # each of: aligned test, every isolated set, conflict
    n_stitch: int = 1000
    n_init: int = 250
    width: int = 8
    train_epochs: int = 6
    train_batch_size: int = 64
    points: tuple[str, ...] = ("blocks.1", "blocks.3")
    objectives: tuple[str, ...] = OBJECTIVES
    protocols: tuple[str, ...] = PROTOCOLS
    stitch_epochs: int = 3
    stitch_batch_size: int = 64
    stitch_lr: float = 3e-3
    iri_steps: int = 200
    bootstrap: int = 1000
    seed: int = 0  # the data's seed (--seed): a seed not developed on must give the finding
    threads: int = 2

    @classmethod
    def quick(cls, **overrides: Any) -> OracleSettings:
        """A 5-minute testbed: 5 networks, fewer images, the last point only."""
        base = dict(
            families=(("shape",), ("colour",), ("marker",), ("shape", "colour"), TESTBED_CUES),
            n_train=3000, n_test=500, n_stitch=500, n_init=200, train_epochs=4,
            points=("blocks.3",), stitch_epochs=2, iri_steps=100, bootstrap=300,
        )  # fmt: skip
        return cls(**{**base, **overrides})

    def __post_init__(self) -> None:
        from ._checks import check_field_types

        object.__setattr__(self, "families", tuple(tuple(f) for f in self.families))
        for name in ("seeds", "points", "objectives", "protocols"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_field_types(self, "oracle")
        for f in self.families:
            if not f or any(c not in TESTBED_CUES for c in f):
                raise ValueError(f"a family is a non-empty subset of {TESTBED_CUES}, got {f}")
        if len(self.families) * len(self.seeds) < 3:
            raise ValueError("the oracle needs at least 3 networks to rank pairs")
        for name in ("n_train", "n_test", "n_stitch", "n_init", "width", "train_epochs",
                     "train_batch_size", "stitch_batch_size", "iri_steps", "bootstrap",
                     "threads"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad = [o for o in self.objectives if o not in OBJECTIVES]
        bad += [p for p in self.protocols if p not in PROTOCOLS]
        if bad:
            raise ValueError(f"unknown objectives/protocols {bad}")

    @classmethod
    def from_table(cls, table: dict[str, Any], quick: bool = False) -> OracleSettings:
        """From a config's ``[oracle]`` table (every key a field; unknown keys refused)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(table) - names)
        if unknown:
            raise ValueError(f"unknown [oracle] keys {unknown}; valid: {sorted(names)}")
        return cls.quick(**table) if quick else cls(**table)


def is_oracle_config(path: str | Path) -> bool:
    """True when the TOML file at ``path`` is an oracle config (it has an ``[oracle]`` table)."""
    import tomllib

    with open(path, "rb") as f:
        return "oracle" in tomllib.load(f)


def load_oracle_config(path: str | Path, quick: bool = False) -> OracleSettings:
    """The settings of an oracle config: one ``[oracle]`` table (every key a field of
    :class:`OracleSettings`), plus ``name`` and ``description``."""
    from ._checks import read_table_config

    return OracleSettings.from_table(read_table_config(path, "oracle"), quick=quick)


#: Bumped when _grade gains a method, so stored pair results without it are regraded.
GRADED_METHODS_VERSION = 3


def _network_name(cues: Sequence[str], seed: int) -> str:
    return "+".join(cues) + f"-s{seed}"


def _networks(settings: OracleSettings, store: Path) -> list[tuple[str, tuple, int, Path]]:
    """The testbed's networks: ``(name, cues, seed, store folder)``; the folder's name
    holds a key of everything its training depends on."""
    from .store import stable_hash

    training = {k: getattr(settings, k) for k in ("seed", "n_train", "width", "train_epochs",
                                                  "train_batch_size")}  # fmt: skip
    out = []
    for k, (cues, seed) in enumerate(itertools.product(settings.families, settings.seeds)):
        name = _network_name(cues, seed)
        key = stable_hash({"v": 1, "cues": list(cues), "net_seed": seed, "index": k,
                           **training}, 12)  # fmt: skip
        out.append((name, cues, seed, store / "models" / f"{name}-{key}"))
    return out


def _train_family(settings: OracleSettings, store: Path) -> dict[str, nn.Module]:
    from . import models
    from .train import fast_recipe, train_model

    nets: dict[str, nn.Module] = {}
    for k, (name, cues, seed, folder) in enumerate(_networks(settings, store)):
        x, y, _ = oracle_data(settings.n_train, seed=settings.seed * 1000 + 10 + k,
                               mode="train", cues=cues)  # fmt: skip
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = models.create("small_cnn", width=settings.width)
        recipe = fast_recipe(epochs=settings.train_epochs, augment=False,
                             batch_size=settings.train_batch_size)  # fmt: skip
        train_model(model, (x, y), recipe=recipe, out=folder, seed=seed,
                    description={"oracle_cues": list(cues)})  # fmt: skip
        nets[name] = model.eval()
    return nets


def oracle_plan(settings: OracleSettings, store: Path,
                pair_key: str) -> tuple[Plan, dict[str, nn.Module] | None]:  # fmt: skip
    """The plan of the testbed over ``store``: its networks, the IRI sets and the graded
    pairs, what is stored and a time estimate from one timed batch of the small CNN; and
    the networks, where every one is stored and the plan read them to key the IRI sets
    (None otherwise), so that the run does not read them again."""
    from . import models
    from .runs import plan as cost
    from .splitting import split
    from .train import MODEL_FILE

    s = settings
    nets = _networks(s, store)
    trained = [n for n, *_, folder in nets if (folder / MODEL_FILE).exists()]
    names = [n for n, *_ in nets]
    pairs = [(a, b, p) for a in names for b in names for p in s.points]
    left = [(a, b, p) for a, b, p in pairs if _stored_pair(_pair_path(store, a, b, p, pair_key))
            is None]  # fmt: skip
    sets = {(a, p) for a, _, p in left}
    stored: set[tuple[str, str]] = set()
    family = None
    if sets and len(trained) == len(nets):  # the IRI sets' keys need the trained weights
        from .iris import iris_set_stored

        family = _train_family(s, store)  # every network stored: read, not trained
        stitching = oracle_data(s.n_stitch, seed=s.seed * 1000 + 4, mode="aligned")[:2]
        stored = {(a, p) for a, p in sets
                  if iris_set_stored(family[a], p, stitching, store / "iris", steps=s.iri_steps,
                                     threshold=10.0, min_null_ratio=0.0)}  # fmt: skip
    x = oracle_data(cost.TIMING_BATCH, seed=0, mode="aligned")[0]
    with torch.random.fork_rng():
        net = models.create("small_cnn", width=s.width).eval()
    train = cost.seconds_per_image(net, x)  # with parameter gradients: training
    full = cost.seconds_per_image(net, x, parameters=False)  # frozen: stitch training's back
    prefix = {p: cost.seconds_per_image(split(net, p)[0], x, parameters=False)
              for p in s.points}
    runs = len(s.objectives) * (len(s.protocols))
    stages = (
        cost.Stage("networks", len(nets), len(trained),
              cost.training_seconds(train, s.n_train, s.train_epochs) * (len(nets) - len(trained))),
        cost.Stage("IRI sets", len(sets), len(stored),
              sum(cost.iri_seconds(prefix[p], s.n_stitch, s.iri_steps) for _, p in sets - stored),
              f"{s.iri_steps} steps of {s.n_stitch} images each", at_most=True),
        cost.Stage("graded pairs", len(pairs), len(pairs) - len(left),
              sum(runs * cost.stitch_seconds(prefix[p], full, s.n_stitch, s.stitch_epochs, s.n_test)
                  for _, _, p in left),
              f"{runs} stitch runs, CKA and IRI transfer each"),
    )  # fmt: skip
    lines = (f"{len(nets)} networks ({len(s.families)} families x {len(s.seeds)} seeds), "
             f"{len(pairs)} pairs x points {', '.join(s.points)}",)  # fmt: skip
    return cost.Plan("plan of the oracle testbed", stages, lines), family


def _pair_path(store: Path, front: str, back: str, point: str, pair_key: str) -> Path:
    return store / "pairs" / f"{front}__{back}__{point}-{pair_key}.json"


@dataclass
class _Context:
    """What every pair job shares: the settings, the networks, the stitching and test data,
    the store, and (in one process) the IRI sets made so far."""

    settings: OracleSettings
    nets: dict[str, nn.Module]
    stitching: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    store: Path
    iri_sets: dict[tuple[str, str], Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _PairJob:
    """One (front, back, point): every method graded, stored as one entry at ``path``."""

    context: _Context
    front: str
    back: str
    point: str
    path: Path


def _stored_pair(path: Path) -> list[dict[str, Any]] | None:
    """A stored pair's rows; None when not stored or damaged (reported, computed again)."""
    from .store import DamagedEntry

    if not path.exists():
        return None
    try:
        return read_json(path)["rows"]
    except (DamagedEntry, KeyError) as exc:
        log.warning("the stored pair %s is damaged (%s); computing it again", path.name, exc)
        return None


def _grade_pair(job: _PairJob) -> None:
    """Grade one pair at one point unless it is stored, under a lock on its entry (another
    process computing it is waited for, and its result kept)."""
    from .experiments.jobs import threads
    from .iris import generate_iris_set
    from .store import lock

    c, s = job.context, job.context.settings
    with threads(s.threads), lock(job.path.with_name(f".{job.path.stem}.lock"),
                                  f"oracle pair {job.path.stem}"):  # fmt: skip
        if _stored_pair(job.path) is not None:
            return
        if (job.front, job.point) not in c.iri_sets:  # each front's IRIs once per process
            c.iri_sets[job.front, job.point] = generate_iris_set(
                c.nets[job.front], job.point, c.stitching, c.store / "iris",
                steps=s.iri_steps, threshold=10.0, min_null_ratio=0.0,
            )  # fmt: skip
        cell = _grade(s, c.nets[job.front], c.nets[job.back], job.point, c.stitching, c.test,
                      c.iri_sets[job.front, job.point])  # fmt: skip
        write_json(job.path, {"rows": cell})


def run_oracle(settings: OracleSettings, out: str | Path, *, progress: bool = True,
               executor: Any = None, echo: Callable[[str], None] | None = None,
               plan_only: bool = False) -> dict | Plan:  # fmt: skip
    """Build the testbed, measure the oracle, grade every method; write ``oracle.csv``,
    ``networks.csv``, ``summary.json``, ``figures/oracle.png`` and ``report.html`` into
    ``out``. Finished networks, IRI sets and pair results are kept in ``out/store``, keyed
    by what determines them, and reused by a rerun. ``executor``: where the pair jobs run
    (:class:`~stitchlab.runs.LocalExecutor` by default, or a
    :class:`~stitchlab.runs.RayExecutor`, each job asking for ``threads`` CPUs).

    The :class:`~stitchlab.runs.Plan` (stages, what is stored, a time estimate) goes to
    ``echo`` (default: the log) first; ``plan_only`` returns it and computes nothing."""
    from .experiments.jobs import threads
    from .report.oracle import write_oracle_report
    from .runs import LocalExecutor, write_table
    from .store import stable_hash

    out = Path(out)
    store = out / "store"
    store.mkdir(parents=True, exist_ok=True)
    # what changes a score keys its entry (networks by their training settings, IRI sets
    # by content): a rerun with other settings never reuses an entry made with these
    graded = {k: v for k, v in dataclasses.asdict(settings).items()
              if k not in ("bootstrap", "threads")}  # fmt: skip
    pair_key = stable_hash({**graded, "methods": GRADED_METHODS_VERSION}, 12)
    t_start = time.time()
    with threads(settings.threads):
        plan, family = oracle_plan(settings, store, pair_key)
        for line in plan.text().splitlines():
            (echo or log.info)(line)
        if plan_only:
            return plan
        nets = family if family is not None else _train_family(settings, store)
        s = settings.seed * 1000
        isolated = {c: oracle_data(settings.n_test, seed=s + 1, mode="isolated", cues=(c,))[:2]
                    for c in TESTBED_CUES}  # fmt: skip
        conflict = oracle_data(settings.n_test, seed=s + 2, mode="conflict")[0]
        aligned_test = oracle_data(settings.n_test, seed=s + 3, mode="aligned")[:2]
        stitching = oracle_data(settings.n_stitch, seed=s + 4, mode="aligned")[:2]
        profiles = {name: reliance_profile(m, isolated) for name, m in nets.items()}
        network_rows = [{"network": n, "trained_on": n.rsplit("-s", 1)[0],
                         "aligned_accuracy": float((_predictions(m, aligned_test[0]) ==
                                                    aligned_test[1]).double().mean() * 100),
                         **{f"acc_{c}": v for c, v in profiles[n].items()}}
                        for n, m in nets.items()]  # fmt: skip
        write_table(out / "networks.csv", network_rows)
        names = list(nets)
        pairs = [(a, b) for a in names for b in names]
        context = _Context(settings, nets, stitching, aligned_test, store)
        jobs = [_PairJob(context, front, back, point,
                         _pair_path(store, front, back, point, pair_key))
                for front, back in pairs for point in settings.points]  # fmt: skip
        todo = [job for job in jobs if _stored_pair(job.path) is None]
        executor = executor if executor is not None else LocalExecutor(progress=progress)
        executor.configure({"device": "cpu", "threads": settings.threads})
        executor.map(_grade_pair, todo, desc="oracle pairs")
        # each network's conflict predictions once, not once per pair
        conflict_pred = {name: _predictions(m, conflict) for name, m in nets.items()}
        rows: list[dict[str, Any]] = []
        for job in jobs:
            front, back = job.front, job.back
            oracle = _agreement_of(conflict_pred[front], conflict_pred[back])
            overlap = profile_overlap(profiles[front], profiles[back])
            for r in read_json(job.path)["rows"]:
                rows.append({"front": front, "back": back, "self": front == back,
                             "point": job.point, **r, "oracle": oracle,
                             "profile_overlap": overlap})  # fmt: skip
    rows = with_ceiling(rows)
    write_table(out / "oracle.csv", rows, parquet=True)
    summary = _summary(rows, settings)
    summary["plan"] = plan.as_dict()
    summary["seconds"] = round(time.time() - t_start, 1)
    summary["settings"] = dataclasses.asdict(settings)
    write_json(out / "summary.json", summary)
    write_oracle_report(out, rows, summary, network_rows)
    log.info("oracle: %d networks, %d pairs, done in %s s; %s", len(names), len(pairs),
             summary["seconds"], out / "summary.json")  # fmt: skip
    return summary


def with_ceiling(rows: list[dict[str, Any]], num_classes: int = 10) -> list[dict[str, Any]]:
    """Each stitch row with its ceiling, ``self_score``: the back stitched into itself at
    the same point with the same protocol and objective (the testbed's self pair), and
    ``normalised`` = (score - chance) / (self_score - chance), chance = 100/K (the floor of
    a run without a random-front null; NaN where the ceiling is not above it). Other
    methods get None: they have no stitch."""
    top = {(r["back"], r["point"], r["protocol"], r["objective"]): r["score"]
           for r in rows if r["self"] and r["method"] == "stitch"}  # fmt: skip
    chance = 100.0 / num_classes
    out = []
    for r in rows:
        c = top.get((r["back"], r["point"], r["protocol"], r["objective"])) \
            if r["method"] == "stitch" else None
        norm = None if c is None else (r["score"] - chance) / (c - chance) \
            if c > chance else float("nan")
        out.append(r | {"self_score": c, "normalised": norm})
    return out


def _grade(settings, front, back, point, stitching, test, iris) -> list[dict[str, Any]]:
    """Every method's score for one (front, back, point): stitching under each protocol and
    objective (agreement with the back on aligned test data), linear CKA, and the back
    model's agreement on the front's IRIs against their sources (``iri_transfer/soft``,
    the stitching scores' metric, and ``iri_transfer/hard``, equal top-1; no stitch).
    ``iris``: the front's IRIs of the stitching images at ``point`` (the IRI protocol, CKA
    on IRIs)."""
    from ._data import predict
    from .evaluation import evaluate, iri_agreement
    from .fit import TrainingConfig
    from .metrics import cka
    from .protocols import InvarianceAware, Standard
    from .stitcher import Stitcher

    rows: list[dict[str, Any]] = []
    st = Stitcher(front, back, point)
    reference = predict(st.back_model, test)[0]  # the back's logits, once for every run
    cfg = TrainingConfig(epochs=settings.stitch_epochs, batch_size=settings.stitch_batch_size,
                         lr=settings.stitch_lr, init_samples=settings.n_init)  # fmt: skip
    init = st.initialise(stitching, samples=settings.n_init)
    for protocol in settings.protocols:
        proto = Standard() if protocol == "standard" else InvarianceAware(
            iris=iris, allow_flagged=True, threshold=10.0, min_null_ratio=0.0
        )
        sset = st.collect(stitching, proto)
        for objective in settings.objectives:
            model = st.fit(objective, sset, init=init, settings=cfg)
            rows.append({"method": "stitch", "protocol": protocol, "objective": objective,
                         "score": evaluate(model, test, reference)["agreement"],
                         "iri_median_error": iris.quality.median_error
                         if protocol == "iris" else None})  # fmt: skip
    for data_name, images in (("test", test[0]), ("iris", iris.images())):
        with torch.no_grad():  # the Stitcher's own halves: nothing traced twice
            fa = st.front_prefix(images).flatten(1)
            fb = st.back_prefix(images).flatten(1)
        rows.append({"method": "cka", "protocol": data_name, "objective": "",
                     "score": 100.0 * cka(fa, fb), "iri_median_error": None})  # fmt: skip
    # stitch-free: the whole back model on the front's IRIs against their sources, as the
    # stitching scores' agreement ("soft") and as the share of equal top-1 decisions
    transfer = iri_agreement(back, iris, stitching)
    for kind, key in (("soft", "agreement"), ("hard", "hard_agreement")):
        rows.append({"method": "iri_transfer", "protocol": kind, "objective": "",
                     "score": transfer[key],
                     "iri_median_error": iris.quality.median_error})  # fmt: skip
    return rows


def _summary(rows: list[dict[str, Any]], settings: OracleSettings) -> dict[str, Any]:
    """Spearman of each method's score with the oracle over the non-self pairs, per point
    and layer-averaged, with bootstrap intervals; and the identities."""
    from .report.oracle import method_key

    off = [r for r in rows if not r["self"]]
    methods = list(dict.fromkeys(method_key(r) for r in rows))
    out: dict[str, Any] = {"oracle": "conflict_agreement", "methods": {}}
    for key in methods:
        entry: dict[str, Any] = {}
        by_pair: dict[tuple, list[float]] = {}
        oracle: dict[tuple, tuple[float, float]] = {}
        for point in settings.points:
            sel = [r for r in off if method_key(r) == key and r["point"] == point]
            x, y = [r["score"] for r in sel], [r["oracle"] for r in sel]
            rho, lo, hi = bootstrap_spearman(x, y, reps=settings.bootstrap, seed=settings.seed)
            rho_o = spearman(x, [r["profile_overlap"] for r in sel])
            entry[point] = {"spearman": rho, "ci_low": lo, "ci_high": hi,
                            "spearman_profile_overlap": rho_o, "pairs": len(sel)}  # fmt: skip
            for r in sel:
                by_pair.setdefault((r["front"], r["back"]), []).append(r["score"])
                oracle[(r["front"], r["back"])] = (r["oracle"], r["profile_overlap"])
        keys = sorted(by_pair)
        x = [sum(by_pair[k]) / len(by_pair[k]) for k in keys]
        rho, lo, hi = bootstrap_spearman(x, [oracle[k][0] for k in keys],
                                         reps=settings.bootstrap, seed=settings.seed)  # fmt: skip
        entry["layer_average"] = {
            "spearman": rho, "ci_low": lo, "ci_high": hi,
            "spearman_profile_overlap": spearman(x, [oracle[k][1] for k in keys]),
            "pairs": len(keys),
        }  # fmt: skip
        selfs = [r["score"] for r in rows if r["self"] and method_key(r) == key]
        entry["self_pairs_mean_score"] = sum(selfs) / len(selfs) if selfs else None
        out["methods"][key] = entry
    oracles = [r["oracle"] for r in rows]
    out["oracle_self_mean"] = _mean([r["oracle"] for r in rows if r["self"]])
    out["oracle_range"] = [min(oracles), max(oracles)]
    return out


def _mean(v: list[float]) -> float | None:
    return sum(v) / len(v) if v else None
