"""The base-model training loop: standard, shortcut (marked data), adversarial, SimCLR.

Every epoch draws its shuffle, augmentation and attack randomness from generators seeded
by ``(seed, epoch)``, and the learning rate is a pure function of the step, so a run
resumed from its last finished epoch ends with the same weights as an uninterrupted one.
The state after each epoch (weights, optimizer, history) is one safetensors file,
replaced atomically.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from .._data import DataLike, _module_device, as_dataset
from ..attacks import pgd
from ..data.markers import Marked, _mix
from ..data.transforms import train_augmentation
from .evaluation import accuracy_on, evaluate_classifier
from .recipes import Recipe, fast_recipe

__all__ = ["train_model", "TrainResult", "Augmented", "STATE_FILE", "MODEL_FILE"]

STATE_FILE = "checkpoint.safetensors"
MODEL_FILE = "model.safetensors"
_STATE_FORMAT = "stitchlab-train-state-1"


class TrainingDivergedError(RuntimeError):
    """Model training left non-finite weights."""


@dataclass
class TrainResult:
    """What :func:`train_model` returns."""

    model: nn.Module
    history: list[dict[str, float]]
    evaluation: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    resumed_from: int = 0

    @property
    def finished(self) -> bool:
        """True when the recipe's last epoch has been trained."""
        return bool(self.history) and self.history[-1].get("final", False)


class Augmented(Dataset):
    """Apply ``transform`` to the image of each ``(image, label, ...)`` item."""

    def __init__(self, dataset: Dataset, transform: Callable[[Tensor], Tensor]) -> None:
        self.dataset = dataset
        self.transform = transform
        self.classes = getattr(dataset, "classes", None)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        item = self.dataset[index]
        return (self.transform(item[0]), *item[1:])

    @property
    def targets(self) -> Tensor:
        """The labels of the wrapped data set."""
        from ..data.tensors import labels_of

        return labels_of(self.dataset)


def _with_transform(dataset: Dataset, transform: Callable[[Tensor], Tensor]) -> Dataset:
    """``dataset`` with ``transform`` applied before any marker is pasted."""
    if isinstance(dataset, Marked):
        marked = copy.copy(dataset)
        marked.dataset = _with_transform(dataset.dataset, transform)
        return marked
    if isinstance(dataset, Subset):
        return Subset(_with_transform(dataset.dataset, transform), dataset.indices)
    return Augmented(dataset, transform)


# ---------------------------------------------------------------------------
# Device, precision, optimizer


def _amp_settings(recipe: Recipe, device: torch.device) -> tuple[bool, torch.dtype, bool]:
    """``(autocast on, autocast dtype, channels_last)`` for ``device``."""
    on_gpu = device.type == "cuda"
    use_amp = recipe.amp if recipe.amp is not None else on_gpu
    channels_last = recipe.channels_last if recipe.channels_last is not None else on_gpu
    dtype = torch.bfloat16
    if on_gpu and not torch.cuda.is_bf16_supported():
        dtype = torch.float16
    return bool(use_amp), dtype, bool(channels_last)


def _optimizer(params: list[nn.Parameter], recipe: Recipe) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=recipe.lr,
            momentum=recipe.momentum,
            nesterov=recipe.nesterov and recipe.momentum > 0,
            weight_decay=recipe.weight_decay,
        )
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


# ---------------------------------------------------------------------------
# Training state: one safetensors file


def _flatten_optimizer(sd: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors: dict[str, Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, Tensor):
                tensors[f"optimizer/{pid}/{k}"] = v.detach().cpu().contiguous().clone()
            else:
                plain.setdefault(str(pid), {})[k] = v
    return tensors, {"param_groups": sd["param_groups"], "state": plain}


def _unflatten_optimizer(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, v in tensors.items():
        if key.startswith("optimizer/"):
            _, pid, name = key.split("/", 2)
            state.setdefault(int(pid), {})[name] = v
    for pid, extra in meta["state"].items():
        state.setdefault(int(pid), {}).update(extra)
    return {"state": state, "param_groups": meta["param_groups"]}


class _State:
    """Reads and writes the per-epoch training state of a run folder."""

    def __init__(self, out: Path | None) -> None:
        self.path = out / STATE_FILE if out is not None else None

    def exists(self) -> bool:
        return self.path is not None and self.path.is_file()

    def save(
        self,
        modules: Mapping[str, nn.Module],
        opt: torch.optim.Optimizer,
        meta: dict[str, Any],
    ) -> None:
        from safetensors.torch import save_file

        from ..models.checkpoint import _atomic_write, tensors_sha256

        assert self.path is not None
        tensors: dict[str, Tensor] = {}
        for name, m in modules.items():
            for k, v in m.state_dict().items():
                tensors[f"{name}/{k}"] = v.detach().cpu().contiguous().clone()
        opt_tensors, opt_meta = _flatten_optimizer(opt.state_dict())
        tensors.update(opt_tensors)
        metadata = {
            "format": _STATE_FORMAT,
            "meta": json.dumps(meta),
            "optimizer": json.dumps(opt_meta),
            "sha256": tensors_sha256(tensors),
        }
        _atomic_write(self.path, lambda p: save_file(tensors, p, metadata=metadata))

    def load(self, modules: Mapping[str, nn.Module], opt: torch.optim.Optimizer) -> dict[str, Any]:
        from safetensors import safe_open

        from ..models.checkpoint import CheckpointError, tensors_sha256

        assert self.path is not None
        try:
            with safe_open(str(self.path), framework="pt") as f:
                metadata = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            if metadata.get("format") != _STATE_FORMAT:
                raise ValueError("not a stitchlab training state")
            if "sha256" in metadata and tensors_sha256(tensors) != metadata["sha256"]:
                raise ValueError("checksum mismatch: the file changed after it was written")
            meta = json.loads(metadata["meta"])
            opt_meta = json.loads(metadata["optimizer"])
        except Exception as exc:
            raise CheckpointError(
                f"Cannot resume from {str(self.path)!r}: it is damaged or not a stitchlab "
                f"training state ({exc}). Delete it to start over, or pass resume=False."
            ) from exc
        for name, m in modules.items():
            prefix = f"{name}/"
            sd = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            try:
                m.load_state_dict(sd, strict=True)
            except RuntimeError as exc:
                raise CheckpointError(
                    f"The training state {str(self.path)!r} does not fit the model ({exc}). "
                    "Use a new output folder or pass resume=False."
                ) from exc
        opt.load_state_dict(_unflatten_optimizer(tensors, opt_meta))
        return meta


# ---------------------------------------------------------------------------
# The loop


StepFn = Callable[[tuple, torch.Generator], tuple[Tensor, int, int]]


class _Run:
    """One training run over ``modules`` (all trained), with resumable epochs."""

    def __init__(
        self,
        modules: dict[str, nn.Module],
        recipe: Recipe,
        *,
        seed: int,
        out: Path | None,
        resume: bool,
        progress: bool,
        phase: str,
        device: torch.device,
    ) -> None:
        self.modules = modules
        self.recipe = recipe
        self.seed = seed
        self.progress = progress
        self.phase = phase
        self.device = device
        self.use_amp, self.amp_dtype, self.channels_last = _amp_settings(recipe, device)
        if self.channels_last:  # 4-d weights only; Linear layers are unaffected
            for m in modules.values():
                m.to(memory_format=torch.channels_last)
        params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
        self.opt = _optimizer(params, recipe)
        self.scaler = (
            torch.amp.GradScaler("cuda")
            if self.use_amp and self.amp_dtype == torch.float16
            else None
        )
        self.state = _State(out)
        self.history: list[dict[str, float]] = []
        self.start_epoch = 0
        if resume and self.state.exists():
            meta = self.state.load(modules, self.opt)
            self._check_resumable(meta)
            self.history = list(meta["history"])
            self.start_epoch = int(meta["epochs_done"])
            if self.scaler is not None and meta.get("scaler"):
                self.scaler.load_state_dict(meta["scaler"])

    def _check_resumable(self, meta: dict[str, Any]) -> None:
        from ..models.checkpoint import CheckpointError

        ours = self.recipe.to_dict()
        theirs = meta.get("recipe", {})
        differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        differ = [k for k in differ if k not in ("num_workers",)]
        if differ or meta.get("seed") != self.seed or meta.get("phase") != self.phase:
            what = ", ".join(differ) or "seed or phase"
            raise CheckpointError(
                f"The training state in {str(self.state.path)!r} was written by a different run "
                f"({what} differ). Use a new output folder, or pass resume=False to start over."
            )

    def _meta(self) -> dict[str, Any]:
        return {
            "epochs_done": len(self.history),
            "history": self.history,
            "recipe": self.recipe.to_dict(),
            "seed": self.seed,
            "phase": self.phase,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def autocast(self):
        return torch.autocast(
            device_type=self.device.type, dtype=self.amp_dtype, enabled=self.use_amp
        )

    def to_device(self, x: Tensor) -> Tensor:
        x = x.to(self.device, non_blocking=True)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _check_finite(self, epoch: int, total_loss: float) -> None:
        """Stop when an epoch left a non-finite weight (a diverged run; with a GradScaler a
        single non-finite step is skipped and is not divergence)."""
        bad = [f"{name}.{p}" for name, m in self.modules.items()
               for p, t in m.named_parameters() if not bool(torch.isfinite(t).all())]  # fmt: skip
        if bad:
            raise TrainingDivergedError(
                f"training diverged in epoch {epoch + 1}: non-finite weights in "
                f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} (summed loss "
                f"{total_loss:.4g}); lower the learning rate or check the data. Nothing of "
                "this epoch is saved; the last saved epoch is kept."
            )

    def epochs(
        self,
        dataset: Dataset,
        step: StepFn,
        *,
        until_epoch: int | None = None,
        drop_last: bool = False,
        on_epoch: Callable[[int], dict[str, float]] | None = None,
    ) -> None:
        """Train epochs ``start_epoch .. min(until_epoch, recipe.epochs) - 1``."""
        r = self.recipe
        stop = r.epochs if until_epoch is None else min(until_epoch, r.epochs)
        n = len(dataset)  # type: ignore[arg-type]
        drop_last = drop_last and n > r.batch_size
        steps = n // r.batch_size if drop_last else -(-n // r.batch_size)
        bar = None
        if self.progress and stop > self.start_epoch:
            from tqdm.auto import tqdm

            bar = tqdm(total=(stop - self.start_epoch) * steps, desc=self.phase, unit="batch")
        for epoch in range(self.start_epoch, stop):
            torch.manual_seed(_mix(self.seed, epoch, 1))  # augmentation in the data set
            order = torch.Generator().manual_seed(_mix(self.seed, epoch, 2))
            gen = torch.Generator().manual_seed(_mix(self.seed, epoch, 3))
            dl = DataLoader(
                dataset,
                batch_size=r.batch_size,
                shuffle=True,
                generator=order,
                num_workers=r.num_workers,
                drop_last=drop_last,
                pin_memory=self.device.type == "cuda",
            )
            for m in self.modules.values():
                m.train()
            start = time.perf_counter()
            total_loss, correct, count = 0.0, 0, 0
            for i, batch in enumerate(dl):
                lr = r.lr_at(epoch, i, len(dl))
                for group in self.opt.param_groups:
                    group["lr"] = lr
                loss, n_correct, n_batch = step(batch, gen)
                self.opt.zero_grad(set_to_none=True)
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.opt)
                    self.scaler.update()
                else:
                    loss.backward()
                    self.opt.step()
                total_loss += float(loss.detach()) * n_batch
                correct += n_correct
                count += n_batch
                if bar is not None:
                    bar.update(1)
            self._check_finite(epoch, total_loss)
            record = {
                "epoch": epoch + 1,
                "loss": total_loss / max(count, 1),
                "train_accuracy": 100.0 * correct / max(count, 1),
                "seconds": time.perf_counter() - start,
                "lr": r.lr_at(epoch, 0, len(dl)),
            }
            if on_epoch is not None:
                record.update(on_epoch(epoch))
            if epoch + 1 == r.epochs:
                record["final"] = True
            self.history.append(record)
            if self.state.path is not None:
                self.state.save(self.modules, self.opt, self._meta())
            if bar is not None:
                bar.set_postfix(
                    epoch=epoch + 1,
                    loss=f"{record['loss']:.3f}",
                    acc=f"{record['train_accuracy']:.1f}",
                )
        if bar is not None:
            bar.close()
        for m in self.modules.values():
            m.eval()

    @property
    def done(self) -> bool:
        return len(self.history) >= self.recipe.epochs


def _supervised_step(run: _Run, model: nn.Module) -> StepFn:
    r = run.recipe

    def step(batch: tuple, gen: torch.Generator) -> tuple[Tensor, int, int]:
        x, y = run.to_device(batch[0]), torch.as_tensor(batch[1]).to(run.device)
        if r.method == "adversarial" and r.adv_fraction > 0:
            k = round(len(x) * r.adv_fraction)
            idx = torch.randperm(len(x), generator=gen)[:k].to(run.device)
            model.eval()  # attack without moving BatchNorm statistics
            with run.autocast():
                adv = pgd(
                    model,
                    x[idx],
                    y[idx],
                    eps=r.adv_eps,
                    step=r.adv_step,
                    steps=r.adv_steps,
                    generator=gen,
                )
            model.train()
            x = x.clone()
            x[idx] = adv.to(x.dtype)
        with run.autocast():
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.float(), y)
        return loss, int((logits.argmax(1) == y).sum()), len(y)

    return step


def _image_size(dataset: Dataset) -> int:
    return int(dataset[0][0].shape[-1])


def train_model(
    model: nn.Module,
    data: DataLike,
    *,
    recipe: Recipe | None = None,
    test_data: DataLike | Mapping[str, DataLike] | None = None,
    robust: str | None = None,
    robust_samples: int | None = 1000,
    out: str | os.PathLike | None = None,
    resume: bool = True,
    seed: int = 0,
    until_epoch: int | None = None,
    eval_every_epoch: bool = False,
    progress: bool = False,
    description: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train ``model`` in place with ``recipe`` (default: :func:`fast_recipe`).

    ``recipe.method`` picks standard training (pass marked data for a shortcut network),
    adversarial training (PGD on a random half of each batch) or SimCLR (then a linear
    classifier on frozen features; the model keeps its class and stitch points). With
    ``recipe.augment`` the data set's images get flip + random crop (before any marker).

    ``test_data`` (one data set or ``{name: data set}``) is evaluated at the end (and after
    every epoch with ``eval_every_epoch``); ``robust="pgd"`` or ``"autoattack"`` adds
    robust accuracy on ``robust_samples`` test images. With ``out``, the state after every
    epoch goes to ``out/checkpoint.safetensors`` (``resume`` continues from it) and the
    final model with its description (recipe, seed, data, accuracies, history) to
    ``out/model.safetensors``. ``until_epoch`` stops early (the schedule still follows
    ``recipe.epochs``), to continue later. The global random state is left as it was.
    """
    recipe = recipe or fast_recipe()
    dataset, _ = as_dataset(data, "training data")
    device = _module_device(model)
    out_path = Path(out) if out is not None else None
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        if recipe.method == "simclr":
            from .simclr import simclr_phases

            run, extra = simclr_phases(
                model,
                dataset,
                recipe,
                seed=seed,
                out=out_path,
                resume=resume,
                progress=progress,
                until_epoch=until_epoch,
                device=device,
                run_cls=_Run,
            )
        else:
            if recipe.augment:
                dataset = _with_transform(dataset, train_augmentation(_image_size(dataset)))
            run = _Run(
                {"model": model},
                recipe,
                seed=seed,
                out=out_path,
                resume=resume,
                progress=progress,
                phase="train",
                device=device,
            )
            on_epoch = None
            if eval_every_epoch and test_data is not None:
                first = (
                    next(iter(test_data.values())) if isinstance(test_data, Mapping) else test_data
                )

                def on_epoch(epoch: int) -> dict[str, float]:
                    return {"test_accuracy": accuracy_on(model, first)}

            step = _supervised_step(run, model)
            run.epochs(dataset, step, until_epoch=until_epoch, on_epoch=on_epoch)
            extra = {}
    model.eval()
    result = TrainResult(model, run.history, resumed_from=run.start_epoch)
    if not run.done:
        return result
    if test_data is not None:
        result.evaluation = evaluate_classifier(
            model, test_data, robust=robust, robust_samples=robust_samples, seed=seed
        )
    if out_path is not None:
        from ..models import save

        desc = dict(description or {})
        desc.update(
            method=recipe.method,
            recipe=recipe.to_dict(),
            seed=seed,
            epochs=recipe.epochs,
            evaluation=result.evaluation,
            history=run.history,
            train_size=len(dataset),  # type: ignore[arg-type]
            **extra,
        )
        result.path = save(model, out_path / MODEL_FILE, **desc)
    return result
