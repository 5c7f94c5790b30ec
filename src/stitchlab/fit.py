"""Training a stitch: the one loop, over cached or streamed frozen activations.

``stitch(front_model, back_model, point, data, objective=...)`` copies and freezes both
networks, cuts them at ``point`` (and ``back_point``), builds the stitch layer from the
activation shapes, initialises it by least squares on real images, and trains it.

When the data has no random augmentation and everything the objective needs fits the
memory budget, the front's activations and the back model's targets are computed once;
every step then runs only the stitch layer and the back suffix (DM: only the layer).
"""

from __future__ import annotations

import copy
import math
import numbers
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from . import metrics
from ._data import (
    DataLike,
    PairedImages,
    _module_device,
    _triple,
    as_dataset,
    batches,
    check_labels,
    check_options,
    is_deterministic,
    triples,
)
from .layers import StitchLayer, fit_least_squares
from .objectives import Objective, StitchOutputs, make_objective
from .splitting import OutputSelector, TracedModel

__all__ = [
    "StitchedModel", "TrainingConfig", "stitch", "evaluate", "robust_scores", "check_attack",
    "ActivationCache",
]  # fmt: skip


@dataclass
class TrainingConfig:
    """Stitch-training settings; defaults are PROTOCOL section 5."""

    epochs: int = 30
    batch_size: int | None = None  # None: the DataLoader's, else 128
    lr: float = 1e-3
    weight_decay: float = 1e-4
    milestones: tuple[float, ...] = (1 / 3, 2 / 3)  # fractions of training, lr x gamma
    gamma: float = 0.1
    init: Literal["least_squares", "identity", "random"] = "least_squares"
    init_samples: int = 500
    ridge: float = 0.0
    solver: Literal["adam", "closed_form"] = "adam"
    frozen_mode: Literal["eval", "train"] = "eval"
    cache: Literal["auto"] | bool = "auto"
    cache_budget_bytes: int = 2 * 1024**3
    seed: int = 0
    device: str | torch.device | None = None
    num_workers: int = 0
    progress: bool = False
    adversarial: dict | None = None  # PGD on the stitched model: {eps, step, steps}

    def validate(self) -> None:
        """Raise a ValueError (a TypeError for a wrong type) naming the first bad setting."""
        from ._checks import check_field_types

        check_field_types(self, "training")
        if self.lr < 0 or self.weight_decay < 0 or self.ridge < 0:
            raise ValueError(
                f"lr, weight_decay and ridge must be >= 0; got lr={self.lr}, "
                f"weight_decay={self.weight_decay}, ridge={self.ridge}"
            )
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.init not in ("least_squares", "identity", "random"):
            raise ValueError(
                f"init must be 'least_squares', 'identity' or 'random', got {self.init!r}"
            )
        if self.solver not in ("adam", "closed_form"):
            raise ValueError(f"solver must be 'adam' or 'closed_form', got {self.solver!r}")
        if self.frozen_mode not in ("eval", "train"):
            raise ValueError(f"frozen_mode must be 'eval' or 'train', got {self.frozen_mode!r}")
        if self.cache not in ("auto", True, False):
            raise ValueError(f"cache must be 'auto', True or False, got {self.cache!r}")
        if self.init_samples < 1:
            raise ValueError(f"init_samples must be >= 1, got {self.init_samples}")
        if self.adversarial is not None:
            check_attack(self.adversarial, "adversarial")
            if self.solver == "closed_form":
                raise ValueError(
                    "solver='closed_form' cannot train adversarially (it solves least squares "
                    "on fixed activations); use solver='adam' with adversarial."
                )

    @classmethod
    def from_kwargs(cls, **kwargs) -> TrainingConfig:
        """Build from keyword arguments; an unknown one is an error that lists the valid."""
        check_options(cls, kwargs, "training")
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg


_ATTACK_KEYS = {"eps", "step", "steps"}


def check_attack(settings: dict, where: str = "attack", samples: bool = False) -> None:
    """Raise a ValueError unless ``settings`` are PGD settings (L-inf): ``eps``, ``step``,
    ``steps`` (and, for an evaluation attack, ``samples``: attack only the first that many
    test images)."""
    if not isinstance(settings, dict):
        raise ValueError(f"{where} must be a table of PGD settings, got {settings!r}")
    allowed = _ATTACK_KEYS | ({"samples"} if samples else set())
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ValueError(f"{where} takes {', '.join(sorted(allowed))} (PGD, L-inf); got {unknown}")
    for key, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where} {key} must be a number, got {value!r}")
        if key in ("eps", "step") and not value > 0:
            raise ValueError(f"{where} {key} must be > 0, got {value}")
        if key in ("steps", "samples") and (value != int(value) or value < 1):
            raise ValueError(f"{where} {key} must be a positive integer, got {value}")


def _freeze(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class StitchedModel(nn.Module):
    """``back_{>j}(stitch_layer(front_{<=i}(x)))``: images in, logits out.

    ``stitch_layer`` is the only trainable part. ``history`` holds the mean training loss
    per epoch, ``init_residual`` the normalised least-squares residual of the
    initialisation (None without one).
    """

    def __init__(
        self,
        front: nn.Module,
        stitch_layer: StitchLayer,
        back: nn.Module,
        point: str,
        back_point: str,
        later_points: Sequence[str],
        frozen_mode: str = "eval",
    ) -> None:
        super().__init__()
        self.front = front
        self.stitch_layer = stitch_layer
        self.back = back  # returns (logits, {later point: activation})
        self.point = point
        self.back_point = back_point
        self.later_points = list(later_points)
        self.frozen_mode = frozen_mode
        self.init_residual: float | None = None
        self.history: list[float] = []  # mean loss per epoch
        self.step_losses: list[float] = []  # loss of every step
        self.cache_used: bool | None = None  # None when not trained
        self.timings: dict[str, float] = {}  # seconds: init, cache, train
        self.objective: str | None = None
        self.protocol: str = "standard"
        self.iri_quality = None  # IRIQuality of the IRIs it was trained on

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.from_activation(self.front(x)).logits  # type: ignore[return-value]

    def from_activation(self, a: Tensor, *, need_logits: bool = True) -> StitchOutputs:
        """Run the stitch layer (and the back suffix when needed) on a front activation."""
        z = self.stitch_layer(a)
        if not need_logits:
            return StitchOutputs(None, {self.back_point: z})
        out = self.back(z)
        logits, later = out if isinstance(out, tuple) else (out, {})
        return StitchOutputs(logits, {self.back_point: z, **later})

    def train(self, mode: bool = True) -> StitchedModel:
        """Train mode affects the stitch layer; the frozen networks follow ``frozen_mode``."""
        super().train(mode)
        frozen_train = mode and self.frozen_mode == "train"
        self.front.train(frozen_train)
        self.back.train(frozen_train)
        return self


# ---------------------------------------------------------------------------
# Targets and cache


class _Targets:
    """Computes, from images, what an objective compares against (back model on x)."""

    def __init__(self, back_model: TracedModel, back_point: str, objective: Objective) -> None:
        keys = objective.target_keys
        self.keys = keys
        self.act_keys = [k for k in keys if k not in ("labels", "logits")]
        self.needs_logits = "logits" in keys
        self.model: nn.Module | None = None
        if (
            self.needs_logits
            or len(self.act_keys) > 1
            or (self.act_keys and self.act_keys != [back_point])
        ):
            self.model = (
                back_model.tap(self.act_keys) if self.act_keys else back_model.logits_model()
            )
        elif self.act_keys:  # only the stitch point: the back model's prefix is enough
            self.model, _ = back_model.split(back_point)
            self._only = back_point

    @torch.no_grad()
    def __call__(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if "labels" in self.keys:
            out["labels"] = y
        if self.model is None:
            return out
        res = self.model(x)
        if isinstance(res, tuple):
            logits, acts = res
            if self.needs_logits:
                out["logits"] = logits
            out.update({k: acts[k] for k in self.act_keys})
        elif self.needs_logits and not self.act_keys:
            out["logits"] = res
        else:
            out[self._only] = res
        return out


class ActivationCache:
    """Front activations and back targets for a whole data set, held in memory."""

    def __init__(self, activations: Tensor, targets: dict[str, Tensor]) -> None:
        self.activations = activations
        self.targets = targets

    def __len__(self) -> int:
        return self.activations.shape[0]

    @property
    def nbytes(self) -> int:
        """Memory held by the cache."""
        tensors = [self.activations, *self.targets.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    @classmethod
    @torch.no_grad()
    def build(
        cls,
        front: nn.Module,
        targets: _Targets,
        dataset: Dataset,
        device: torch.device,
        batch_size: int = 256,
        num_workers: int = 0,
    ) -> ActivationCache:
        acts: list[Tensor] = []
        tgts: dict[str, list[Tensor]] = {}
        for x, y, xt in triples(dataset, batch_size, device, num_workers):
            acts.append(front(x))
            for k, v in targets(xt, y).items():
                tgts.setdefault(k, []).append(v)
        return cls(torch.cat(acts), {k: torch.cat(v) for k, v in tgts.items()})

    def batches(self, batch_size: int, generator: torch.Generator) -> Iterator[tuple]:
        """Shuffled ``(activations, targets)`` batches for one epoch."""
        perm = torch.randperm(len(self), generator=generator)
        for i in range(0, len(self), batch_size):
            idx = perm[i : i + batch_size]
            yield self.activations[idx], {k: v[idx] for k, v in self.targets.items()}


class _EpochBatches(torch.utils.data.Sampler):
    """Index batches of a fresh seeded permutation each epoch (as the cache draws them)."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator) -> None:
        self.n, self.batch_size, self.generator = n, batch_size, generator

    def __iter__(self):
        perm = torch.randperm(self.n, generator=self.generator).tolist()
        for i in range(0, self.n, self.batch_size):
            yield perm[i : i + self.batch_size]

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)


def _bytes_per_sample(a: Tensor, t: dict[str, Tensor]) -> int:
    return sum(v[0].numel() * v.element_size() for v in [a, *t.values()])


# ---------------------------------------------------------------------------
# Initialisation and training


def _init_subset(dataset: Dataset, n: int, seed: int) -> Dataset:
    total = len(dataset)  # type: ignore[arg-type]
    if n >= total:
        return dataset
    idx = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:n]
    return torch.utils.data.Subset(dataset, idx.tolist())


def _activation_pairs(
    front: nn.Module, back_prefix: nn.Module, dataset: Dataset, device, batch_size: int
) -> Iterator[tuple[Tensor, Tensor]]:
    with torch.no_grad():
        for x, _ in batches(dataset, batch_size, device):
            yield front(x), back_prefix(x)


def _train_loop(
    stitched: StitchedModel,
    objective: Objective,
    epoch_batches: Callable[[int], Iterator[tuple[Tensor, dict[str, Tensor]]]],
    steps_per_epoch: int,
    cfg: TrainingConfig,
) -> list[float]:
    params = [p for p in stitched.stitch_layer.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = max(cfg.epochs * steps_per_epoch, 1)
    milestones = sorted({max(1, int(round(f * total))) for f in cfg.milestones})
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=cfg.gamma)
    history: list[float] = []
    stitched.step_losses = []
    bar = _progress(cfg, cfg.epochs * steps_per_epoch, f"stitch {objective.name}")
    stitched.train()
    for epoch in range(cfg.epochs):
        running, count = 0.0, 0
        for a, tgt in epoch_batches(epoch):
            out = stitched.from_activation(a, need_logits=objective.needs_back)
            loss = objective(out, tgt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            value = float(loss.detach())
            stitched.step_losses.append(value)
            running += value * a.shape[0]
            count += a.shape[0]
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss):.4f}")
        history.append(running / max(count, 1))
    if bar is not None:
        bar.close()
    stitched.eval()
    return history


def _progress(cfg: TrainingConfig, total: int, desc: str):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


def stitch(
    front_model: nn.Module,
    back_model: nn.Module,
    point: str,
    data: DataLike,
    objective: str | Objective = "slm",
    back_point: str | None = None,
    *,
    init_data: DataLike | None = None,
    temperature: float | None = None,
    fula_points: Sequence[str] | None = None,
    fula_weights: Sequence[float] | None = None,
    protocol: Literal["standard", "iris"] = "standard",
    iris=None,
    iris_branches: Literal["both", "front", "back"] = "both",
    iris_cache: str | None = None,
    iris_options: dict | None = None,
    allow_flagged_iris: bool = False,
    leaf_modules: Sequence[type] = (),
    output: OutputSelector | tuple[OutputSelector, OutputSelector] = None,
    layouts: Mapping[str, str] | None = None,
    settings: TrainingConfig | None = None,
    iris_recipe=None,
    **training,
) -> StitchedModel:
    """Train a stitch from ``front_model`` at ``point`` into ``back_model`` at ``back_point``.

    Args:
        front_model: the trained classifier whose early layers are kept (not modified:
            a frozen copy is used).
        back_model: the trained classifier whose late layers are kept (likewise).
        point: stitch point of the front (see :func:`stitch_points`).
        data: stitching data: a Dataset, a DataLoader, or ``(images, labels)`` tensors.
        objective: ``"hlm"``, ``"slm"``, ``"dm"``, ``"fula"`` or an :class:`Objective`.
        back_point: stitch point of the back model (default: ``point``).
        init_data: real images for the least-squares initialisation (default: ``data``).
        temperature: SLM temperature (default 1; only with ``objective="slm"``: an
            :class:`Objective` object carries its own options).
        fula_points: FuLA's later back-model points (default: every later stitch point).
        fula_weights: FuLA's weights, stitch point first (default: uniform).
        protocol: ``"standard"`` trains on ``data``; ``"iris"`` (invariance-aware) trains on
            the front's IRIs of ``data`` at ``point``: SLM/DM/FuLA targets are the back
            model's outputs on the IRIs, HLM keeps the source labels, the least-squares
            initialisation uses the real images.
        iris: the IRIs to use (an :class:`~stitchlab.iris.IRISet`, an ``IRIResult``, a
            tensor aligned with ``data``, or data); None generates them (cached in
            ``iris_cache`` when given, else in memory).
        iris_branches: ``"both"`` (the protocol), or the sanity variants of PROTOCOL
            section 6 E: ``"front"`` (IRIs into the front only, targets on real images)
            and ``"back"`` (real images into the front, targets on IRIs).
        iris_cache: folder of the IRI cache (see :func:`~stitchlab.iris.generate_iris_set`).
        iris_options: IRI recipe options (steps, step_size, optimizer, ...).
        allow_flagged_iris: use an IRI set whose median error is above its threshold.
        leaf_modules: module classes that torch.fx must not trace into (both models).
        output: which element of a model's output is the logits, when its forward returns
            a tuple or dict (an index or key; a pair ``(front's, back's)`` when they
            differ); default: the first element of a tuple, the ``"logits"`` of a dict.
        layouts: the activation layout of named points (``{"features.3": "NHWC"}``,
            see :data:`stitchlab.splitting.LAYOUTS`) where detection from the graph fails
            or must be overridden.
        settings: a :class:`TrainingConfig` (instead of its fields as keywords).
        iris_recipe: an :class:`~stitchlab.iris.IRIRecipe` for generated IRIs (instead of
            recipe fields in ``iris_options``).
        **training: any :class:`TrainingConfig` field (epochs, lr, batch_size, solver,
            init, cache, frozen_mode, seed, device, ...).

    Returns:
        The trained :class:`StitchedModel`, in eval mode. The global random state and the
        caller's models are left as they were.
    """
    if settings is not None and training:
        raise TypeError(
            f"stitch() got settings= and training options {sorted(training)}: put them in "
            "the TrainingConfig (settings.replace is dataclasses.replace) or pass only keywords."
        )
    cfg = settings if settings is not None else TrainingConfig.from_kwargs(**training)
    if settings is not None:
        cfg.validate()
    if iris_recipe is not None:
        recipe_fields = set(iris_options or {}) - {"threshold", "min_null_ratio"}
        if recipe_fields:
            raise TypeError(
                f"stitch() got iris_recipe= and recipe fields {sorted(recipe_fields)} in "
                "iris_options; put them in the IRIRecipe."
            )
        iris_options = {**(iris_options or {}), **iris_recipe.as_dict()}
    back_point = point if back_point is None else back_point
    front_output, back_output = output if isinstance(output, tuple) else (output, output)
    obj = _objective(objective, temperature, fula_points, fula_weights)
    if cfg.solver == "closed_form" and obj.name != "dm":
        raise ValueError("solver='closed_form' exists only for objective='dm'.")
    dataset, loader_bs = as_dataset(data, "data")
    init_set = dataset if init_data is None else as_dataset(init_data, "init_data")[0]
    batch_size = cfg.batch_size or loader_bs or 128
    device = torch.device(cfg.device) if cfg.device is not None else _module_device(front_model)
    iri_quality = None
    if protocol == "iris":
        dataset, iri_quality = _iris_training_set(
            front_model, point, dataset, iris, iris_branches, iris_cache,
            iris_options or {}, allow_flagged_iris, cfg.seed, device,
            {"leaf_modules": tuple(leaf_modules), "output": front_output},
        )  # fmt: skip
    elif protocol != "standard":
        raise ValueError(f"protocol must be 'standard' or 'iris', got {protocol!r}")
    elif iris is not None:
        raise ValueError("iris= was given but protocol='standard'; pass protocol='iris'.")

    _check_float32(front_model, "front")
    _check_float32(back_model, "back")
    # frozen copies: the caller's models keep their weights, modes and grad flags
    front_model = _freeze(copy.deepcopy(front_model)).to(device)
    back_model = _freeze(back_model if back_model is front_model else copy.deepcopy(back_model))
    back_model = back_model.to(device)
    frozen_train = cfg.frozen_mode == "train"
    front_model.train(frozen_train)
    back_model.train(frozen_train)

    traced_front = TracedModel(front_model, leaf_modules=leaf_modules, output=front_output)
    traced_back = (
        traced_front
        if back_model is front_model and back_output == front_output
        else TracedModel(back_model, leaf_modules=leaf_modules, output=back_output)
    )
    front, _ = traced_front.split(point)
    back_prefix, back = traced_back.split(back_point, taps="later")
    later = list(back.tap_names)
    obj.bind(back_point, later)
    targets = _Targets(traced_back, back_point, obj)

    # the activation formats, from a batch of 3 (an odd size tells the batch axis apart)
    x0 = torch.stack([dataset[i % len(dataset)][0] for i in range(3)]).to(device)
    if traced_back is traced_front:  # one pass of the model gives both formats
        both = _formats(traced_front, x0, list(dict.fromkeys([point, back_point])), layouts)
        src, dst = both[point].require(), both[back_point].require()
    else:
        src = _formats(traced_front, x0, [point], layouts, "front")[point].require()
        dst = _formats(traced_back, x0, [back_point], layouts, "back")[back_point].require()
    if "labels" in obj.target_keys:  # HLM: the labels must be classes of the back model
        from .data import labels_of

        with torch.no_grad():
            k = traced_back.logits_model()(x0).shape[-1]
        check_labels(labels_of(dataset), "data", num_classes=k)
    x0 = x0[: min(2, len(dataset))]
    with torch.random.fork_rng(devices=_cuda_devices(device)):  # the caller's RNG untouched
        torch.manual_seed(cfg.seed)
        return _fit(
            front, back_prefix, back, targets, obj, src, dst, point, back_point, later, cfg,
            protocol, iri_quality, dataset, init_set, batch_size, device, x0,
        )  # fmt: skip


def _objective(objective, temperature, fula_points, fula_weights) -> Objective:
    """The objective, with its options given once (in the object or as keywords)."""
    given = {k: v for k, v in (("temperature", temperature), ("fula_points", fula_points),
                               ("fula_weights", fula_weights)) if v is not None}  # fmt: skip
    if isinstance(objective, Objective):
        if given:
            raise TypeError(
                f"objective={type(objective).__name__}(...) carries its own options; "
                f"{sorted(given)} would be ignored. Set them in the objective object."
            )
        return make_objective(objective)
    name = str(objective).lower()
    allowed = {"slm": {"temperature"}, "fula": {"fula_points", "fula_weights"}}.get(name, set())
    wrong = sorted(set(given) - allowed)
    if wrong:
        raise TypeError(f"{wrong} do not apply to objective {objective!r}.")
    if name == "slm":
        return make_objective(objective, temperature=1.0 if temperature is None else temperature)
    if name == "fula":
        return make_objective(objective, points=fula_points, weights=fula_weights)
    return make_objective(objective)


def _cuda_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def _check_float32(model: nn.Module, what: str) -> None:
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        if p.is_floating_point() and p.dtype != torch.float32:
            raise ValueError(
                f"The {what} model has {p.dtype} weights ({name}); stitchlab stitches float32 "
                f"models. Convert it with model.float() first."
            )


def _formats(traced: TracedModel, x0: Tensor, points: list[str], layouts, what: str = "model"):
    """The activation formats at ``points``, or a clear error when the model cannot run on
    the data's images (channels, rank or image size the model does not take)."""
    from .splitting import SplitError

    try:
        return traced.formats(x0, points, layouts=layouts)
    except SplitError:
        raise
    except (RuntimeError, ValueError, AssertionError, IndexError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"The {what} model cannot run on the data's images of shape "
            f"{tuple(x0.shape[1:])}: {first}. Give it images with the channels, rank and "
            "size it was built for (a ViT takes only its own image size)."
        ) from None


def _fit(
    front, back_prefix, back, targets, obj, src, dst, point, back_point, later, cfg,
    protocol, iri_quality, dataset, init_set, batch_size, device, x0,
) -> StitchedModel:  # fmt: skip
    """Initialise and train the stitch layer (after the models are set up)."""
    with torch.no_grad():
        a0 = front(x0)
    layer = StitchLayer(src, dst).to(device)
    stitched = StitchedModel(front, layer, back, point, back_point, later, cfg.frozen_mode)
    stitched.objective = obj.name
    stitched.protocol = protocol
    stitched.iri_quality = iri_quality

    if cfg.init == "identity":
        layer.init_identity()
    elif cfg.init == "least_squares" or cfg.solver == "closed_form":
        # closed-form DM: the least-squares optimum over the whole stitching set
        subset = (
            dataset
            if cfg.solver == "closed_form"
            else _init_subset(init_set, cfg.init_samples, cfg.seed)
        )
        t0 = time.perf_counter()
        pairs = _activation_pairs(front, back_prefix, subset, device, 256)
        stitched.init_residual = fit_least_squares(layer, pairs, ridge=cfg.ridge)
        stitched.timings["init"] = time.perf_counter() - t0
    if cfg.solver == "closed_form":
        stitched.history = [float(stitched.init_residual or 0.0)]
        return stitched.eval()
    if cfg.epochs == 0:
        return stitched.eval()

    t0 = time.perf_counter()
    cache = _make_cache(front, targets, dataset, device, batch_size, cfg, a0, x0)
    stitched.timings["cache"] = time.perf_counter() - t0
    # one seeded permutation per epoch, whether cached or streamed: same batches either way
    gen = torch.Generator().manual_seed(cfg.seed)
    steps = math.ceil(len(dataset) / batch_size)
    if cache is not None:

        def epoch_batches(epoch: int):
            return cache.batches(batch_size, gen)
    else:
        sampler = _EpochBatches(len(dataset), batch_size, gen)
        dl = torch.utils.data.DataLoader(
            dataset, batch_sampler=sampler, num_workers=cfg.num_workers
        )

        def epoch_batches(epoch: int):
            for item in dl:
                x, y, xt = _triple(item, device)
                if cfg.adversarial is not None:  # adversarial stitch training
                    x_adv = _attack(stitched, x, y, cfg.adversarial)
                    xt = x_adv if xt is x else xt
                    x = x_adv
                with torch.no_grad():
                    a = front(x)
                    t = targets(xt, y)
                yield a, t

    stitched.cache_used = cache is not None
    t0 = time.perf_counter()
    stitched.history = _train_loop(stitched, obj, epoch_batches, steps, cfg)
    stitched.timings["train"] = time.perf_counter() - t0
    return stitched


def _iris_training_set(
    front_model, point, real, iris, branches, cache_dir, options, allow_flagged, seed, device,
    tracing,
):
    """The stitching set of the IRI protocol and the quality of its IRIs."""
    from torch.utils.data import TensorDataset

    from .iris import (
        MIN_NULL_RATIO,
        IRIError,
        IRIQuality,
        IRIResult,
        IRISet,
        generate_iris,
        generate_iris_set,
    )

    if branches not in ("both", "front", "back"):
        raise ValueError(f"iris_branches must be 'both', 'front' or 'back', got {branches!r}")
    options = dict(options)
    threshold = float(options.pop("threshold", 0.5))
    min_ratio = float(options.pop("min_null_ratio", MIN_NULL_RATIO))
    if iris is None:
        if cache_dir is not None:
            iris = generate_iris_set(
                front_model, point, real, cache_dir, seed=seed, threshold=threshold,
                min_null_ratio=min_ratio, device=device, **tracing, **options,
            )  # fmt: skip
        else:
            iris = generate_iris(
                front_model, point, real, seed=seed, device=device, **tracing, **options
            )
    quality = None
    if isinstance(iris, (IRIResult, IRISet)):  # judged with this call's thresholds
        quality = IRIQuality.of(
            iris.rel_error, iris.pixel_rms, threshold, iris.null_error, min_ratio
        )
        if isinstance(iris, IRIResult):
            iris = iris.iris
    if isinstance(iris, Tensor):
        if len(iris) != len(real):
            raise ValueError(
                f"{len(iris)} IRIs for {len(real)} stitching images: pass one IRI per image."
            )
        labels = torch.as_tensor([int(real[i][1]) for i in range(len(real))])
        iris = TensorDataset(iris.float(), labels)
    iri_set, _ = as_dataset(iris, "iris")
    if len(iri_set) != len(real):
        raise ValueError(f"{len(iri_set)} IRIs for {len(real)} stitching images.")
    if quality is not None and quality.flagged and not allow_flagged:
        raise IRIError(
            f"{quality}. These IRIs do not reproduce the front's representation well enough "
            "for invariance-aware stitching; use more steps or a larger/decaying step size, "
            "or pass allow_flagged_iris=True to use them anyway."
        )
    if branches == "front":
        return PairedImages(iri_set, real), quality
    if branches == "back":
        return PairedImages(real, iri_set), quality
    return iri_set, quality


def _attack(model: nn.Module, x: Tensor, y: Tensor, settings: dict) -> Tensor:
    """PGD (L-inf) examples against ``model``'s cross-entropy, with the model in eval mode."""
    from .attacks import pgd

    was = model.training
    model.eval()
    try:
        return pgd(model, x, y, **{"eps": 8 / 255, "step": 2 / 255, "steps": 10, **settings})
    finally:
        model.train(was)


def _make_cache(front, targets, dataset, device, batch_size, cfg, a0, x0):
    if cfg.cache is False or cfg.frozen_mode == "train" or cfg.adversarial is not None:
        return None
    if cfg.cache == "auto" and not is_deterministic(dataset):
        return None
    with torch.no_grad():
        t0 = targets(x0, torch.zeros(x0.shape[0], dtype=torch.long, device=device))
    need = _bytes_per_sample(a0, t0) * len(dataset)
    if need > cfg.cache_budget_bytes:
        if cfg.cache is True:
            raise MemoryError(
                f"The activation cache needs {need / 2**30:.2f} GiB, over the budget of "
                f"{cfg.cache_budget_bytes / 2**30:.2f} GiB; raise cache_budget_bytes or use "
                "cache='auto' to stream."
            )
        return None
    return ActivationCache.build(
        front, targets, dataset, device, max(batch_size, 256), cfg.num_workers
    )


# ---------------------------------------------------------------------------
# Evaluation


def evaluate(
    stitched: nn.Module,
    test_data: DataLike,
    reference: nn.Module | Tensor,
    *,
    batch_size: int = 256,
    attack: dict | None = None,
) -> dict[str, float]:
    """All scores of a stitched model against a reference (usually the back model).

    ``reference`` is a model (run in eval mode) or its logits on ``test_data``. Returns
    agreement, accuracy, hard agreement, error consistency, chance-normalised agreement
    and the reference's own accuracy. With ``attack`` (``reference`` must then be a
    model) also the scores of :func:`robust_scores`.
    """
    from ._data import predict

    was = stitched.training
    stitched.eval()
    logits, labels = predict(stitched, test_data, batch_size=batch_size)
    stitched.train(was)
    if isinstance(reference, nn.Module):
        ref_was = reference.training
        reference.eval()
        ref_logits, _ = predict(reference, test_data, batch_size=batch_size)
        reference.train(ref_was)
    else:
        ref_logits = reference.detach().float().cpu()
    if ref_logits.shape != logits.shape:
        raise ValueError(
            f"reference logits have shape {tuple(ref_logits.shape)}, the stitched model's "
            f"{tuple(logits.shape)}: they must be logits on the same test data."
        )
    k = logits.shape[1]
    check_labels(labels, "test_data", num_classes=k)
    agree = metrics.agreement(logits, ref_logits)
    robust = {}
    if attack is not None:
        robust = robust_scores(stitched, test_data, reference, attack, batch_size=batch_size)
    return robust | {
        "agreement": agree,
        "agreement_normalized": metrics.chance_normalized(agree, k),
        "accuracy": metrics.accuracy(logits, labels),
        "hard_agreement": metrics.hard_agreement(logits, ref_logits),
        "error_consistency": metrics.error_consistency(logits, ref_logits, labels),
        "reference_accuracy": metrics.accuracy(ref_logits, labels),
    }


def robust_scores(
    stitched: nn.Module,
    test_data: DataLike,
    reference: nn.Module,
    attack: dict,
    *,
    batch_size: int = 256,
) -> dict[str, float]:
    """Agreement and accuracy under attack: PGD examples against the stitched model
    (``attack``: ``{eps, step, steps}``, L-inf, and optionally ``samples``, to attack only
    the first that many test images), scored on both the stitched and the reference model.
    Returns ``robust_agreement``, ``robust_accuracy`` and ``robust_samples``.
    """
    if not isinstance(reference, nn.Module):
        raise ValueError("robust scores need the reference model, not its logits.")
    check_attack(attack, "attack", samples=True)
    settings = {k: v for k, v in attack.items() if k != "samples"}
    dataset, _ = as_dataset(test_data, "test_data")
    if "samples" in attack and attack["samples"] < len(dataset):
        dataset = torch.utils.data.Subset(dataset, range(int(attack["samples"])))
    device = _module_device(stitched)
    outs, refs, labels = [], [], []
    was, ref_was = stitched.training, reference.training
    stitched.eval()
    reference.eval()
    for x, y in batches(dataset, batch_size, device):
        x_adv = _attack(stitched, x, y, settings)
        with torch.no_grad():
            outs.append(stitched(x_adv).float().cpu())
            refs.append(reference(x_adv).float().cpu())
        labels.append(y.cpu())
    stitched.train(was)
    reference.train(ref_was)
    logits, ref_logits, y_all = torch.cat(outs), torch.cat(refs), torch.cat(labels)
    return {
        "robust_agreement": metrics.agreement(logits, ref_logits),
        "robust_accuracy": metrics.accuracy(logits, y_all),
        "robust_samples": len(y_all),
    }
