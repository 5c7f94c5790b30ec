"""Executors: run a list of jobs in this process or as Ray tasks, with a progress bar.

On Ray a job asks for what it uses: ``cpus_per_job`` CPUs (the run's threads) and, when
the run's device is CUDA, ``gpus_per_job`` GPUs (1 by default; a fraction lets several
jobs share one GPU). A job then runs on the GPU Ray assigned it (:func:`assigned_device`),
and a CPU job never claims one. A request no node of the cluster can meet is an error
before anything is submitted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from ..vocabulary import DEVICE_KINDS

__all__ = ["LocalExecutor", "RayExecutor", "assigned_device", "gpus_for"]

_ASSIGNED: list[str] = []  # the device of the job running in this process (a Ray task)


def assigned_device(configured: str) -> str:
    """The device a job runs on: in a Ray task that was given a GPU, that GPU (``cuda:i``,
    ``i`` its index among the GPUs this process sees); otherwise ``configured``."""
    return _ASSIGNED[-1] if _ASSIGNED else configured


def gpus_for(device: str, gpus_per_job: float | None = None) -> float:
    """GPUs a job on ``device`` asks Ray for: 1 on CUDA unless ``gpus_per_job`` says
    otherwise (a fraction shares a GPU), none elsewhere. Raises ``ValueError`` for a CUDA
    job without a GPU (it would run on whichever GPU it sees, beside every other job) and
    for a CPU or MPS job that claims one."""
    kind = device.split(":")[0]
    if kind not in DEVICE_KINDS:
        raise ValueError(f"device {device!r} is none of {', '.join(DEVICE_KINDS)}")
    if gpus_per_job is None:
        return 1.0 if kind == "cuda" else 0.0
    gpus = float(gpus_per_job)
    if not (gpus >= 0 and gpus == gpus and gpus != float("inf")):
        raise ValueError(f"gpus per job must be a finite number >= 0, got {gpus_per_job!r}")
    if kind == "cuda" and gpus == 0:
        raise ValueError(
            f"device is {device!r} but a job asks Ray for no GPU: Ray would start as many "
            "CUDA jobs as there are CPUs, all on the first GPU they see. Ask for 1 (the "
            "default) or a fraction such as 0.5 to share a GPU."
        )
    if kind != "cuda" and gpus > 0:
        raise ValueError(
            f"device is {device!r}: a job that does not run on CUDA asks Ray for no GPU "
            f"(got gpus per job {gpus_per_job!r}); set the device to cuda or drop the GPUs."
        )
    if gpus > 1 and gpus != int(gpus):
        raise ValueError(f"gpus per job above 1 must be a whole number, got {gpus_per_job!r}")
    return gpus


def _ray_device() -> str:
    """In a Ray task given GPUs: the torch device of the first of them."""
    import ray

    ids = [str(i) for i in ray.get_gpu_ids()]
    if not ids:
        raise RuntimeError("this Ray task asked for a GPU but Ray assigned it none")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:  # Ray narrows it to the assigned GPUs: index among what this process sees
        seen = [v.strip() for v in visible.split(",")]
        if ids[0] in seen:
            return f"cuda:{seen.index(ids[0])}"
    return f"cuda:{int(ids[0])}"  # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: all visible


def _placed(fn: Callable[[Any], Any], job: Any, gpus: float) -> Any:
    """Run ``fn(job)`` in a Ray task, on the GPU Ray assigned it when it asked for one."""
    if gpus <= 0:
        return fn(job)
    _ASSIGNED.append(_ray_device())
    try:
        return fn(job)
    finally:
        _ASSIGNED.pop()


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

    def configure(self, run: dict[str, Any]) -> None:
        """Nothing to set up: jobs run here on the run's device."""

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], desc: str = "") -> list:
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
    """Runs jobs as Ray tasks (a local cluster, or the one at ``address``).

    Each task asks for ``cpus_per_job`` CPUs and ``gpus_per_job`` GPUs. Left as None they
    come from the run (:meth:`configure`: its ``threads``; 1 GPU on a CUDA device, none
    elsewhere; ``[run] gpus_per_job`` when the config sets it). A job that Ray gave a GPU
    runs on it (:func:`assigned_device`)."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        cpus_per_job: int | None = None,
        gpus_per_job: float | None = None,
        progress: bool = True,
        device: str | None = None,
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
        if cpus_per_job is not None and (
            isinstance(cpus_per_job, bool) or not isinstance(cpus_per_job, int) or cpus_per_job < 1
        ):
            raise ValueError(f"cpus per job must be a positive integer, got {cpus_per_job!r}")
        self.cpus, self.gpus, self.device = cpus_per_job, gpus_per_job, device
        if device is not None:
            self.gpus = gpus_for(device, gpus_per_job)
        self.progress = progress
        self._checked: tuple | None = None

    def configure(self, run: dict[str, Any]) -> None:
        """Take what the executor was not told from a run's ``[run]`` table (threads,
        device, gpus_per_job) and check that some node of the cluster can run a job."""
        device = run.get("device", "cpu")
        if self.device is not None and self.device != device:
            raise ValueError(
                f"this RayExecutor runs jobs on {self.device!r} but the run's device is "
                f"{device!r}; make them the same"
            )
        self.device = device
        if self.cpus is None:
            self.cpus = int(run.get("threads", 1))
        wanted = self.gpus if self.gpus is not None else run.get("gpus_per_job")
        self.gpus = gpus_for(device, wanted)
        self.check_resources()

    def _resources(self) -> tuple[int, float]:
        cpus = 1 if self.cpus is None else self.cpus
        gpus = self.gpus if self.gpus is not None else gpus_for(self.device or "cpu")
        return cpus, gpus

    def check_resources(self) -> None:
        """Raise ``ValueError`` (before anything is submitted) when no alive node of the
        cluster has the CPUs and GPUs one job asks for: Ray would wait for it forever."""
        cpus, gpus = self._resources()
        if self._checked == (cpus, gpus):
            return
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive", True)]
        if not any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes):
            have = (
                ", ".join(f"{n.get('CPU', 0):g} CPUs + {n.get('GPU', 0):g} GPUs" for n in nodes)
                or "no alive node"
            )
            raise ValueError(
                f"a job asks Ray for {cpus} CPUs and {gpus:g} GPUs but no node of the cluster "
                f"has that much (nodes: {have}); lower [run] threads "
                "(or gpus_per_job / --gpus-per-job), or add a larger node"
            )
        self._checked = (cpus, gpus)

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], desc: str = "") -> list:
        """Results of ``fn`` on every job, each a Ray task, in order.

        Every task runs to its end even when another fails (each stores its own result),
        then the first failure is raised (its type kept, with a note of how many
        finished): a rerun reuses what finished."""
        if not jobs:
            return []
        self.check_resources()
        cpus, gpus = self._resources()
        remote = self.ray.remote(num_cpus=cpus, num_gpus=gpus)(_placed)
        refs = [remote.remote(fn, job, gpus) for job in jobs]
        bar = _bar(len(refs), desc, self.progress)
        pending, failed = list(refs), []
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    self.ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - collected, raised below
                    failed.append(exc)
            if bar is not None:
                bar.update(len(done))
        if bar is not None:
            bar.close()
        if failed:
            cause = failed[0]
            if isinstance(cause, self.ray.exceptions.RayTaskError):
                cause = cause.as_instanceof_cause()
            cause.add_note(
                f"{len(failed)} of {len(refs)} {desc or 'jobs'} failed on Ray; the "
                f"{len(refs) - len(failed)} finished are stored: rerun the same command to resume"
            )
            raise cause
        return self.ray.get(refs)
