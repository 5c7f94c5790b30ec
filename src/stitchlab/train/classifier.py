"""Training base classifiers (the small recipe used by the examples and tests)."""

from __future__ import annotations

import torch
from torch import nn

from .._data import DataLike, _module_device, as_dataset

__all__ = ["train_classifier"]


def train_classifier(
    model: nn.Module,
    data: DataLike,
    *,
    epochs: int = 6,
    batch_size: int = 128,
    lr: float = 3e-3,
    weight_decay: float = 5e-4,
    seed: int = 0,
    progress: bool = False,
) -> list[float]:
    """Train ``model`` in place with AdamW and a one-cycle schedule; returns epoch losses."""
    dataset, _ = as_dataset(data)
    device = _module_device(model)
    gen = torch.Generator().manual_seed(seed)
    dl = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=lr, total_steps=max(1, epochs * len(dl))
    )
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=epochs * len(dl), desc="train", leave=False)
    history = []
    model.train()
    for _ in range(epochs):
        total, count = 0.0, 0
        for x, y in dl:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(x)
            count += len(x)
            if bar is not None:
                bar.update(1)
        history.append(total / count)
    if bar is not None:
        bar.close()
    model.eval()
    return history
