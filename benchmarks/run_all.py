"""Run every benchmark; write one markdown report (ratios against same-run baselines,
cost and peak memory of each stage as the data grows and as the stitch point moves deeper).

Each measurement runs in its own subprocess, so that its peak memory (max RSS) is its own;
"setup MB" is the RSS after importing torch, building the models and making the data, so
the difference is what the stage itself needs.

Stages:
  stitch  stitch training against hook-based stitching (stitch_training.py), points 1, 5, 9
  dm      DM in closed form against 30 epochs of Adam
  iris    IRI generation against the released loop (iris.py)
  epoch   one base-model training epoch: stitchlab's train_model against a plain PyTorch loop
  demo    the quick demo end to end, then its rerun from the finished store
  scale   per stage: seconds and peak memory at 1k, 5k, 20k images (point 5) and at points
          1, 5, 9 (5k images)

    python benchmarks/run_all.py                      # ~10 min on 2 cores
    python benchmarks/run_all.py --write docs/benchmarks.md   # replace the generated section
    python benchmarks/run_all.py --quick              # tiny sizes, a smoke test (~1 min)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


# ---------------------------------------------------------------------------
# Child side: one measurement, printed as one JSON line


def _child(stage: str, opts: dict) -> dict:
    import torch

    torch.set_num_threads(opts["threads"])
    sys.path.insert(0, str(HERE))
    if stage == "stitch":
        from stitch_training import measure_stitch

        return {"rows": measure_stitch(opts["width"], opts["n"])}
    if stage == "dm":
        from stitch_training import measure_dm

        return {"rows": measure_dm(opts["width"], opts["n"])}
    if stage == "iris":
        from iris import measure_iris

        return {"rows": measure_iris(opts["width"], 128, opts["iri_steps"])}
    if stage == "epoch":
        return {"rows": _epoch_rows(opts["width"], opts["n"])}
    if stage == "demo":
        return {"rows": _demo_rows(opts["quick"])}
    if stage.startswith("scale:"):
        return _scale_one(stage.split(":")[1], opts)
    raise ValueError(f"unknown stage {stage!r}")


def _epoch_rows(width: int, n: int) -> list[dict]:
    """One epoch, batch 128, no augmentation, same data: train_model vs a plain loop."""
    import torch
    import torch.nn.functional as F

    from stitchlab import models
    from stitchlab.data import shapes
    from stitchlab.train import fast_recipe, train_model

    x, y = shapes(n, seed=0)
    torch.manual_seed(0)
    model = models.create("resnet18", width=width)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    model.train()
    for idx in torch.randperm(n, generator=gen).split(128):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    base_s = time.perf_counter() - t0
    torch.manual_seed(0)
    model = models.create("resnet18", width=width)
    t0 = time.perf_counter()
    train_model(model, (x, y), recipe=fast_recipe(epochs=1, augment=False), seed=0)
    ours_s = time.perf_counter() - t0
    return [{
        "images": n, "plain PyTorch loop s": round(base_s, 2),
        "stitchlab train_model s": round(ours_s, 2), "images/s": round(n / ours_s),
        "speed-up": f"{base_s / ours_s:.2f}x",
    }]  # fmt: skip


def _demo_rows(quick: bool) -> list[dict]:
    """The quick demo end to end, and a rerun that finds every job in the store."""
    from stitchlab.experiments import builtin_config, run_experiment

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_experiment(builtin_config("demo_quick"), tmp, progress=False)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_experiment(builtin_config("demo_quick"), tmp, progress=False)
        rerun = time.perf_counter() - t0
        rows = sum(1 for _ in open(Path(tmp) / "results.csv")) - 1
    return [{
        "run": "demo --quick (train, IRIs, stitch, score)", "result rows": rows,
        "first run s": round(first, 1), "rerun from the store s": round(rerun, 1),
        "ratio": f"{first / rerun:.0f}x",
    }]  # fmt: skip


def _scale_one(what: str, opts: dict) -> dict:
    """One (stage, size, point) measurement: seconds and memory."""
    import torch

    import stitchlab as sl
    from stitchlab import models
    from stitchlab.data import shapes

    n, k, width = opts["n"], opts["k"], opts["width"]
    torch.manual_seed(0)
    back = models.create("resnet18", width=width).eval()
    torch.manual_seed(1)
    front = models.create("resnet18", width=width).eval()
    x, y = shapes(n, seed=0)
    point = sl.stitch_points(back)[k - 1]
    setup_mb = _rss_mb()
    t0 = time.perf_counter()
    if what == "stitch":  # cache build + 1 epoch of SLM
        s = sl.stitch(front, back, point, (x, y), objective="slm", epochs=1, cache=True)
        extra = {"cache s": round(s.timings["cache"], 2), "epoch s": round(s.timings["train"], 2)}
    elif what == "dm":
        sl.stitch(front, back, point, (x, y), objective="dm", solver="closed_form")
        extra = {}
    elif what == "iris":  # a resumable set on disk, chunks of 1024, few steps
        from stitchlab.iris import generate_iris_set

        with tempfile.TemporaryDirectory() as tmp:
            generate_iris_set(front, point, (x, y), tmp, steps=opts["iri_steps"],
                              step_size=8 / 255, threshold=10.0, preset="paper",
                              min_null_ratio=0.0)  # fmt: skip
        extra = {"steps": opts["iri_steps"]}
    elif what == "train":
        from stitchlab.train import fast_recipe, train_model

        train_model(front.train(), (x, y), recipe=fast_recipe(epochs=1, augment=True))
        extra = {}
    else:
        raise ValueError(what)
    sec = time.perf_counter() - t0
    return {
        "stage": what, "images": n, "point": f"{k} ({point})", "seconds": round(sec, 2),
        "s per 1k images": round(1000 * sec / n, 2), "setup MB": round(setup_mb),
        "peak MB": round(_rss_mb()), **extra,
    }  # fmt: skip


# ---------------------------------------------------------------------------
# Parent side


def _run_child(stage: str, opts: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__)), "--child", stage, "--opts", json.dumps(opts)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark stage {stage} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall"] = time.perf_counter() - t0
    return result


def _commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=HERE).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=HERE).stdout.strip()  # fmt: skip
        return rev + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def run_all(quick: bool, threads: int, log=print) -> str:
    """Run every stage; returns the markdown report."""
    import torch

    from stitchlab.report import markdown_table

    sizes = (256, 512, 1024) if quick else (1000, 5000, 20000)
    base = {"threads": threads, "width": 16, "quick": quick,
            "iri_steps": 2 if quick else 20, "n": 256 if quick else 2560}  # fmt: skip
    start = time.perf_counter()
    parts = [
        f"Generated by `python benchmarks/run_all.py{' --quick' if quick else ''}` on "
        f"{datetime.date.today()}, commit {_commit()}: {os.cpu_count()} CPU cores, "
        f"{threads} torch threads, torch {torch.__version__}, Python "
        f"{platform.python_version()}. ResNet-18 (32x32 stem) at width 16, random weights, "
        "generated 32x32 images. Every ratio compares against a baseline measured in the "
        "same run on the same data."
    ]
    sections = [
        ("stitch", "Stitch training against hook-based stitching (SLM, batch 128)"),
        ("dm", "DM in closed form against 30 epochs of Adam (point 5)"),
        ("iris", "IRI generation against the released loop (batch 128, images x steps / s)"),
        ("epoch", "Base-model training epoch: train_model against a plain PyTorch loop"),
        ("demo", "End to end: the quick demo, and its rerun from the job store"),
    ]
    for stage, title in sections:
        log(f"[benchmarks] {stage} ...", flush=True)
        opts = {**base, "n": base["n"] if stage != "epoch" else (512 if quick else 5000)}
        r = _run_child(stage, opts)
        cost = f"(stage wall time {r['wall']:.0f} s, peak memory {r['peak_mb']:.0f} MB)"
        parts.append(f"### {title}\n\n{markdown_table(r['rows'])}\n\n{cost}")
    scale_rows, depth_rows = [], []
    scale_iri = 2 if quick else 5
    for what in ("stitch", "dm", "iris", "train"):
        for n in sizes:
            log(f"[benchmarks] scale {what} n={n} ...", flush=True)
            scale_rows.append(
                _run_child(f"scale:{what}", {**base, "n": n, "k": 5, "iri_steps": scale_iri})
            )
    for what in ("stitch", "dm", "iris"):
        for k in (1, 5, 9):
            log(f"[benchmarks] depth {what} point {k} ...", flush=True)
            depth_rows.append(
                _run_child(
                    f"scale:{what}", {**base, "n": sizes[1], "k": k, "iri_steps": scale_iri}
                )  # fmt: skip
            )
    strip = ("wall", "peak_mb")
    parts.append(
        "### Cost and peak memory as the data grows (point 5)\n\n"
        "stitch = cache build + 1 epoch of SLM; dm = closed form; iris = a resumable IRI set "
        f"on disk ({scale_iri} signed steps, chunks of 1,024); train = one epoch of the fast "
        "recipe with augmentation. Peak MB is the whole process (Python, torch, data, "
        "models); setup MB is the same process before the stage.\n\n"
        + markdown_table([{k: v for k, v in r.items() if k not in strip} for r in scale_rows])
    )
    parts.append(
        f"### Cost and peak memory as the stitch point moves deeper ({sizes[1]} images)\n\n"
        + markdown_table([{k: v for k, v in r.items() if k not in strip} for r in depth_rows])
    )
    parts.append(f"Total benchmark wall time: {time.perf_counter() - start:.0f} s.")
    return "\n\n".join(parts) + "\n"


def _write(path: Path, report: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{report}{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = (
            text.rstrip("\n")
            + "\n\n## All benchmarks: `python benchmarks/run_all.py`\n\n"
            + block
            + "\n"
        )
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--write", default=None, help="markdown file whose generated section to replace"
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--opts", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        result = _child(args.child, json.loads(args.opts))
        result["peak_mb"] = _rss_mb()
        print(json.dumps(result))
        return
    report = run_all(args.quick, args.threads)
    print(report)
    if args.write:
        _write(Path(args.write), report)
        print(f"written to {args.write}")


if __name__ == "__main__":
    main()
