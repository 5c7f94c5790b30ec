"""Ray with GPUs, without a GPU: one local cluster with 2 CPUs and 2 fake GPU resources.

GPU jobs get a GPU id (and run on it), CPU jobs get none; a job no node can hold is an
error before anything is submitted; a failed task keeps the finished jobs in the store and
a rerun resumes from it."""

import copy
import os
import sys

import pytest

ray = pytest.importorskip("ray")

from stitchlab.experiments import ConfigError, RayExecutor, load_config, run_experiment  # noqa: E402
from stitchlab.runs.executors import assigned_device, gpus_for  # noqa: E402
from test_experiments import TINY  # noqa: E402

# this module is not importable in Ray's workers: its functions travel by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _where(job):
    """What a task sees: its job, Ray's GPU ids, CUDA_VISIBLE_DEVICES, the device it uses."""
    return {
        "job": job,
        "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": assigned_device("cuda" if job["cuda"] else "cpu"),
    }


def test_gpu_jobs_get_a_gpu_and_cpu_jobs_none():
    gpu = RayExecutor(device="cuda", cpus_per_job=1, progress=False)
    assert gpu.gpus == 1.0
    out = gpu.map(_where, [{"cuda": True, "i": i} for i in range(3)])
    assert [o["job"]["i"] for o in out] == [0, 1, 2]
    for o in out:
        assert len(o["gpu_ids"]) == 1 and o["gpu_ids"][0] in ("0", "1")
        assert o["visible"] == o["gpu_ids"][0]  # Ray narrowed the task to its GPU
        assert o["device"] == "cuda:0"  # index 0 of what it sees: the assigned GPU
    cpu = RayExecutor(device="cpu", cpus_per_job=1, progress=False)
    assert cpu.gpus == 0.0
    for o in cpu.map(_where, [{"cuda": False, "i": i} for i in range(3)]):
        assert o["gpu_ids"] == [] and o["device"] == "cpu"
    half = RayExecutor(device="cuda", cpus_per_job=1, gpus_per_job=0.5, progress=False)
    for o in half.map(_where, [{"cuda": True, "i": 0}]):
        assert len(o["gpu_ids"]) == 1 and o["device"] == "cuda:0"


def test_the_device_sets_what_a_job_asks_for():
    assert gpus_for("cuda") == 1.0 and gpus_for("cuda:1") == 1.0
    assert gpus_for("cpu") == 0.0 and gpus_for("mps") == 0.0
    assert gpus_for("cuda", 0.25) == 0.25
    with pytest.raises(ValueError, match="asks Ray for no GPU"):
        gpus_for("cuda", 0)
    with pytest.raises(ValueError, match="does not run on CUDA"):
        gpus_for("cpu", 1)
    with pytest.raises(ValueError, match="whole number"):
        gpus_for("cuda", 1.5)
    config = copy.deepcopy(TINY)
    config["run"] = {"threads": 1, "device": "cpu", "gpus_per_job": 1}
    with pytest.raises(ConfigError, match=r"\[run\] device is 'cpu'"):
        load_config(config)
    config["run"] = {"threads": 1, "device": "cuda", "gpus_per_job": 0.5}
    assert load_config(config).run["gpus_per_job"] == 0.5


def test_a_job_larger_than_any_node_is_refused_before_submission(tmp_path):
    marker = tmp_path / "ran"

    def touch(job):
        marker.write_text("ran")

    with pytest.raises(ValueError, match="3 CPUs and 0 GPUs but no node"):
        RayExecutor(cpus_per_job=3, progress=False).map(touch, [1])
    with pytest.raises(ValueError, match="1 CPUs and 4 GPUs but no node"):
        RayExecutor(device="cuda", cpus_per_job=1, gpus_per_job=4, progress=False).map(touch, [1])
    config = copy.deepcopy(TINY)
    config["run"] = {"threads": 3}
    with pytest.raises(ValueError, match="no node of the cluster has that much"):
        run_experiment(config, tmp_path / "big", executor=RayExecutor(progress=False),
                       progress=False)  # fmt: skip
    assert not marker.exists() and not (tmp_path / "big" / "store").exists()


def test_a_failed_task_keeps_finished_jobs_and_a_rerun_resumes(tmp_path):
    from stitchlab.experiments import jobs

    config = copy.deepcopy(TINY)
    config["stitch"]["protocols"] = ["standard"]

    class Killed(RayExecutor):
        """Kills the stitch group of the cross-seed pair at blocks.3."""

        def map(self, fn, items, desc=""):
            if fn is not jobs.stitch_group_job:
                return super().map(fn, items, desc)

            def flaky(group):
                run = group.runs[0]
                if (run.pair, run.point) == ("cross-seed", "blocks.3"):
                    raise RuntimeError("worker lost")
                return jobs.stitch_group_job(group)

            return super().map(flaky, items, desc)

    with pytest.raises(RuntimeError, match="worker lost") as info:
        run_experiment(config, tmp_path, executor=Killed(progress=False), progress=False)
    assert "1 of 4 stitch groups failed on Ray; the 3 finished are stored" in str(
        info.value.__notes__
    )
    assert len(list((tmp_path / "store" / "stitch").glob("*.json"))) == 6  # 3 groups x 2
    resumed = run_experiment(config, tmp_path, executor=RayExecutor(progress=False),
                             progress=False)  # fmt: skip
    assert resumed["models"] == {"run": 0, "total": 2}
    assert resumed["stitch"] == {"run": 2, "total": 8}  # only the failed group's 2 runs


def test_compare_on_ray_gives_the_local_table_and_resumes(tmp_path, capsys):
    """`stitchlab compare --ray`: one job per (front model, cell) on the cluster, the same
    table as in this process; a rerun finds every run stored and computes none."""
    import numpy as np
    import pandas as pd
    import torch

    from stitchlab import models
    from stitchlab.cli import main
    from stitchlab.data import shapes

    x, y = shapes(60, seed=0, size=12, num_classes=4)
    np.savez(tmp_path / "d.npz", x=x.numpy(), y=y.numpy())
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        paths.append(str(models.save(models.create("small_cnn", num_classes=4, width=4),
                                     tmp_path / f"m{seed}.safetensors")))  # fmt: skip
    args = ["compare", *paths, "--data", str(tmp_path / "d.npz"), "--quick", "--points",
            "blocks.1", "blocks.3", "--protocols", "standard", "--seeds", "2", "--n-stitch",
            "40", "--n-test", "12", "--no-progress"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    assert main([*args, "--out", str(tmp_path / "ray"), "--ray"]) == 0
    local, on_ray = (pd.read_csv(tmp_path / d / "results.csv").drop(columns="seconds")
                     for d in ("local", "ray"))  # fmt: skip
    # the same runs, computed apart: Ray's workers train the stitches with one torch thread,
    # this process with two, so float32 sums round otherwise (about 1e-7); these untrained
    # networks agree on nearly every image (score, null and ceiling about 100), and the
    # normalised score divides by ceiling - null, which magnifies that rounding to about
    # 1e-5 of its value (-0.319205 against -0.319201 on an AMD EPYC)
    pd.testing.assert_frame_equal(local, on_ray, check_exact=False, rtol=1e-4)
    stored = sorted((tmp_path / "ray" / "store" / "compare").glob("*.json"))
    assert len(stored) == 10  # 2 cells x (2 seeds + 1 null + 2 ceiling runs)
    mtimes = [p.stat().st_mtime_ns for p in stored]
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "ray"), "--ray"]) == 0
    out = capsys.readouterr().out
    assert "  stitch runs    10 jobs, 10 stored" in out and "nothing to compute" in out
    assert [p.stat().st_mtime_ns for p in stored] == mtimes
    assert main([*args, "--out", str(tmp_path / "x"), "--gpus-per-job", "1"]) == 2
    assert "--gpus-per-job is what each Ray job asks for: add --ray" in capsys.readouterr().err


@pytest.mark.slow  # trains the tiny oracle's 3 networks once: about 40 s of CPU
def test_oracle_on_ray_gives_the_local_table(tmp_path):
    """`stitchlab oracle --ray`: the pair jobs on the cluster (the networks from a local
    run's store), the same oracle.csv as in this process; a rerun computes no pair."""
    import shutil

    import pandas as pd

    from stitchlab.oracle import OracleSettings, run_oracle
    from test_oracle import TINY

    settings = OracleSettings(**TINY)
    run_oracle(settings, tmp_path / "local", progress=False)
    (tmp_path / "ray" / "store").mkdir(parents=True)
    shutil.copytree(tmp_path / "local" / "store" / "models", tmp_path / "ray" / "store" / "models")
    run_oracle(settings, tmp_path / "ray", progress=False, executor=RayExecutor(progress=False))
    local, on_ray = (pd.read_csv(tmp_path / d / "oracle.csv") for d in ("local", "ray"))
    pd.testing.assert_frame_equal(local, on_ray)
    pairs = sorted((tmp_path / "ray" / "store" / "pairs").glob("*.json"))
    assert len(pairs) == 9
    mtimes = [p.stat().st_mtime_ns for p in pairs]
    run_oracle(settings, tmp_path / "ray", progress=False, executor=RayExecutor(progress=False))
    assert [p.stat().st_mtime_ns for p in pairs] == mtimes
