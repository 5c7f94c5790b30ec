"""Time per epoch and accuracy of each CPU-sized base-model family on real CIFAR-10.

Materialises CIFAR-10 from ``../shared/data`` (or ``--shared``) into a temporary folder
(never into the repository), then trains each family on a seeded training subset for a
few epochs with the fast CPU recipe and prints per-epoch seconds, training accuracy and
test accuracy (full 10,000-image test set), plus marked / rolled-marker accuracy for the
shortcut network and PGD-20 robust accuracy for the adversarial one.

    python validation/train_families.py                      # all families, ~15-20 min
    python validation/train_families.py --families resnet18 --train-size 5000 --epochs 2

Not part of the test suite: it needs the real data and minutes of CPU time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from stitchlab import data, models
from stitchlab.train import fast_recipe, train_model

FAMILIES = {
    # name: (architecture, options, recipe changes, kind)
    "resnet18": ("resnet18", {"width": 16}, {}, "standard"),
    "vgg16_bn": ("vgg16_bn", {"width": 16}, {}, "standard"),
    "vit_tiny": ("vit_tiny_patch4_32", {"width": 96, "depth": 12, "heads": 3}, {}, "standard"),
    "vit_narrow": (
        "vit_tiny_patch4_32",
        {"width": 48, "depth": 12, "heads": 3},
        {"lr": 1e-3},
        "standard",
    ),
    "shortcut": ("resnet18", {"width": 16}, {}, "shortcut"),
    "adversarial": ("resnet18", {"width": 16}, {"method": "adversarial"}, "adversarial"),
    "simclr": ("resnet18", {"width": 16}, {"method": "simclr", "linear_epochs": 30}, "simclr"),
}


def _cifar_root(shared: Path, dest: Path) -> Path:
    if not (dest / "cifar-10-batches-py" / "test_batch").is_file():
        script = shared / "materialize.py"
        if not script.is_file():
            sys.exit(f"no {script}: pass --shared pointing at the shared data folder")
        print(f"materialising CIFAR-10 into {dest} ...", flush=True)
        subprocess.run([sys.executable, str(script), str(dest)], check=True)
    return dest


def main() -> None:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=here.parent.parent / "shared" / "data")
    p.add_argument("--dest", type=Path, default=Path(tempfile.gettempdir()) / "stitchlab-data")
    p.add_argument("--families", default="resnet18,vgg16_bn,vit_tiny,shortcut,adversarial,simclr")
    p.add_argument("--train-size", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--adv-epochs", type=int, default=1, help="epochs of adversarial training")
    p.add_argument("--robust-samples", type=int, default=500)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root = _cifar_root(args.shared, args.dest)
    full_train, test = data.cifar10(root, True), data.cifar10(root, False)
    train = data.subset(full_train, args.train_size, seed=0)
    print(f"CIFAR-10: {len(train)} of {len(full_train)} training images, {len(test)} test")
    results = {}
    for name in args.families.split(","):
        arch, options, changes, kind = FAMILIES[name]
        epochs = args.adv_epochs if kind == "adversarial" else args.epochs
        recipe = fast_recipe(epochs=epochs, **changes)
        torch.manual_seed(0)
        model = models.create(arch, **options)
        train_set, test_sets = train, {"clean": test}
        if kind == "shortcut":
            train_set = data.Marked(train, "pixel+loc", num_classes=10, seed=0)
            test_sets["marked"] = data.Marked(test, "pixel+loc", num_classes=10, seed=0)
            test_sets["rolled"] = data.Marked(
                test, "pixel+loc", num_classes=10, seed=0, rolled=True
            )
        print(f"\n== {name}: {arch} {options}, {kind}, {epochs} epochs", flush=True)
        start = time.time()
        result = train_model(
            model,
            train_set,
            recipe=recipe,
            test_data=test_sets,
            robust="pgd" if kind == "adversarial" else None,
            robust_samples=args.robust_samples,
            eval_every_epoch=kind != "simclr",
            progress=False,
        )
        for h in result.history:
            test_acc = f", test {h['test_accuracy']:.1f}%" if "test_accuracy" in h else ""
            print(
                f"epoch {h['epoch']}: {h['seconds']:.0f} s "
                f"({h['seconds'] * len(full_train) / len(train):.0f} s per 50k-image epoch), "
                f"train {h['train_accuracy']:.1f}%{test_acc}",
                flush=True,
            )
        print(f"final: {json.dumps(result.evaluation)} ({time.time() - start:.0f} s in all)")
        results[name] = {
            "architecture": arch,
            "options": options,
            "kind": kind,
            "train_size": len(train),
            "epochs": epochs,
            "seconds_per_epoch": [round(h["seconds"], 1) for h in result.history],
            "history": result.history,
            "evaluation": result.evaluation,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))
    print("\nfamily       s/epoch  (x50k)  test acc  other")
    for name, r in results.items():
        s = sum(r["seconds_per_epoch"]) / len(r["seconds_per_epoch"])
        ev = r["evaluation"]
        other = {
            k: round(v, 1) for k, v in ev.items() if k != "clean_accuracy" and isinstance(v, float)
        }
        print(
            f"{name:<12} {s:7.0f} {s * 50000 / r['train_size']:7.0f} "
            f"{ev['clean_accuracy']:8.1f}  {other}"
        )


if __name__ == "__main__":
    main()
