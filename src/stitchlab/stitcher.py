"""The stitching life cycle as an object: one :class:`Stitcher` per (front, back, point).

A :class:`Stitcher` copies, freezes and traces the two networks once, cuts them at the
stitch points and learns the activation formats there. Its explicit steps are::

    st = Stitcher(front_model, back_model, "layer2.1")
    init = st.initialise(real_data)                  # least squares on real images
    data = st.collect(real_data, InvarianceAware())  # the protocol's training set
    for objective in ("hlm", "slm", "dm", "fula"):
        model = st.fit(objective, data, init=init, settings=TrainingConfig(epochs=6))
        scores = st.evaluate(model, test_data)

Work that does not depend on the objective is done once and shared: the least-squares
initialisation (per initialisation data, sample count, seed and ridge), the front's
activations on a training set and each of the back model's targets on it (see
:class:`~stitchlab.activations.StitchingSet`). A fit with shared work gives the same
stitch layer, to the bit, as a fit that computes everything itself.

:func:`stitch` is the one-call convenience wrapper: one Stitcher, one fit.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

from ._allocator import keep_freed_memory
from ._batchnorm import folded
from ._checks import check_device
from ._data import (
    DataLike,
    _module_device,
    _triple,
    as_dataset,
    batches,
)
from ._memory_format import channels_last
from .activations import BackTargets, StitchingSet
from .evaluation import evaluate as _evaluate
from .evaluation import pgd_examples
from .fit import UNDERDETERMINED_RIDGE, EpochBatches, TrainingConfig, images_needed, train_layer
from .layers import ActivationSpec, StitchLayer, fit_least_squares
from .objectives import Objective, make_objective
from .protocols import Protocol, Standard, as_protocol
from .splitting import LogitsOnly, OutputSelector, TracedModel
from .stitched import StitchedModel, StitchRecord

log = logging.getLogger("stitchlab.stitcher")

__all__ = ["Stitcher", "Initialisation", "FrontActivations", "stitch"]


@dataclass(frozen=True, eq=False)
class FrontActivations:
    """A data set as the frozen front prefix of one :class:`Stitcher` represents it:
    ``activations`` (N, ...) and ``labels`` (N,), from :meth:`Stitcher.front_activations`.
    :meth:`Stitcher.evaluate` scores every model that Stitcher fits on them without running
    the front again (the front is frozen, so its activations are the same for every fit)."""

    activations: Tensor
    labels: Tensor
    owner: int  # id() of the Stitcher whose front computed them

    def __len__(self) -> int:
        return int(self.labels.shape[0])


class _OnActivations(nn.Module):
    """A fitted model run from its front activation: stitch layer and back suffix."""

    def __init__(self, model: StitchedModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, a: Tensor) -> Tensor:  # noqa: D102
        return self.model.from_activation(a).logits  # type: ignore[return-value]


@dataclass(frozen=True)
class Initialisation:
    """A stitch layer's initial weights (``state``) and how they were obtained: the
    normalised least-squares residual, the number of samples fitted and the seconds it
    took. ``underdetermined``: the samples gave fewer rows than unknowns per output
    (:func:`stitchlab.fit.images_needed` is ``images_needed``), so ``ridge`` is
    :data:`~stitchlab.fit.UNDERDETERMINED_RIDGE` where none was asked for."""

    state: Mapping[str, Tensor]
    residual: float
    samples: int
    seed: int
    ridge: float
    seconds: float
    underdetermined: bool = False
    images_needed: int = 0


def _freeze(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class Stitcher:
    """Stitches ``front_model`` at ``point`` into ``back_model`` at ``back_point``.

    Args:
        front_model: the trained network whose early layers are kept (not modified: a
            frozen copy is used).
        back_model: the trained network whose late layers are kept (likewise; the same
            object as ``front_model`` shares one copy).
        point: stitch point of the front (see :func:`~stitchlab.stitch_points`).
        back_point: stitch point of the back (default: ``point``).
        leaf_modules: module classes that torch.fx must not trace into (both models).
        output: which element of a model's output is the logits (an index or key; a pair
            ``(front's, back's)`` when they differ).
        layouts: activation layouts of named points where detection from the graph fails
            or must be overridden (see :data:`stitchlab.splitting.LAYOUTS`); a pair
            ``(front's, back's)`` when the two models name points alike.
        device: where everything runs (default: the front model's device).

    The activation formats are learned from the first data the Stitcher sees
    (:meth:`setup`, called by every step). Models returned by :meth:`fit` share the
    Stitcher's frozen front and back modules.
    """

    def __init__(
        self,
        front_model: nn.Module,
        back_model: nn.Module,
        point: str,
        back_point: str | None = None,
        *,
        leaf_modules: Sequence[type] = (),
        output: OutputSelector | tuple[OutputSelector, OutputSelector] = None,
        layouts: Mapping[str, str] | tuple[Mapping[str, str] | None, Mapping[str, str] | None]
        | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        if not isinstance(front_model, nn.Module) or not isinstance(back_model, nn.Module):
            raise TypeError("front_model and back_model must be torch.nn.Module instances.")
        _check_float32(front_model, "front")
        _check_float32(back_model, "back")
        self.point = point
        self.back_point = point if back_point is None else back_point
        self.device = check_device(device) if device is not None else _module_device(front_model)
        if self.device.type == "cpu":
            keep_freed_memory()  # reuse each batch's buffers instead of new pages (_allocator)
        self.leaf_modules = tuple(leaf_modules)
        self.output = output
        self.layouts = layouts
        front_output, back_output = output if isinstance(output, tuple) else (output, output)
        self._front_output = front_output
        same = back_model is front_model
        # frozen copies: the caller's models keep their weights, modes and grad flags
        self.front_model = _freeze(copy.deepcopy(front_model)).to(self.device).eval()
        self.back_model = (
            self.front_model if same else _freeze(copy.deepcopy(back_model)).to(self.device).eval()
        )
        # the halves are checked against the whole models on the first data (setup)
        traced_front = TracedModel(self.front_model, leaf_modules=self.leaf_modules,
                                   output=front_output, verify=False)  # fmt: skip
        self._traced_front = traced_front
        self._traced_back = (
            traced_front
            if same and back_output == front_output
            else TracedModel(self.back_model, leaf_modules=self.leaf_modules, output=back_output,
                             verify=False)  # fmt: skip
        )
        self._front, self._front_rest = traced_front.split(point)
        self._back_prefix, self._back = self._traced_back.split(self.back_point, taps="later")
        self.later_points: list[str] = list(self._back.tap_names)
        self._specs: tuple[ActivationSpec, ActivationSpec] | None = None
        self._x0: Tensor | None = None
        self._num_classes: int | None = None
        self._sample_bytes: dict[str, int] = {}
        self._inits: dict[tuple, tuple[Any, Initialisation]] = {}
        self._frozen_train = False
        self._folded_back: nn.Module | None = None  # see _training_back
        # set by setup(): True when both frozen models run channels-last (each side is
        # converted where its own trial agrees; the flag says whether both were)
        self.channels_last = False

    def __repr__(self) -> str:
        return (
            f"Stitcher({type(self.front_model).__name__} at {self.point!r} -> "
            f"{type(self.back_model).__name__} at {self.back_point!r}, {self.device})"
        )

    @property
    def front_prefix(self) -> nn.Module:
        """The frozen front cut at ``point``: images -> the front's activation."""
        return self._front

    @property
    def back_prefix(self) -> nn.Module:
        """The frozen back cut at ``back_point``: images -> the back's activation."""
        return self._back_prefix

    # ------------------------------------------------------------------ set up

    def setup(self, data: DataLike) -> tuple[ActivationSpec, ActivationSpec]:
        """Learn the activation formats at both points from a batch of 3 of ``data`` (an
        odd batch size tells the batch axis apart); later calls return the same formats.
        Raises a clear error when a model cannot run on the data's images."""
        if self._specs is not None:
            return self._specs
        dataset = as_dataset(data, "data")[0]
        x0 = torch.stack([dataset[i % len(dataset)][0] for i in range(3)]).to(self.device)  # type: ignore[arg-type]
        point, back_point = self.point, self.back_point
        _check_splits(self, x0)
        if self._traced_back is self._traced_front:  # one pass gives both formats
            if isinstance(self.layouts, tuple):
                raise TypeError("one model on both sides: give one layouts mapping, not a pair")
            both = _formats(self._traced_front, x0, list(dict.fromkeys([point, back_point])),
                            self.layouts)  # fmt: skip
            src, dst = both[point].require(), both[back_point].require()
        else:
            front_layouts, back_layouts = (self.layouts if isinstance(self.layouts, tuple)
                                           else _shared_layouts(self, self.layouts))  # fmt: skip
            src = _formats(self._traced_front, x0, [point], front_layouts, "front")[point]
            dst = _formats(self._traced_back, x0, [back_point], back_layouts, "back")[back_point]
            src, dst = src.require(), dst.require()
        self._specs = (src, dst)
        self._x0 = x0[: min(2, len(dataset))]  # type: ignore[arg-type]
        # convolutional models run channels-last on the CPU where a trial agrees with NCHW
        # (the copies are the Stitcher's own; every split shares their parameters)
        self.channels_last = channels_last(self._traced_front.logits_model(), x0)
        if self._traced_back is not self._traced_front:
            back_cl = channels_last(self._traced_back.logits_model(), x0)
            self.channels_last = self.channels_last and back_cl
        return self._specs

    @property
    def num_classes(self) -> int:
        """The back model's number of classes (after :meth:`setup`)."""
        if self._num_classes is None:
            if self._x0 is None:
                raise RuntimeError("call setup(data) (or any step) before num_classes.")
            with torch.no_grad():
                self._num_classes = int(self._traced_back.logits_model()(self._x0).shape[-1])
        return self._num_classes

    # --------------------------------------------------------------- the steps

    def collect(
        self, data: DataLike, protocol: str | Protocol = "standard", *, seed: int = 0
    ) -> StitchingSet:
        """The training set of ``protocol`` for the stitching ``data`` (for the IRI protocol:
        the front's IRIs of ``data``, generated with ``seed`` unless given). Pass it to
        :meth:`fit` for every objective: the activations cached on it are shared."""
        proto = as_protocol(protocol) if isinstance(protocol, str) else protocol
        if not isinstance(proto, Protocol):
            raise TypeError(f"protocol must be a name or a Protocol, got {protocol!r}")
        real, loader_bs = as_dataset(data, "data")
        self.setup(real)
        tracing = {"leaf_modules": self.leaf_modules, "output": self._front_output}
        train_set, quality = proto.training_set(
            self.front_model, self.point, real, seed=seed, device=self.device, tracing=tracing
        )
        return StitchingSet(self, train_set, proto.name, quality, loader_bs, real=real)

    def initialise(
        self, data: DataLike, *, samples: int = 500, seed: int = 0, ridge: float = 0.0
    ) -> Initialisation:
        """Least-squares weights of the stitch layer from the front's to the back's
        activations on up to ``samples`` images of ``data`` (a seeded subset). Computed
        once per (data, samples, seed, ridge) and reused by every later call and fit."""
        return self._initialisation(data, samples, seed, ridge)[0]

    def fit(
        self,
        objective: str | Objective = "slm",
        data: StitchingSet | DataLike | None = None,
        *,
        protocol: str | Protocol | None = None,
        settings: TrainingConfig | None = None,
        init: Initialisation | None = None,
        init_data: DataLike | None = None,
        **training,
    ) -> StitchedModel:
        """Train a stitch layer on ``objective`` and return the stitched model.

        ``data`` is a :class:`StitchingSet` from :meth:`collect` or stitching data (then
        collected under ``protocol``, default standard). ``settings`` is a
        :class:`TrainingConfig` (or give its fields as keywords). The initialisation is
        ``init``, or computed (and shared) from ``init_data`` (default: the real stitching
        images). The global random state is left as it was.
        """
        cfg = _settings(settings, training)
        obj = make_objective(objective)
        if cfg.solver == "closed_form" and obj.name != "dm":
            raise ValueError("solver='closed_form' exists only for objective='dm'.")
        if cfg.device is not None and not _same_device(torch.device(cfg.device), self.device):
            raise ValueError(
                f"settings.device is {cfg.device!r} but this Stitcher runs on {self.device}; "
                "build the Stitcher with device=... instead."
            )
        if data is None:
            raise TypeError("fit() needs the stitching data (or a StitchingSet from collect()).")
        if isinstance(data, StitchingSet):
            if data.owner is not self:
                raise ValueError(
                    "this StitchingSet was collected by another Stitcher: its activations are "
                    "another front's. Collect it with this Stitcher."
                )
            if protocol is not None:
                raise TypeError("a StitchingSet already has its protocol; do not pass protocol=.")
            sset = data
        else:
            sset = self.collect(data, protocol if protocol is not None else Standard(),
                                seed=cfg.seed)  # fmt: skip
        if not self._frozen_train:  # the labels must be classes of the back model
            from ._checks import check_class_labels
            from .data import labels_of

            check_class_labels(labels_of(sset.dataset), self.num_classes, "data")
        if cfg.frozen_mode == "train" and not self._frozen_train:
            # BatchNorm statistics of the frozen networks change in train mode: own copies
            twin = self._train_mode_copy()
            tset = StitchingSet(twin, sset.dataset, sset.protocol, sset.iri_quality,
                                sset.batch_size, real=sset.real)  # fmt: skip
            return twin.fit(obj, tset, settings=cfg, init=init, init_data=init_data)
        obj.bind(self.back_point, self.later_points)
        with torch.random.fork_rng(devices=_cuda_devices(self.device)):
            torch.manual_seed(cfg.seed)
            return self._fit(obj, sset, cfg, init, init_data)

    def front_activations(
        self, data: DataLike, *, batch_size: int = 256, budget_bytes: int | None = None
    ) -> FrontActivations | None:
        """The frozen front prefix's activations of ``data`` (in eval mode, in batches of
        ``batch_size`` as :func:`stitchlab.evaluate` runs them, so scores on them equal
        scores on ``data``), to evaluate many fitted models without rerunning the front.
        None, computing nothing, when they would need more than ``budget_bytes``."""
        dataset = as_dataset(data, "test_data")[0]
        self.setup(dataset)  # fixes the memory format before any activation is computed
        if budget_bytes is not None:
            if self._bytes_per_sample([])["activations"] * len(dataset) > budget_bytes:  # type: ignore[arg-type]
                return None
        acts, labels = [], []
        with torch.no_grad():
            for x, y in batches(dataset, batch_size, self.device):
                acts.append(self._front(x))
                labels.append(y.cpu())
        if not acts:
            raise ValueError("test_data is empty")
        return FrontActivations(torch.cat(acts), torch.cat(labels), id(self))

    def evaluate(
        self,
        model: StitchedModel,
        test_data: DataLike | FrontActivations,
        reference: nn.Module | Tensor | None = None,
        *,
        batch_size: int = 256,
        attack: dict | None = None,
    ) -> dict[str, float]:
        """Scores of ``model`` against ``reference`` (default: the back model) on
        ``test_data``; see :func:`stitchlab.evaluate`. ``test_data`` may be this Stitcher's
        :meth:`front_activations` of the test set: then ``reference`` must be the
        reference's logits on that set, and no ``attack`` (attacks need the inputs)."""
        if isinstance(test_data, FrontActivations):
            if test_data.owner != id(self) or model.front is not self._front:
                raise ValueError(
                    "these front activations come from another Stitcher, or the model was "
                    "not fitted by this one: evaluate on the test data itself"
                )
            if not isinstance(reference, Tensor):
                raise TypeError("with front activations give the reference's logits on the "
                                "test data (a Tensor), not a model")  # fmt: skip
            if attack is not None:
                raise ValueError("an attack needs the test inputs, not front activations")
            data = TensorDataset(test_data.activations, test_data.labels)
            return _evaluate(_OnActivations(model), data, reference, batch_size=batch_size)
        ref = (LogitsOnly(self.back_model, self._traced_back.output) if reference is None
               else reference)  # fmt: skip
        return _evaluate(model, test_data, ref, batch_size=batch_size, attack=attack)

    # --------------------------------------------------------------- internals

    def _initialisation(self, data, samples, seed, ridge) -> tuple[Initialisation, bool]:
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        identity, refs = _identity(data)
        key = (identity, samples, seed, float(ridge))
        hit = self._inits.get(key)
        if hit is not None:
            return hit[1], True
        dataset = as_dataset(data, "init_data")[0]
        src, dst = self.setup(dataset)
        subset = _init_subset(dataset, samples, seed)
        needed = images_needed(src, dst)
        under = len(subset) < needed  # type: ignore[arg-type]
        used = UNDERDETERMINED_RIDGE if under and not ridge else float(ridge)
        if under:
            log.info("least squares %s -> %s: %d images give fewer rows than unknowns (needs "
                     "%d images); ridge %g", self.point, self.back_point, len(subset),  # type: ignore[arg-type]
                     needed, used)  # fmt: skip
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=_cuda_devices(self.device)):
            torch.manual_seed(seed)  # as a fit with this seed builds its layer
            layer = StitchLayer(src, dst).to(self.device)
            pairs = _activation_pairs(self._front, self._back_prefix, subset, self.device, 256)
            residual = fit_least_squares(layer, pairs, ridge=used)
        init = Initialisation(
            state={k: v.detach().clone() for k, v in layer.state_dict().items()},
            residual=residual, samples=len(subset), seed=seed, ridge=used,  # type: ignore[arg-type]
            seconds=time.perf_counter() - t0, underdetermined=under, images_needed=needed,
        )  # fmt: skip
        self._inits[key] = (refs, init)  # holding the objects keeps their ids from reuse
        return init, False

    def _fit(self, obj, sset: StitchingSet, cfg: TrainingConfig, init, init_data):
        src, dst = self.setup(sset.dataset)
        layer = StitchLayer(src, dst).to(self.device)
        timings: dict[str, float] = {}
        residual, reused = None, False
        if cfg.init == "identity" and cfg.solver != "closed_form":
            layer.init_identity()
        elif cfg.init == "least_squares" or cfg.solver == "closed_form":
            if cfg.solver == "closed_form":  # the least-squares optimum over the whole set
                init, reused = self._initialisation(sset.dataset, len(sset), cfg.seed, cfg.ridge)
            elif init is not None:
                reused = True
            else:
                source = init_data if init_data is not None else sset.real
                init, reused = self._initialisation(source, cfg.init_samples, cfg.seed,
                                                    cfg.ridge)  # fmt: skip
            layer.load_state_dict(init.state)  # type: ignore[union-attr]
            residual = init.residual  # type: ignore[union-attr]
            timings["init"] = 0.0 if reused else init.seconds  # type: ignore[union-attr]
        stitched = StitchedModel(self._front, layer, self._back, self.point, self.back_point,
                                 self.later_points, cfg.frozen_mode)  # fmt: skip
        # the training loop runs the same layer through a back suffix whose eval-mode
        # BatchNorms are folded into its convolutions; the fitted model keeps the suffix
        trainee = stitched
        if cfg.frozen_mode == "eval":
            trainee = StitchedModel(self._front, layer, self._training_back(), self.point,
                                    self.back_point, self.later_points, "eval")  # fmt: skip
        record = dict(objective=obj.name, protocol=sset.protocol, point=self.point,
                      back_point=self.back_point, settings=cfg, init_residual=residual,
                      init_reused=reused, iri_quality=sset.iri_quality)  # fmt: skip
        if cfg.solver == "closed_form":
            return stitched.with_record(StitchRecord(
                **record, history=(float(residual or 0.0),), timings=timings,
            )).eval()  # fmt: skip
        if cfg.epochs == 0:
            return stitched.with_record(StitchRecord(**record, timings=timings)).eval()

        batch_size = cfg.batch_size or sset.batch_size or 128
        t0 = time.perf_counter()
        cache = self._cache(sset, obj, cfg, batch_size)
        timings["cache"] = time.perf_counter() - t0
        # one seeded permutation per epoch, whether cached or streamed: same batches either way
        gen = torch.Generator().manual_seed(cfg.seed)
        steps = math.ceil(len(sset) / batch_size)
        if cache is not None:

            def epoch_batches(epoch: int):
                return cache.batches(batch_size, gen)
        else:
            targets = BackTargets(self._traced_back, self.back_point, obj.target_keys)
            sampler = EpochBatches(len(sset), batch_size, gen)
            dl = torch.utils.data.DataLoader(
                sset.dataset, batch_sampler=sampler, num_workers=cfg.num_workers
            )
            front, device = self._front, self.device

            def epoch_batches(epoch: int):
                for item in dl:
                    x, y, xt = _triple(item, device)
                    if cfg.adversarial is not None:  # adversarial stitch training
                        x_adv = pgd_examples(trainee, x, y, cfg.adversarial)
                        xt = x_adv if xt is x else xt
                        x = x_adv
                    with torch.no_grad():
                        a = front(x)
                        t = targets(xt, y)
                    yield a, t

        t0 = time.perf_counter()
        history, step_losses = train_layer(trainee, obj, epoch_batches, steps, cfg)
        timings["train"] = time.perf_counter() - t0
        return stitched.with_record(StitchRecord(
            **record, history=tuple(history), step_losses=tuple(step_losses),
            cache_used=cache is not None, timings=timings,
        )).eval()  # fmt: skip

    def _training_back(self) -> nn.Module:
        """The back suffix as the training loop runs it (after :meth:`setup`): a copy with
        its eval-mode BatchNorms folded into the convolutions before them where that is
        exact and a trial agrees (:mod:`stitchlab._batchnorm`), else the suffix itself."""
        if self._folded_back is None:
            back, was_training = self._back, self._back.training
            back.eval()
            try:
                with torch.no_grad():
                    z = self._back_prefix(self._x0)
                self._folded_back, _ = folded(back, z)
            finally:
                back.train(was_training)
        return self._folded_back

    def _cache(self, sset: StitchingSet, obj, cfg: TrainingConfig, batch_size: int):
        if cfg.cache is False or cfg.frozen_mode == "train" or cfg.adversarial is not None:
            return None
        if cfg.cache == "auto" and not sset.deterministic:
            return None
        keys = list(obj.target_keys)
        per_sample = self._bytes_per_sample(keys)
        cache = sset.cached(
            self._front, self._traced_back, self.back_point, keys, per_sample,
            cfg.cache_budget_bytes, self.device, max(batch_size, 256), cfg.num_workers,
        )  # fmt: skip
        if cache is None and cfg.cache is True:
            need = sum(per_sample[k] for k in ["activations", *keys]) * len(sset)
            raise MemoryError(
                f"The activation cache needs {need / 2**30:.2f} GiB, over the budget of "
                f"{cfg.cache_budget_bytes / 2**30:.2f} GiB; raise cache_budget_bytes or use "
                "cache='auto' to stream."
            )
        return cache

    def _bytes_per_sample(self, keys: Sequence[str]) -> dict[str, int]:
        """Bytes per sample of the front activations and of each target key."""
        missing = [k for k in ["activations", *keys] if k not in self._sample_bytes]
        if missing:
            x0 = self._x0
            with torch.no_grad():
                if "activations" in missing:
                    self._sample_bytes["activations"] = _sample_nbytes(self._front(x0))
                wanted = [k for k in missing if k != "activations"]
                if wanted:
                    zeros = torch.zeros(x0.shape[0], dtype=torch.long, device=self.device)  # type: ignore[union-attr]
                    out = BackTargets(self._traced_back, self.back_point, wanted)(x0, zeros)
                    self._sample_bytes.update({k: _sample_nbytes(v) for k, v in out.items()})
        return {k: self._sample_bytes[k] for k in ["activations", *keys]}

    def _train_mode_copy(self) -> Stitcher:
        """A Stitcher on its own copies of the frozen networks, for train-mode fits."""
        same = self.back_model is self.front_model
        twin = Stitcher(
            self.front_model, self.front_model if same else self.back_model, self.point,
            self.back_point, leaf_modules=self.leaf_modules, output=self.output,
            layouts=self.layouts, device=self.device,
        )  # fmt: skip
        twin.front_model.train()
        twin.back_model.train()
        twin._frozen_train = True
        return twin


# ---------------------------------------------------------------------------
# The one-call wrapper


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
    protocol: Protocol | Literal["standard", "iris"] = "standard",
    leaf_modules: Sequence[type] = (),
    output: OutputSelector | tuple[OutputSelector, OutputSelector] = None,
    layouts: Mapping[str, str] | None = None,
    settings: TrainingConfig | None = None,
    **training,
) -> StitchedModel:
    """Train a stitch from ``front_model`` at ``point`` into ``back_model`` at ``back_point``:
    one :class:`Stitcher`, one :meth:`Stitcher.fit`.

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
        protocol: :class:`~stitchlab.protocols.Standard` (trains on ``data``, the default)
            or :class:`~stitchlab.protocols.InvarianceAware` (trains on the front's IRIs
            of ``data`` at ``point``; it holds the IRIs or how to make them: ``iris``,
            ``cache``, ``recipe``, ``branches``, thresholds, ``allow_flagged``). The
            names ``"standard"`` and ``"iris"`` stand for those objects with their
            defaults.
        leaf_modules: module classes that torch.fx must not trace into (both models).
        output: which element of a model's output is the logits, when its forward returns
            a tuple or dict (an index or key; a pair ``(front's, back's)`` when they
            differ); default: the first element of a tuple, the ``"logits"`` of a dict.
        layouts: the activation layout of named points (``{"features.3": "NHWC"}``,
            see :data:`stitchlab.splitting.LAYOUTS`) where detection from the graph fails
            or must be overridden.
        settings: a :class:`TrainingConfig` (instead of its fields as keywords).
        **training: any :class:`TrainingConfig` field (epochs, lr, batch_size, solver,
            init, cache, frozen_mode, seed, device, ...).

    Returns:
        The trained :class:`StitchedModel`, in eval mode, with its :class:`StitchRecord`.
        The global random state and the caller's models are left as they were.
    """
    _no_iris_keywords(training)
    cfg = _settings(settings, training)
    obj = _objective(objective, temperature, fula_points, fula_weights)
    if cfg.solver == "closed_form" and obj.name != "dm":
        raise ValueError("solver='closed_form' exists only for objective='dm'.")
    proto = as_protocol(protocol)
    device = (check_device(cfg.device) if cfg.device is not None
              else _module_device(front_model))  # fmt: skip
    stitcher = Stitcher(front_model, back_model, point, back_point, leaf_modules=leaf_modules,
                        output=output, layouts=layouts, device=device)  # fmt: skip
    return stitcher.fit(obj, data, protocol=proto, settings=cfg, init_data=init_data)


# ---------------------------------------------------------------------------
# Helpers


# stitch()'s former IRI keywords and the InvarianceAware field each became
_IRIS_KEYWORDS = {
    "iris": "iris", "iris_branches": "branches", "iris_cache": "cache",
    "iris_options": "recipe=IRIRecipe(...), threshold, min_null_ratio",
    "iris_recipe": "recipe", "allow_flagged_iris": "allow_flagged",
}  # fmt: skip


def _no_iris_keywords(training: dict) -> None:
    """Refuse the IRI keywords stitch() no longer takes, naming what replaces them."""
    old = [k for k in _IRIS_KEYWORDS if k in training]
    if old:
        fields = ", ".join(f"{k} -> {_IRIS_KEYWORDS[k]}" for k in old)
        raise TypeError(
            f"stitch() got {', '.join(old)}: the IRIs and their options belong to the "
            f"protocol object. Pass protocol=InvarianceAware(...) ({fields}); "
            "InvarianceAware is stitchlab.InvarianceAware."
        )


def _settings(settings: TrainingConfig | None, training: dict) -> TrainingConfig:
    if settings is not None and training:
        raise TypeError(
            f"got settings= and training options {sorted(training)}: put them in the "
            "TrainingConfig (dataclasses.replace(settings, ...)) or pass only keywords."
        )
    if settings is None:
        return TrainingConfig.from_kwargs(**training)
    if not isinstance(settings, TrainingConfig):
        raise TypeError(f"settings must be a TrainingConfig, got {type(settings).__name__}")
    settings.validate()
    return settings


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


def _identity(data: Any) -> tuple[tuple, Any]:
    """What identifies ``data`` for sharing an initialisation, and the objects to hold so
    that their ids stay unique: the tensors of ``(images, labels)`` or a TensorDataset
    (which a new wrapper around the same tensors shares), else the object itself."""
    from torch.utils.data import TensorDataset

    if isinstance(data, TensorDataset):
        data = tuple(data.tensors)
    if isinstance(data, (tuple, list)) and all(isinstance(t, Tensor) for t in data):
        return ("tensors", *(id(t) for t in data)), tuple(data)
    return ("object", id(data)), data


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _cuda_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def _sample_nbytes(t: Tensor) -> int:
    return t[0].numel() * t.element_size()


def _check_float32(model: nn.Module, what: str) -> None:
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        if p.is_floating_point() and p.dtype != torch.float32:
            raise ValueError(
                f"The {what} model has {p.dtype} weights ({name}); stitchlab stitches float32 "
                f"models. Convert it with model.float() first."
            )


def _check_splits(st: Stitcher, x0: Tensor) -> None:
    """Both cuts checked against their whole models on the data's first images (a model
    that cannot run on them gets the clear error of :func:`_formats`)."""
    from .splitting import _ModelFailed

    for traced, point, front, back, what in (
        (st._traced_front, st.point, st._front, st._front_rest, "front"),
        (st._traced_back, st.back_point, st._back_prefix, st._back, "back"),
    ):
        try:
            traced.check_split(x0, point, front, back)
        except _ModelFailed:
            _formats(traced, x0, [point], None, what)  # raises the clear error
            raise


def _shared_layouts(st: Stitcher, layouts: Mapping[str, str] | None) -> tuple[dict, dict]:
    """One ``layouts`` mapping for two models: each model takes the names that are its
    points; a name that is a point of neither is an error."""
    from .splitting import SplitError

    layouts = dict(layouts or {})
    front, back = st._traced_front.layout_names(), st._traced_back.layout_names()
    for p in layouts:
        if p not in front and p not in back:
            raise SplitError(
                f"layouts names {p!r}, which is a point of neither the front "
                f"({type(st.front_model).__name__}) nor the back ({type(st.back_model).__name__}); "
                "name the points whose layout you give (stitchlab layers lists them)."
            )
    return ({p: v for p, v in layouts.items() if p in front},
            {p: v for p, v in layouts.items() if p in back})  # fmt: skip


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


def _init_subset(dataset: Dataset, n: int, seed: int) -> Dataset:
    total = len(dataset)  # type: ignore[arg-type]
    if n >= total:
        return dataset
    idx = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:n]
    return torch.utils.data.Subset(dataset, idx.tolist())


def _activation_pairs(front: nn.Module, back_prefix: nn.Module, dataset: Dataset, device,
                      batch_size: int):  # fmt: skip
    # no_grad around each batch, not around the yield: a generator suspended inside a
    # no_grad block and closed after its consumer raised would switch gradients off for
    # the whole process when it is collected
    for x, _ in batches(dataset, batch_size, device):
        with torch.no_grad():
            pair = front(x), back_prefix(x)
        yield pair

