"""SimCLR (Chen et al. 2020): contrastive pre-training, then a linear classifier on frozen
features. The result is the same classifier module (backbone + Linear head), so it splits
and stitches at the same points as a supervised one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..data.markers import _mix
from ..data.transforms import simclr_views
from ..models import classifier_head
from .recipes import Recipe

__all__ = ["info_nce", "projector", "linear_probe", "simclr_phases"]


def info_nce(z1: Tensor, z2: Tensor, temperature: float = 0.5) -> Tensor:
    """NT-Xent / InfoNCE loss of two batches of projections (row i of each: one image)."""
    if z1.shape != z2.shape:
        raise ValueError(f"the two views must match, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    n = len(z1)
    z = nn.functional.normalize(torch.cat([z1, z2]).float(), dim=1)
    sim = z @ z.T / temperature
    eye = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    sim = sim.masked_fill(eye, float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return nn.functional.cross_entropy(sim, targets)


def projector(dim: int, hidden: int = 1024, out: int = 128) -> nn.Module:
    """SimCLR's projection head: Linear(dim, hidden) - ReLU - Linear(hidden, out)."""
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out))


@torch.no_grad()
def _features(model: nn.Module, dataset: Dataset, device, batch_size: int = 256):
    from .._data import batches

    model.eval()
    feats, labels = [], []
    for x, y in batches(dataset, batch_size, device):
        feats.append(model(x).float())
        labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def linear_probe(
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    *,
    epochs: int = 100,
    lr: float = 1e-2,
    batch_size: int = 256,
    seed: int = 0,
) -> nn.Linear:
    """A Linear classifier trained with AdamW (cosine schedule) on fixed features.

    It is trained on standardised features and the standardisation is folded into its
    weights, so it applies to the raw features.
    """
    g = torch.Generator().manual_seed(seed)
    mean, std = features.mean(0), features.std(0).clamp_min(1e-6)
    z = (features - mean) / std
    linear = nn.Linear(features.shape[1], num_classes).to(features.device)
    with torch.no_grad():
        bound = 1 / features.shape[1] ** 0.5
        linear.weight.copy_(torch.rand(linear.weight.shape, generator=g) * 2 * bound - bound)
        linear.bias.zero_()
    opt = torch.optim.AdamW(linear.parameters(), lr=lr, weight_decay=1e-4)
    steps = max(1, epochs * -(-len(z) // batch_size))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    with torch.enable_grad():
        for _ in range(epochs):
            perm = torch.randperm(len(z), generator=g).to(z.device)
            for i in range(0, len(z), batch_size):
                idx = perm[i : i + batch_size]
                loss = nn.functional.cross_entropy(linear(z[idx]), labels[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
    with torch.no_grad():  # fold the standardisation: W (f - m) / s + b
        linear.weight.div_(std)
        linear.bias.sub_(linear.weight @ mean)
    return linear.eval()


def simclr_phases(
    model: nn.Module,
    dataset: Dataset,
    recipe: Recipe,
    *,
    seed: int,
    out: Path | None,
    resume: bool,
    progress: bool,
    until_epoch: int | None,
    device: torch.device,
    run_cls: type,
) -> tuple[Any, dict[str, Any]]:
    """Contrastive epochs (resumable), then the linear head; returns ``(run, extras)``.

    ``run_cls`` is the training loop's run class (passed in, so that this module does not
    import the loop that imports it)."""
    _Run = run_cls  # noqa: N806

    head_name, head = classifier_head(model)
    dim, num_classes = head.in_features, head.out_features
    setattr(model, head_name, nn.Identity())
    torch.manual_seed(_mix(seed, 0x51C))
    proj = projector(dim, recipe.projection_hidden, recipe.projection_dim).to(device)
    run = _Run(
        {"model": model, "projector": proj},
        recipe,
        seed=seed,
        out=out,
        resume=resume,
        progress=progress,
        phase="simclr",
        device=device,
    )

    def step(batch: tuple, gen: torch.Generator) -> tuple[Tensor, int, int]:
        x = batch[0].to(device)
        v1, v2 = run.to_device(simclr_views(x, gen)), run.to_device(simclr_views(x, gen))
        with run.autocast():
            z = proj(model(torch.cat([v1, v2])))
        z1, z2 = z.float().chunk(2)
        loss = info_nce(z1, z2, recipe.temperature)
        with torch.no_grad():
            zn = nn.functional.normalize(z1, dim=1) @ nn.functional.normalize(z2, dim=1).T
            correct = int((zn.argmax(1) == torch.arange(len(z1), device=z1.device)).sum())
        return loss, correct, len(z1)

    run.epochs(dataset, step, until_epoch=until_epoch, drop_last=True)
    if not run.done:
        setattr(model, head_name, head)  # an unfinished run keeps an intact (untrained) head
        return run, {}
    feats, labels = _features(model, dataset, device)
    linear = linear_probe(
        feats,
        labels,
        num_classes,
        epochs=recipe.linear_epochs,
        lr=recipe.linear_lr,
        seed=_mix(seed, 0x11E),
    )
    with torch.no_grad():
        probe_acc = float((linear(feats).argmax(1) == labels).double().mean() * 100)
    setattr(model, head_name, linear.to(device))
    model.eval()
    return run, {"linear_probe_train_accuracy": probe_acc}
