"""The ``stitchlab train`` command: build a model and data, train with a recipe, save.

Wired into :mod:`stitchlab.cli` as ``add_train_arguments`` (the options) and
``run_train_command`` (the action). Bad input raises ``ValueError`` with a message that
says what to do; the CLI prints it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["add_train_arguments", "run_train_command", "DATA_CHOICES", "KINDS"]

DATA_CHOICES = (
    "shapes",
    "cues",
    "cifar10",
    "mnist",
    "coloured-mnist",
    "ls-imagenet10",
    "imagenet100",
    "imagenet-b100",
    "folder",
)
KINDS = ("standard", "shortcut", "adversarial", "simclr")
EXAMPLES = """examples:
  stitchlab train --out runs/shapes                      # generated data, no files
  stitchlab train --kind shortcut --recipe fast --out runs/shortcut
  stitchlab train --model resnet18 --width 16 --data cifar10 --root data --out runs/r18
  stitchlab train --model resnet18 --data cifar10 --root data --kind adversarial --out runs/adv
  stitchlab train --model resnet18 --data cifar10 --root data --kind simclr --out runs/simclr"""


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``stitchlab train`` to ``parser``."""
    parser.epilog = EXAMPLES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    g = parser.add_argument_group("model")
    g.add_argument("--model", default="small_cnn", help="registered model name (small_cnn)")
    g.add_argument("--width", type=int, default=None, help="model width option")
    g.add_argument("--stem", default=None, help="resnet18 stem: cifar or imagenet")
    g.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another model option (repeatable), e.g. --option depth=6",
    )
    d = parser.add_argument_group("data")
    d.add_argument("--data", default="shapes", choices=DATA_CHOICES, help="data set (shapes)")
    d.add_argument("--root", default=None, help="folder of a data set on disk")
    d.add_argument("--variant", default="correlated", help="coloured-mnist variant")
    d.add_argument("--cues", default="shape", help="cues data: cues that carry the label")
    d.add_argument(
        "--nuisance", default=None, help="cues data: random cues (default: all the others)"
    )
    d.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="image side: generated data (32), image folders (resize + centre crop)",
    )
    d.add_argument("--train-size", type=int, default=None, help="number of training images")
    d.add_argument("--test-size", type=int, default=None, help="number of test images")
    d.add_argument("--per-class", type=int, default=None, help="training images per class")
    d.add_argument(
        "--marker",
        default=None,
        choices=("pixel+loc", "pixel", "rand"),
        help="marker of shortcut training (default pixel+loc); with another kind, only "
        "evaluate on marked and rolled-marker test data",
    )
    t = parser.add_argument_group("training")
    t.add_argument("--kind", default="standard", choices=KINDS, help="what to train")
    t.add_argument(
        "--recipe",
        default="paper",
        choices=("paper", "fast"),
        help="paper: SGD, 200 epochs (docs/method.md section 5); fast: AdamW one-cycle, 6 epochs",
    )
    t.add_argument("--epochs", type=int, default=None)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--batch-size", type=int, default=None)
    t.add_argument("--weight-decay", type=float, default=None)
    t.add_argument("--optimizer", choices=("sgd", "adamw"), default=None)
    t.add_argument("--schedule", choices=("step", "onecycle", "cosine", "constant"), default=None)
    t.add_argument("--no-augment", action="store_true", help="no flip + random crop")
    t.add_argument("--adv-steps", type=int, default=None, help="PGD steps of training (10)")
    t.add_argument("--linear-epochs", type=int, default=None, help="SimCLR linear head (100)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--until-epoch", type=int, default=None, help="stop early; resume later")
    t.add_argument("--no-resume", action="store_true", help="ignore a saved training state")
    t.add_argument("--workers", type=int, default=0, help="data loader workers")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    t.add_argument("--eval-every-epoch", action="store_true", help="test accuracy per epoch")
    t.add_argument(
        "--robust",
        default="auto",
        choices=("auto", "none", "pgd", "autoattack"),
        help="robust evaluation (auto: PGD-20 for adversarial training, else none)",
    )
    t.add_argument("--robust-samples", type=int, default=1000)
    t.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", required=True, help="output folder")


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.width is not None:
        options["width"] = args.width
    if args.stem is not None:
        options["stem"] = args.stem
    for item in args.option:
        if "=" not in item:
            raise ValueError(f"--option needs KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        options[key.strip()] = _parse_value(value.strip())
    return options


def _need_root(args: argparse.Namespace) -> Path:
    if not args.root:
        raise ValueError(f"--data {args.data} reads files: pass --root FOLDER")
    root = Path(args.root)
    if not root.exists():
        raise ValueError(f"--root {str(root)!r} does not exist")
    return root


def _datasets(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """``(train, test, description)`` for the chosen data set (before subsets/markers)."""
    from .. import data

    desc: dict[str, Any] = {"name": args.data}
    if args.data in ("shapes", "cues"):
        size = args.image_size or 32
        n_train = args.train_size or 5000
        n_test = args.test_size or 1000
        if args.data == "shapes":
            kw: dict[str, Any] = {"size": size}
            train = data.shapes(n_train, seed=2 * args.seed, **kw)
            test = data.shapes(n_test, seed=2 * args.seed + 1, **kw)
        else:
            kw = {
                "size": size,
                "label_cues": tuple(c for c in args.cues.split(",") if c),
                "nuisance": None
                if args.nuisance is None
                else tuple(c for c in args.nuisance.split(",") if c),
            }
            train = data.cues(n_train, seed=2 * args.seed, **kw)
            test = data.cues(n_test, seed=2 * args.seed + 1, **kw)
            desc.update(label_cues=list(kw["label_cues"]), nuisance=args.nuisance or "others")
        desc.update(size=size, data_seeds=[2 * args.seed, 2 * args.seed + 1])
        wrap = torch.utils.data.TensorDataset
        return wrap(*train), wrap(*test), desc
    root = _need_root(args)
    desc["root"] = str(root)
    if args.data == "cifar10":
        return data.cifar10(root, True), data.cifar10(root, False), desc
    if args.data == "mnist":
        return (
            data.mnist(root, True, channels=3, size=32),
            data.mnist(root, False, channels=3, size=32),
            desc,
        )
    if args.data == "coloured-mnist":
        desc["variant"] = args.variant
        return (
            data.coloured_mnist(root, args.variant, True, seed=args.seed),
            data.coloured_mnist(root, args.variant, False, seed=args.seed),
            desc,
        )
    if args.data == "ls-imagenet10":
        return data.ls_imagenet10(root, True), data.ls_imagenet10(root, False), desc
    if args.data == "imagenet100":
        return data.imagenet100(root, True), data.imagenet100(root, False), desc
    if args.data == "imagenet-b100":
        return data.imagenet_b100(root, True), data.imagenet_b100(root, False), desc
    size = args.image_size
    desc["size"] = size
    return data.image_folder(root, True, size=size), data.image_folder(root, False, size=size), desc


def _recipe(args: argparse.Namespace):
    from .recipes import fast_recipe, paper_recipe

    method = {"shortcut": "standard"}.get(args.kind, args.kind)
    changes: dict[str, Any] = {"method": method, "num_workers": args.workers}
    for name in ("epochs", "lr", "batch_size", "weight_decay", "optimizer", "schedule"):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    if args.adv_steps is not None:
        changes["adv_steps"] = args.adv_steps
    if args.linear_epochs is not None:
        changes["linear_epochs"] = args.linear_epochs
    if args.no_augment:
        changes["augment"] = False
    if args.recipe == "paper":
        return paper_recipe(args.model, **changes)
    return fast_recipe(**changes)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device {name!r} is not a device (use auto, cpu or cuda)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but no CUDA GPU is available; use --device cpu")
    return device


def run_train_command(args: argparse.Namespace) -> int:
    """Run ``stitchlab train``; returns the exit code (0: done or stopped as asked)."""
    from .. import data, models
    from .loop import MODEL_FILE, train_model

    options = _model_options(args)
    recipe = _recipe(args)
    train, test, data_desc = _datasets(args)
    classes = getattr(train, "classes", None)
    num_classes = len(classes) if classes else int(data.labels_of(train).max()) + 1
    train = data.subset(train, args.train_size, per_class=args.per_class, seed=args.seed)
    if args.test_size is not None:
        test = data.subset(test, args.test_size, seed=args.seed)
    data_desc.update(train_size=len(train), test_size=len(test), per_class=args.per_class)
    marker = args.marker or ("pixel+loc" if args.kind == "shortcut" else None)
    test_sets: dict[str, Any] = {"clean": test}
    if marker is not None:
        data_desc["marker"] = {"mode": marker, "seed": args.seed}
        mark = {"mode": marker, "num_classes": num_classes, "seed": args.seed}
        if args.kind == "shortcut":
            train = data.Marked(train, **mark)
        test_sets["marked"] = data.Marked(test, **mark)
        test_sets["rolled"] = data.Marked(test, rolled=True, **mark)
    robust = args.robust
    if robust == "auto":
        robust = "pgd" if args.kind == "adversarial" else None
    elif robust == "none":
        robust = None
    torch.manual_seed(args.seed)
    model = models.create(args.model, num_classes=num_classes, **options)
    model.to(_device(args.device))
    out = Path(args.out)
    print(
        f"training {args.model}{' ' + str(options) if options else ''} ({args.kind}) on "
        f"{args.data}: "
        f"{len(train)} images, {recipe.epochs} epochs, recipe {args.recipe}",
        flush=True,
    )
    result = train_model(
        model,
        train,
        recipe=recipe,
        test_data=test_sets,
        robust=robust,
        robust_samples=args.robust_samples,
        out=out,
        resume=not args.no_resume,
        seed=args.seed,
        until_epoch=args.until_epoch,
        eval_every_epoch=args.eval_every_epoch,
        progress=not args.no_progress,
        description={"data": data_desc, "kind": args.kind},
    )
    for h in result.history[result.resumed_from :]:
        extra = f" test {h['test_accuracy']:.1f}%" if "test_accuracy" in h else ""
        print(
            f"epoch {h['epoch']:>3}: loss {h['loss']:.4f} train {h['train_accuracy']:.1f}%"
            f"{extra} ({h['seconds']:.1f} s)"
        )
    if result.path is None:
        print(
            f"stopped after epoch {len(result.history)} of {recipe.epochs}; run the same "
            f"command again to continue from {out}"
        )
        return 0
    print(json.dumps(result.evaluation, indent=1))
    print(f"saved {out / MODEL_FILE}")
    return 0
