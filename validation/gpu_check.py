"""The GPU check (issue 6): one prepared script, under 10 minutes on one GPU.

ResNet-18 at full width on CIFAR-10 (two seeds: front and back), a short training run per
model family (VGG-16-BN, ViT-Tiny/4), IRIs for one point on 10,000 images with the paper's
recipe (200 signed steps of 1/255) and with stitchlab's default (270 Adam steps whitened
by the first convolution, bfloat16 but the last 30, the smooth ReLU gradient), and
stitching at that point with all four objectives under both protocols. Records throughput
and scores in docs/validation/gpu.md (and a JSON file beside it), rewritten after every
row, so a run stopped at its time limit keeps what it finished; past --deadline-s the
remaining optional rows are skipped and the page says so.

    python validation/gpu_check.py --data-root DATA                 # on a CUDA machine
    python validation/gpu_check.py --data-root DATA --smoke --device cpu   # tiny, any machine

DATA holds cifar-10-batches-py/ (../shared/data/materialize.py makes it).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

import stitchlab as sl
from stitchlab import data, models
from stitchlab._batchnorm import mode as fold_mode
from stitchlab._memory_format import mode as memory_format_mode
from stitchlab.iris import IRIRecipe
from stitchlab.report import markdown_table
from stitchlab.train import fast_recipe, train_model

ROOT = Path(__file__).resolve().parents[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script")
    ap.add_argument("--point", default="layer2.1")
    ap.add_argument("--out", default=str(ROOT / "docs" / "validation" / "gpu.md"))
    ap.add_argument(
        "--deadline-s", type=float, default=480.0,
        help="skip the rows not yet started once this many seconds have passed",
    )  # fmt: skip
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; use --device cpu --smoke to check the script")
    smoke = args.smoke
    n_train = 512 if smoke else 50000
    n_test = 256 if smoke else 10000
    n_iris = 128 if smoke else 10000
    n_layout = 64 if smoke else 2000  # images for the layout rows (throughput only)
    iri_steps = 3 if smoke else None  # None: each preset's own (paper 200, default 270)
    width = 8 if smoke else 64
    epochs = 1 if smoke else 4
    train = data.subset(data.cifar10(args.data_root, True), n_train, seed=0)
    test = data.subset(data.cifar10(args.data_root, False), n_test, seed=0)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rows: list[dict] = []
    scores: list[dict] = []
    skipped: list[str] = []
    result: dict = {"device": device_name, "torch": torch.__version__, "smoke": smoke}
    t_all = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    out_path = Path(args.out)

    def table(part: list[dict]) -> str:
        return markdown_table(part) if part else "(none finished)"

    def write() -> None:
        """Rewrite the page and its JSON with every row so far."""
        result.update(rows=rows, stitching=scores, skipped=skipped,
                      seconds=round(time.perf_counter() - t_all, 1))  # fmt: skip
        if device.type == "cuda":
            result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        out_path.with_suffix(".json").write_text(json.dumps(result, indent=1))
        lines = [
            "# GPU check",
            "",
            f"`python validation/gpu_check.py --data-root DATA{' --smoke' if smoke else ''}` on "
            f"{device_name}, torch {torch.__version__}, Python {platform.python_version()}, "
            f"commit {commit}; {result['seconds']} s in all. ResNet-18 width {width} on "
            f"CIFAR-10 ({n_train} training, {n_test} test images); stitch point {args.point}.",
            "",
            "Training (one run per model):",
            "",
            table([r for r in rows if "epochs" in r]),
            "",
            "IRIs (median / 90th-percentile relative error at the point after uint8 "
            "quantisation; the null is the distance between two different real images there):",
            "",
            table([r for r in rows if "epochs" not in r]),
            "",
            "Stitching (front: seed 1, back: seed 0; agreement with the back on test images):",
            "",
            table(scores),
            "",
        ]
        if skipped:
            lines += [f"Skipped (past the {args.deadline_s:g} s deadline): "
                      + "; ".join(skipped) + ".", ""]  # fmt: skip
        out_path.write_text("\n".join(lines))

    def late(what: str) -> bool:
        """True (and noted) when the deadline has passed, so ``what`` is skipped."""
        if time.perf_counter() - t_all > args.deadline_s:
            skipped.append(what)
            write()
            return True
        return False

    # 1. base models: two full-width ResNet-18 seeds, one short run per other family
    trained = {}
    families = [
        ("resnet18 seed 0 (back)", "resnet18", {"width": width}, 0, epochs),
        ("resnet18 seed 1 (front)", "resnet18", {"width": width}, 1, epochs),
        ("vgg16_bn", "vgg16_bn", {"width": width}, 0, 1),
        ("vit_tiny_patch4_32", "vit_tiny_patch4_32", {"width": 48 if smoke else 192}, 0, 1),
    ]
    for label, arch, opts, seed, ep in families:
        torch.manual_seed(seed)
        model = models.create(arch, **opts).to(device)
        _sync(device)
        t0 = time.perf_counter()
        res = train_model(model, train, recipe=fast_recipe(epochs=ep), test_data=test, seed=seed)
        _sync(device)
        sec = time.perf_counter() - t0
        acc = res.evaluation.get("accuracy")
        rows.append({"stage": f"train {label}", "epochs": ep, "seconds": round(sec, 1),
                     "images/s": round(ep * n_train / sec), "test accuracy": acc})  # fmt: skip
        trained[label] = model.eval()
        print(rows[-1], flush=True)
        write()
    back, front = trained["resnet18 seed 0 (back)"], trained["resnet18 seed 1 (front)"]

    # 2. IRIs for one point on n_iris images: the paper's recipe, then stitchlab's default
    #    (used for stitching below)
    stitch_data = data.subset(train, n_iris, seed=1)
    x = torch.stack([stitch_data[i][0] for i in range(len(stitch_data))])
    #    and, on a GPU, the default with the front channels-last (STITCHLAB_CHANNELS_LAST=1;
    #    "auto" keeps CUDA in NCHW until this row says which is faster there) and with its
    #    BatchNorms left unfolded (STITCHLAB_FOLD_BN=0: what folding is worth there)
    #    (on n_layout images: these rows are for throughput)
    runs = [("paper", "auto", "auto", n_iris), ("default", "auto", "auto", n_iris)]
    if device.type == "cuda":
        runs += [("default", "1", "auto", n_layout), ("default", "auto", "0", n_layout)]
    iris = None
    for preset, memory_format, fold, n in runs:
        layout = ", channels-last" if memory_format == "1" else ""
        layout += ", BatchNorm not folded" if fold == "0" else ""
        stage = f"IRIs at {args.point} ({preset} recipe{layout})"
        if iris is not None and late(stage):
            continue
        with memory_format_mode(memory_format), fold_mode(fold):
            _sync(device)
            t0 = time.perf_counter()
            out = sl.generate_iris(front, args.point, x[:n], steps=iri_steps, preset=preset,
                                   batch_size=1000 if not smoke else 64, device=device)  # fmt: skip
            _sync(device)
            sec = time.perf_counter() - t0
        if preset == "default" and memory_format == "auto" and fold == "auto":
            iris = out
        q = out.quality()
        steps = iri_steps or IRIRecipe.from_kwargs(preset=preset).steps
        rows.append({"stage": stage, "images": n, "steps": steps, "seconds": round(sec, 1),
                     "images x steps/s": round(n * steps / sec),
                     "median error": round(q.median_error, 4),
                     "p90 error": round(q.p90_error, 4),
                     "times closer than null": round(q.null_ratio or 0, 1)})  # fmt: skip
        print(rows[-1], flush=True)
        write()

    # 3. stitching at that point: all objectives, both protocols (SLM first: the main score)
    for protocol in ("standard", "iris"):
        for objective in ("slm", "fula", "dm", "hlm"):
            if late(f"{protocol} {objective}"):
                continue
            _sync(device)
            t0 = time.perf_counter()
            s = sl.stitch(
                front, back, args.point, stitch_data, objective=objective,
                protocol=(sl.InvarianceAware(iris=iris, allow_flagged=True)
                          if protocol == "iris" else sl.Standard()),
                epochs=2 if smoke else 10, lr=1e-3, device=device,
            )  # fmt: skip
            ev = sl.evaluate(s, test, reference=back)
            _sync(device)
            sec = time.perf_counter() - t0
            scores.append({
                "protocol": protocol, "objective": objective,
                "agreement": round(ev["agreement"], 1), "accuracy": round(ev["accuracy"], 1),
                "seconds": round(sec, 1),
            })  # fmt: skip
            print(scores[-1], flush=True)
            write()
    write()
    print(f"written to {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
