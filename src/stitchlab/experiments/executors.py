"""Executors: run a list of jobs in this process or as Ray tasks, with a progress bar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LocalExecutor", "RayExecutor"]


def _bar(total: int, desc: str, progress: bool):
    if not progress or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


class LocalExecutor:
    """Runs jobs one after the other in this process."""

    name = "local"

    def __init__(self, progress: bool = True) -> None:
        self.progress = progress

    def map(self, fn: Callable[[dict], Any], jobs: Sequence[dict], desc: str = "") -> list:
        """Results of ``fn`` on every job, in order."""
        out = []
        bar = _bar(len(jobs), desc, self.progress)
        for job in jobs:
            out.append(fn(job))
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return out


class RayExecutor:
    """Runs jobs as Ray tasks (a local cluster, or the one at ``address``)."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        cpus_per_job: int = 1,
        gpus_per_job: float = 0,
        progress: bool = True,
    ) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError(
                "Ray is not installed: pip install 'stitchlab[ray]' (or ray) to use --ray."
            ) from exc
        self.ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address} if address else {}
            ray.init(ignore_reinit_error=True, log_to_driver=False, **kwargs)
        self.cpus, self.gpus = cpus_per_job, gpus_per_job
        self.progress = progress

    def map(self, fn: Callable[[dict], Any], jobs: Sequence[dict], desc: str = "") -> list:
        """Results of ``fn`` on every job, each a Ray task, in order."""
        remote = self.ray.remote(num_cpus=self.cpus, num_gpus=self.gpus)(fn)
        refs = [remote.remote(job) for job in jobs]
        bar = _bar(len(refs), desc, self.progress)
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            if bar is not None:
                bar.update(len(done))
        if bar is not None:
            bar.close()
        return self.ray.get(refs)
