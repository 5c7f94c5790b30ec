"""The plan of a run: its stages of jobs, what the store holds already, and a time estimate.

Experiments, comparisons and the oracle each build a :class:`Plan` before they compute
anything: one :class:`Stage` per kind of job (base models, IRI sets, stitch runs, ...) with
how many jobs it has, how many of them are stored, and the seconds the others will take.
The seconds come from one timed forward and backward pass of each model on a batch of
:data:`TIMING_BATCH` images (:func:`seconds_per_image`) and the work of each job kind
(:func:`training_seconds`, :func:`iri_seconds`, :func:`stitch_seconds`): an estimate,
printed with what it rests on, that the three commands print the same way (``--plan``
prints it and stops).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

__all__ = [
    "Plan",
    "Stage",
    "TIMING_BATCH",
    "duration",
    "seconds_per_image",
    "training_seconds",
    "iri_seconds",
    "stitch_seconds",
]


#: Images in the batch a plan times each model on (the jobs train and test in batches of
#: about this size).
TIMING_BATCH = 64


@dataclass(frozen=True)
class Stage:
    """One kind of job in a plan: ``jobs`` in all, ``stored`` of them already in the store,
    and ``seconds``, the estimated time of the others (None: not estimated; ``at_most``:
    an upper bound, as for IRI sets, whose samples stop at the recipe's tolerance)."""

    name: str
    jobs: int
    stored: int = 0
    seconds: float | None = None
    detail: str = ""
    at_most: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.stored <= self.jobs:
            raise ValueError(f"stage {self.name!r}: {self.stored} stored of {self.jobs} jobs")

    @property
    def todo(self) -> int:
        """The jobs still to compute."""
        return self.jobs - self.stored


@dataclass(frozen=True)
class Plan:
    """What a run will do: a title, lines that say what it runs on (models, data, cells),
    its stages, and notes (warnings a user should read before it runs)."""

    title: str
    stages: tuple[Stage, ...]
    lines: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    basis: str = "from one timed batch of each model, on a machine as busy as now"

    @property
    def todo(self) -> int:
        """Jobs still to compute over every stage."""
        return sum(s.todo for s in self.stages)

    @property
    def seconds(self) -> float | None:
        """The estimated time of the jobs still to compute (None when a stage that has
        jobs to compute is not estimated)."""
        if any(s.seconds is None for s in self.stages if s.todo):
            return None
        return sum(s.seconds or 0.0 for s in self.stages if s.todo)

    def estimate(self) -> str:
        """The time estimate in words."""
        if not self.todo:
            return "nothing to compute: every job is stored"
        if self.seconds is None:
            return "not available"
        bound = "at most " if any(s.at_most for s in self.stages if s.todo) else ""
        return f"{bound}about {duration(self.seconds)} ({self.basis})"

    def text(self) -> str:
        """The plan as printed before a run: its lines, one line per stage, the estimate."""
        out = [self.title, *self.lines]
        width = max((len(s.name) for s in self.stages), default=0)
        for s in self.stages:
            bound = "at most " if s.at_most else ""
            time_ = ("" if not s.todo or s.seconds is None
                     else f", {bound}about {duration(s.seconds)}")  # fmt: skip
            detail = f" ({s.detail})" if s.detail else ""
            jobs = f"{s.jobs:>4} job" + ("" if s.jobs == 1 else "s")
            out.append(f"  {s.name:<{width}}  {jobs}, {s.stored} stored{time_}{detail}")
        out.append(f"estimate: {self.estimate()}")
        out += self.notes
        return "\n".join(out)

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON (for a run's summary): stages, jobs to compute, the estimate."""
        return {
            "stages": [{"name": s.name, "jobs": s.jobs, "stored": s.stored,
                        "seconds": None if s.seconds is None else round(s.seconds, 1),
                        "at_most": s.at_most}
                       for s in self.stages],
            "todo": self.todo,
            "estimated_seconds": None if self.seconds is None else round(self.seconds, 1),
        }  # fmt: skip


def duration(seconds: float) -> str:
    """A duration in words: seconds under two minutes, minutes under two hours, else hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def seconds_per_image(model: nn.Module, x: Tensor, *, parameters: bool = True,
                      budget: float = 0.5) -> float:  # fmt: skip
    """Seconds per image of one forward and backward pass of ``model`` on the batch ``x``:
    into its inputs and, with ``parameters`` (as in training), its parameters; without,
    as IRI steps and stitch training run a frozen network. The fastest of at least two
    passes, and of up to ten while they take under ``budget`` seconds together (the first
    pays for allocation; on a busy machine a pass can wait for a core many times its
    length). Time a batch of the size the jobs use (:data:`TIMING_BATCH`): per image, a
    small network takes 1.5x as long in batches of 16 as in batches of 64. The model is
    left as it was, without gradients."""
    x = x.clone().requires_grad_(True)
    wanted = [p.requires_grad for p in model.parameters()]
    if not parameters:
        for p in model.parameters():
            p.requires_grad_(False)
    times: list[float] = []
    try:
        while len(times) < 2 or (len(times) < 10 and sum(times) < budget):
            t = time.perf_counter()
            out = model(x)
            (out[0] if isinstance(out, (tuple, list)) else out).float().sum().backward()
            times.append(time.perf_counter() - t)
    finally:
        for p, w in zip(model.parameters(), wanted, strict=True):
            p.requires_grad_(w)
        model.zero_grad(set_to_none=True)
    return min(times) / len(x)


def training_seconds(per_image: float, images: int, epochs: int, passes: int = 1) -> float:
    """Training a model: ``epochs`` over ``images``, each image ``passes`` forward and
    backward passes (1 plus the attack's steps for adversarial training)."""
    return per_image * images * epochs * passes


def iri_seconds(per_image: float, images: int, steps: int, depth: float = 1.0) -> float:
    """An IRI set: ``steps`` of every image through the front's prefix (``depth``: its
    share of the front's time); an upper bound, as samples stop at the tolerance."""
    return per_image * depth * images * steps


def stitch_seconds(front: float, back: float, images: int, epochs: int, n_test: int,
                   depth: float = 1.0) -> float:  # fmt: skip
    """A stitch run: the frozen back's forward and backward on every stitching image per
    epoch, the frozen front prefix (``depth`` of the front) once per image (its
    activations are cached; a forward is about a third of a pass), and the test images
    through both (forward only). ``front``/``back``: seconds per image of a pass without
    parameter gradients."""
    return epochs * images * back + images * depth * front / 3 + n_test * (depth * front + back) / 3
