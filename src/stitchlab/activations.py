"""What a stitch is trained on: back-model targets, cached activations, stitching sets.

A :class:`StitchingSet` is the training set of one protocol (real images or IRIs). The
front's activations on it and the back model's targets do not depend on the objective, so
the set caches them on first use and every objective trained on it reads the same
tensors: the front runs once per set, and each target (labels, logits, activations at the
stitch point or later) is computed once, when the first objective asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ._data import check_training_items, is_deterministic, triples
from .splitting import TracedModel

__all__ = ["BackTargets", "ActivationCache", "StitchingSet"]


class BackTargets:
    """Computes, from images, the targets an objective compares against: the labels, the
    back model's logits and its activations at named points, running only as much of the
    back model as those keys need."""

    def __init__(self, back_model: TracedModel, back_point: str, keys: Sequence[str]) -> None:
        self.keys = list(keys)
        self.act_keys = [k for k in keys if k not in ("labels", "logits")]
        self.needs_logits = "logits" in keys
        self.model: nn.Module | None = None
        self._only: str | None = None
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
            out[self._only] = res  # type: ignore[index]
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

    def batches(self, batch_size: int, generator: torch.Generator) -> Iterator[tuple]:
        """Shuffled ``(activations, targets)`` batches for one epoch."""
        perm = torch.randperm(len(self), generator=generator)
        for i in range(0, len(self), batch_size):
            idx = perm[i : i + batch_size]
            yield self.activations[idx], {k: v[idx] for k, v in self.targets.items()}


class StitchingSet:
    """The training set of one protocol for one :class:`~stitchlab.stitcher.Stitcher`,
    with the IRI quality and the activations cached on it so far.

    Made by :meth:`Stitcher.collect`; pass it to :meth:`Stitcher.fit` for every objective
    that trains on the same data under the same protocol.
    """

    def __init__(
        self,
        owner: Any,
        dataset: Dataset,
        protocol: str,
        iri_quality: Any,
        batch_size: int | None,
        *,
        real: Dataset | None = None,
    ) -> None:
        check_training_items(dataset)  # a third item element would be read as targets
        self.owner = owner  # the Stitcher that made it (activations are its front's)
        self.dataset = dataset
        self.real = dataset if real is None else real  # the real stitching images
        self.protocol = protocol
        self.iri_quality = iri_quality
        self.batch_size = batch_size  # the data's own batch size (a DataLoader's), or None
        self.deterministic = is_deterministic(dataset)
        self._activations: Tensor | None = None
        self._targets: dict[str, Tensor] = {}
        self.passes = 0  # passes over the data made to fill the cache (for tests, benchmarks)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        """Memory held by the cached activations and targets."""
        tensors = [t for t in [self._activations, *self._targets.values()] if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def cached(
        self,
        front: nn.Module,
        back: TracedModel,
        back_point: str,
        keys: Sequence[str],
        per_sample: dict[str, int],
        budget: int,
        device: torch.device,
        batch_size: int,
        num_workers: int,
    ) -> ActivationCache | None:
        """The cache of the front activations and the ``keys`` targets, filling what is
        missing in one pass over the data; None when it would not fit ``budget`` bytes
        (targets no objective asks for now are dropped first). ``per_sample`` gives the
        bytes per sample of the activations (``"activations"``) and of every key."""
        need = sum(per_sample[k] for k in ["activations", *keys]) * len(self)
        if need > budget:
            return None
        held = self.nbytes
        missing = [k for k in keys if k not in self._targets]
        extra = sum(per_sample[k] for k in missing) * len(self)
        if held + extra > budget:  # keep only what this objective reads
            self._targets = {k: v for k, v in self._targets.items() if k in keys}
        if missing or self._activations is None:
            self._fill(front, back, back_point, missing, device, batch_size, num_workers)
        return ActivationCache(self._activations, {k: self._targets[k] for k in keys})  # type: ignore[arg-type]

    @torch.no_grad()
    def _fill(self, front, back, back_point, missing, device, batch_size, num_workers) -> None:
        need_acts = self._activations is None
        targets = BackTargets(back, back_point, missing) if missing else None
        acts: list[Tensor] = []
        tgts: dict[str, list[Tensor]] = {}
        for x, y, xt in triples(self.dataset, batch_size, device, num_workers):
            if need_acts:
                acts.append(front(x))
            if targets is not None:
                for k, v in targets(xt, y).items():
                    tgts.setdefault(k, []).append(v)
        self.passes += 1
        if need_acts:
            self._activations = torch.cat(acts)
        self._targets.update({k: torch.cat(v) for k, v in tgts.items()})
