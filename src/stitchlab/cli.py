"""The ``stitchlab`` command: a thin layer over the library."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from pathlib import Path

import torch

from .vocabulary import OBJECTIVES

__all__ = ["main"]

EXAMPLES = {
    "layers": "stitchlab layers resnet18 --width 16\n  stitchlab layers vit_tiny_patch4_32\n  "
    "stitchlab layers torchvision:swin_t --input-size 64\n  "
    "stitchlab layers timm:maxvit_rmlp_pico_rw_256 --option img_size=64 --all",
    "demo": "stitchlab demo --out demo-out\n  stitchlab demo --out /tmp/d --quick\n"
    "  stitchlab demo audio --out audio-out [--quick]",
    "oracle": "stitchlab oracle --quick --out /tmp/o\n  "
    "stitchlab oracle --seed 1 --out runs/oracle\n  "
    "stitchlab oracle --config configs/oracle.toml --out runs/oracle",
    "run": "STITCHLAB_DATA=data stitchlab run configs/cpu/a_cifar10_resnet18.toml --out runs/a\n  "
    "STITCHLAB_DATA=data stitchlab run configs/cpu/b_robust.toml --out runs/b "
    "--store runs/a/store --ray\n  "
    "stitchlab run my.toml --out x --check",
    "report": "stitchlab report runs/a",
    "stitch": "stitchlab stitch runs/a/store/models/seed1-*/model.safetensors "
    "runs/a/store/models/back-*/model.safetensors blocks.2 --protocol iris",
    "iris": "stitchlab iris /tmp/m/model.safetensors blocks.1 --cache /tmp/iris\n  "
    "stitchlab iris /tmp/m/model.safetensors blocks.1 --cache /tmp/iris --preset paper\n  "
    "stitchlab iris small_cnn blocks.1 --cache /tmp/iris --random-init",
    "train": "stitchlab train --model small_cnn --data shapes --recipe fast --out /tmp/m",
    "compare": "stitchlab compare timm:resnet18 torchvision:resnet18 --front-weights a.safetensors "
    "--back-weights b.pth --data my_images/ --out runs/cmp\n  "
    "stitchlab compare runs/a/store/models/seed1-*/model.safetensors "
    "runs/a/store/models/back-*/model.safetensors --data data/cifar10 --out runs/cmp --quick\n  "
    "stitchlab compare m1.safetensors m2.safetensors --data images.npz --points grid --out g\n  "
    "stitchlab compare mel.safetensors wave.safetensors --data my_wavs/ --out runs/speech",
}


def parse_key_values(items, flag: str = "--option") -> dict:
    """``["steps=360", "start=image"]`` -> ``{"steps": 360, "start": "image"}``: each value
    a Python literal (numbers, tuples, strings, None; never code), a bare word a string;
    a ValueError naming ``flag`` for an item without ``=``."""
    import ast

    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} takes KEY=VALUE, got {item!r}")
        try:
            options[key] = ast.literal_eval(value)  # numbers, tuples, strings; no code
        except (ValueError, SyntaxError):
            options[key] = value
    return options


def _model_options(args: argparse.Namespace) -> dict:
    options = {}
    if getattr(args, "width", None) is not None:
        options["width"] = args.width
    options.update(parse_key_values(getattr(args, "option", None) or []))
    return options


def _tracing_args(args: argparse.Namespace) -> dict:
    """``leaf_modules``, ``output`` and ``layouts`` from the command line."""
    from .splitting import resolve_leaf_modules

    out = getattr(args, "output", None)
    if out is not None and out.lstrip("-").isdigit():
        out = int(out)
    layouts = {}
    for item in getattr(args, "layout", None) or []:
        point, sep, lay = item.partition("=")
        if not sep:
            raise ValueError(f"--layout takes POINT=LAYOUT (e.g. features.3=NHWC), got {item!r}")
        layouts[point] = lay
    return {
        "leaf_modules": resolve_leaf_modules(getattr(args, "leaf_module", None) or []),
        "output": out,
        "layouts": layouts or None,
    }


def _cmd_layers(args: argparse.Namespace) -> int:
    from . import models
    from .splitting import TracedModel

    if Path(args.model).exists():
        model = models.load(args.model)
        name = args.model
    else:
        name = args.model
        if not models.is_known(name):  # a bare torchvision or timm name: say which one
            for lib in ("torchvision:", "timm:"):
                if models.is_known(lib + name):
                    name = lib + name
                    break
        model = models.create(name, num_classes=args.num_classes, **_model_options(args))
    model.eval()
    from .models.sources import input_channels

    for flag, value in (("--input-size", args.input_size), ("--in-channels", args.in_channels)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    c, h, w = models.default_input_size(model) or (input_channels(model) or 3, 0, 0)
    if args.input_size:
        h = w = args.input_size
    elif not h:
        h = w = 224 if "224" in name else 32
    if args.in_channels:
        c = args.in_channels
    x = torch.rand(3, c, h, w, generator=torch.Generator().manual_seed(0))
    tracing = _tracing_args(args)
    tm = TracedModel(model, leaf_modules=tracing["leaf_modules"], output=tracing["output"])
    points = tm.points("all" if args.all else "default")
    formats = tm.formats(x, points, layouts=tracing["layouts"])
    kind = "exact cuts" if args.all else "stitch points"
    print(f"{name}: {len(points)} {kind} (input {c}x{h}x{w}; layout: the axis order of the "
          "activation, batch first)")  # fmt: skip
    width = max(len(p) for p in points)
    for p in points:
        f = formats[p]
        print(f"  {p:<{width}}  {f.spec if f.spec is not None else '-- ' + str(f.problem)}")
    if not tm.same_in_both_modes:
        print("(forward differs between train and eval mode: each half keeps both graphs)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .experiments import builtin_config, run_experiment

    name = "demo" if args.modality == "images" else "demo_audio"
    config = builtin_config(name + ("_quick" if args.quick else ""))
    summary = run_experiment(config, args.out, progress=not args.no_progress, echo=print,
                             plan_only=args.plan)  # fmt: skip
    if args.plan:
        return 0
    _report(args.out, quiet=args.no_progress)
    _print_finding(Path(args.out) / "results.csv")
    print(f"demo finished in {summary['seconds']} s; report: {Path(args.out) / 'report.html'}")
    return 0


def _cmd_oracle(args: argparse.Namespace) -> int:
    from .oracle import OracleSettings, load_oracle_config

    settings = (load_oracle_config(args.config, quick=args.quick) if args.config
                else OracleSettings.quick() if args.quick else OracleSettings())  # fmt: skip
    changes = {k: v for k, v in (("seed", args.seed), ("threads", args.threads)) if v is not None}
    return _run_oracle(dataclasses.replace(settings, **changes), args.out, args.no_progress,
                       _executor(args), args.plan)  # fmt: skip


def _run_oracle(settings, out: str, no_progress: bool, executor=None, plan: bool = False) -> int:
    from .oracle import run_oracle

    summary = run_oracle(settings, out, progress=not no_progress, executor=executor,
                         echo=print, plan_only=plan)  # fmt: skip
    if plan:
        return 0
    print("Spearman with the oracle (layer-averaged, 95% interval over pairs):")
    for key, entry in summary["methods"].items():
        v = entry["layer_average"]
        print(f"  {key:<22} {v['spearman']:6.2f}  [{v['ci_low']:.2f}, {v['ci_high']:.2f}]")
    print(f"oracle finished in {summary['seconds']} s; report: {Path(out) / 'report.html'}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .compare import CompareSettings, load_compare_config

    if args.config:
        settings = load_compare_config(args.config, quick=args.quick)
    else:
        if not (args.front and args.back and args.data):
            raise ValueError("give FRONT, BACK and --data (or --config FILE with a [compare] "
                             "table)")  # fmt: skip
        given = {k: getattr(args, k) for k in _COMPARE_ARGS if getattr(args, k) is not None}
        if args.points is not None:
            given["points"] = args.points[0] if args.points in (["grid"], ["depth"]) \
                else tuple(args.points)
        given["random_init"] = args.random_init
        settings = (CompareSettings.quick if args.quick else CompareSettings)(
            front=args.front, back=args.back, data=args.data, **given)
    return _run_compare(settings, args.out, args.store, args.no_progress, _executor(args),
                        args.plan)  # fmt: skip


_COMPARE_ARGS = ("front_weights", "back_weights", "front_num_classes", "back_num_classes",
                 "front_size", "back_size", "front_mean", "front_std", "back_mean", "back_std",
                 "front_rate", "back_rate", "clip_seconds", "image_size", "test_fraction",
                 "n_points", "objectives", "protocols", "seeds",
                 "null_seeds", "n_stitch", "n_test", "n_init", "epochs", "lr", "iri_steps",
                 "iri_seeds", "device")  # fmt: skip


def _run_compare(settings, out: str, store: str | None, no_progress: bool, executor=None,
                 plan: bool = False) -> int:  # fmt: skip
    from .compare import console_table, run_compare

    df = run_compare(settings, out, store=store, progress=not no_progress, executor=executor,
                     plan_only=plan)  # fmt: skip
    if plan:
        return 0
    print(console_table(df))
    print(f"report: {Path(out) / 'report.html'}")
    return 0


def _executor(args: argparse.Namespace):
    """A RayExecutor for --ray / --ray-address (each job asking for --gpus-per-job GPUs on
    CUDA), else None (the jobs run in this process)."""
    if args.gpus_per_job is not None and not (args.ray or args.ray_address):
        raise ValueError("--gpus-per-job is what each Ray job asks for: add --ray")
    if not (args.ray or args.ray_address):
        return None
    from .experiments import RayExecutor

    return RayExecutor(args.ray_address, gpus_per_job=args.gpus_per_job)


def _add_plan_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", action="store_true", help="print the plan (jobs per stage, "
                        "what the store holds, a time estimate) and stop")  # fmt: skip


def _add_ray_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--ray", action="store_true", help=f"run the {what} on a local Ray "
                        "cluster (a rerun resumes from the store)")  # fmt: skip
    parser.add_argument("--ray-address", default=None, help="address of a running Ray cluster")
    parser.add_argument("--gpus-per-job", type=float, default=None,
                        help="GPUs each Ray job asks for on a CUDA device (default 1; a "
                        "fraction such as 0.5 shares a GPU)")  # fmt: skip


def _print_finding(table: Path) -> None:
    """Layer-averaged agreement per pair, objective and protocol (the demo's finding)."""
    rows = list(csv.DictReader(table.open()))
    cells: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        cells.setdefault((r["pair"], r["objective"], r["protocol"]), []).append(
            float(r["agreement"])
        )
    print("layer-averaged agreement (%)   standard   iris")
    for pair in dict.fromkeys(r["pair"] for r in rows):
        for obj in OBJECTIVES:
            std = cells.get((pair, obj, "standard"))
            iri = cells.get((pair, obj, "iris"))
            if std is None and iri is None:
                continue
            fmt = lambda v: f"{sum(v) / len(v):8.1f}" if v else "       -"  # noqa: E731
            print(f"  {pair:<12} {obj:<5}            {fmt(std)}   {fmt(iri)}")


def _report(out: str, quiet: bool = False) -> None:
    try:
        from .report import make_report
    except ImportError as exc:  # matplotlib/pandas missing
        print(f"no report: {exc}", file=sys.stderr)
        return
    path = make_report(out)
    if not quiet:
        print(f"report written to {path}")


def _cmd_run(args: argparse.Namespace) -> int:
    from .compare import is_compare_config, load_compare_config
    from .experiments import LocalExecutor, load_config, preflight, run_experiment
    from .oracle import is_oracle_config, load_oracle_config

    if is_compare_config(args.config):  # a comparison of two models as a config (issue 15)
        settings = load_compare_config(args.config)
        if args.check:
            print(f"{args.config}: valid compare config ({settings.front} -> {settings.back} "
                  f"on {settings.data})")  # fmt: skip
            return 0
        return _run_compare(settings, args.out, args.store, args.no_progress, _executor(args),
                            args.plan)  # fmt: skip
    if is_oracle_config(args.config):  # the oracle testbed as a config (issue 14)
        settings = load_oracle_config(args.config)
        if args.check:
            print(f"{args.config}: valid oracle config ({len(settings.families)} families x "
                  f"{len(settings.seeds)} seeds, points {', '.join(settings.points)})")  # fmt: skip
            return 0
        return _run_oracle(settings, args.out, args.no_progress, _executor(args), args.plan)
    exp = load_config(args.config)  # checked completely before anything runs
    preflight(exp)  # data folders, variables, device: what the run would check first
    if args.check:
        n_points = sum(len(p) for p in exp.points.values())
        print(f"{args.config}: valid ({len(exp.pairs)} pairs, {len(exp.models)} models, "
              f"{n_points} pair-points; data and device present)")  # fmt: skip
        return 0
    executor = _executor(args) or LocalExecutor()
    run_experiment(exp, args.out, executor=executor, progress=not args.no_progress,
                   store=args.store, echo=print, plan_only=args.plan)  # fmt: skip
    if not args.no_report and not args.plan:
        _report(args.out)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import make_report

    print(make_report(args.dir, num_classes=args.num_classes, spread=args.spread))
    return 0


def _load_model_arg(spec: str, random_init: bool = False):
    """A checkpoint, or (only with ``--random-init``) a freshly initialised model."""
    from . import models

    if Path(spec).exists():
        return models.load(spec)
    if not models.is_known(spec):
        raise ValueError(f"{spec!r} is neither a checkpoint file nor a known model name.")
    if not random_init:
        raise ValueError(
            f"{spec!r} is a model name, not a checkpoint: it would be an untrained, randomly "
            "initialised network. Pass a checkpoint file (stitchlab train writes one), or "
            "--random-init to study random networks on purpose."
        )
    return models.create(spec)


def _data_arg(args: argparse.Namespace):
    """(stitching data, test data): the user's data as ``compare --data`` reads it, or
    generated shapes."""
    if args.data and args.data_root:
        raise ValueError("give --data only (--data-root is its older name)")
    path = args.data or args.data_root
    if path:
        from .data.user import load_user_data

        data = load_user_data(path, size=args.image_size, n_stitch=args.n, n_test=args.n_test)
        return data.stitch, data.test
    from .data import shapes

    x, y = shapes(args.n, seed=0)
    xt, yt = shapes(args.n_test, seed=1)
    return (x, y), (xt, yt)


def _cmd_stitch(args: argparse.Namespace) -> int:
    from . import InvarianceAware, Standard, evaluate, stitch

    front = _load_model_arg(args.front, args.random_init)
    back = _load_model_arg(args.back, args.random_init)
    train, test = _data_arg(args)
    protocol = InvarianceAware(cache=args.iris_cache) if args.protocol == "iris" else Standard()
    s = stitch(front, back, args.point, train, objective=args.objective,
               back_point=args.back_point, protocol=protocol, epochs=args.epochs,
               lr=args.lr, progress=True, **_tracing_args(args))  # fmt: skip
    scores = evaluate(s, test, back)
    print(f"stitch layer: {s.stitch_layer.src} -> {s.stitch_layer.dst}; "
          f"init residual {s.init_residual}")  # fmt: skip
    if s.iri_quality is not None:
        print(s.iri_quality)
    for k, v in scores.items():
        print(f"  {k:<22} {v:8.3f}")
    return 0


class _Grey:
    """A dataset's RGB images as their grey level (luma), for a 1-channel model."""

    def __init__(self, data) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        x, *rest = self.data[i]
        return (_luma(x), *rest)


def _luma(x):
    import torch

    from .models.sources import LUMA

    w = torch.tensor(LUMA, dtype=x.dtype).view(3, 1, 1)
    return (x * w).sum(-3, keepdim=True)


def _with_channels_of(model, data):
    """``data`` whose images have the channels ``model`` takes: RGB images become their
    grey level (luma) for a 1-channel model, as compare does; other mismatches are refused."""
    from .models.sources import input_channels

    want = input_channels(model)
    first = data[0] if isinstance(data, tuple) else data[0][0]
    have = first.shape[-3] if first.dim() >= 3 else None
    if want is None or have is None or have == want:
        return data
    if want == 1 and have == 3:
        import logging

        logging.getLogger("stitchlab").info(
            "the model takes 1-channel images: the RGB images are turned to grey (luma)")
        return (_luma(data[0]), data[1]) if isinstance(data, tuple) else _Grey(data)
    raise ValueError(
        f"the model takes {want}-channel images but the data's have {have} channels; give "
        f"--data with {want}-channel images."
    )


def _cmd_iris(args: argparse.Namespace) -> int:
    from .iris import IRIRecipe, generate_iris_set

    model = _load_model_arg(args.model, args.random_init)
    train = _with_channels_of(model, _data_arg(args)[0])
    options = {"preset": args.preset}
    for key in ("steps", "step_size", "final_step_size", "optimizer", "tolerance"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    tracing = _tracing_args(args)
    tracing.pop("layouts")  # IRIs do not depend on the layout (a relative error)
    iri_set = generate_iris_set(
        model, args.point, train, args.cache, progress=True, **tracing, **options
    )
    print(f"{iri_set.root}: {iri_set.quality}")
    print(f"recipe: {IRIRecipe.from_kwargs(**options).describe()}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from .train.command import run_train_command

    return run_train_command(args)


def _add_random_init(p: argparse.ArgumentParser) -> None:
    p.add_argument("--random-init", action="store_true",
                   help="allow a model name without weights (a random network)")  # fmt: skip


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    """--data (read as compare --data reads it) and --image-size, for stitch and iris."""
    p.add_argument("--data", default=None,
                   help="image folder, CIFAR-10 folder, .npz, .safetensors, a Hugging Face "
                   "datasets folder or .wav files, read as compare --data reads them "
                   "(default: generated shapes)")  # fmt: skip
    p.add_argument("--data-root", default=None, help=argparse.SUPPRESS)  # older name
    p.add_argument("--image-size", type=int, default=None,
                   help="resize the shorter side and crop the centre to N x N")  # fmt: skip


def _add_tracing_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leaf-module", action="append", metavar="MODULE.CLASS",
                   help="a module class torch.fx must not trace into (repeatable)")  # fmt: skip
    p.add_argument("--output", default=None,
                   help="which output is the logits when forward returns a tuple (index) or "
                   "a dict (key); default: the first / 'logits'")  # fmt: skip
    p.add_argument("--layout", action="append", metavar="POINT=LAYOUT",
                   help="the layout of a point's activation (NCHW, NHWC, NCL, NLC, NC) where "
                   "it cannot be detected (repeatable)")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stitchlab",
        description="Functional similarity of neural networks by (invariance-aware) stitching.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=f"examples:\n  {EXAMPLES[name]}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    lay = add("layers", "List a model's stitch points with their activation formats.")
    lay.add_argument("model", help="a registered name (resnet18), torchvision:NAME, timm:NAME "
                     "or a checkpoint")  # fmt: skip
    lay.add_argument("--width", type=int, default=None, help="model width option")
    lay.add_argument("--option", action="append", metavar="KEY=VALUE",
                     help="another model option (repeatable), e.g. img_size=64")  # fmt: skip
    lay.add_argument("--num-classes", type=int, default=10)
    lay.add_argument("--input-size", type=int, default=None,
                     help="image side (default: the model's own, else 32 or 224)")  # fmt: skip
    lay.add_argument("--in-channels", type=int, default=None, help="input channels (3)")
    lay.add_argument("--all", action="store_true", help="every exact cut, not only the blocks")
    _add_tracing_arguments(lay)
    lay.set_defaults(func=_cmd_layers)

    demo = add("demo", "The main job: train small networks on generated data, stitch them.")
    demo.add_argument("modality", nargs="?", default="images", choices=("images", "audio"),
                      help="images (generated shapes, the default) or audio (spoken digits "
                      "synthesised with espeak-ng)")  # fmt: skip
    demo.add_argument("--out", required=True, help="output folder")
    demo.add_argument("--quick", action="store_true",
                      help="a smaller run (images: under 2 minutes; audio: under 3)")  # fmt: skip
    _add_plan_argument(demo)
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(func=_cmd_demo)

    ora = add("oracle", "Grade similarity methods on networks whose cue reliance is known.")
    ora.add_argument("--out", required=True, help="output folder (tables, store, report)")
    ora.add_argument("--quick", action="store_true", help="the 5-minute testbed")
    ora.add_argument("--seed", type=int, default=None, help="the testbed data's seed (0)")
    ora.add_argument("--config", default=None, help="a TOML file with an [oracle] table")
    ora.add_argument("--threads", type=int, default=None)
    _add_ray_arguments(ora, "stitch jobs (one per pair and point)")
    _add_plan_argument(ora)
    ora.add_argument("--no-progress", action="store_true")
    ora.set_defaults(func=_cmd_oracle)

    cmp_ = add("compare", "How similar are two of your models? Stitch them at matched points, "
               "with intervals and a random-front null.")
    cmp_.add_argument("front", nargs="?", help="checkpoint, registry name, torchvision:NAME, "
                      "timm:NAME or hf:FOLDER")  # fmt: skip
    cmp_.add_argument("back", nargs="?", help="the same kinds as FRONT")
    cmp_.add_argument("--data", help="image folder, CIFAR-10 folder, .npz, .safetensors or a "
                      "Hugging Face datasets folder; for speech models a folder of .wav files "
                      "(or waveforms in a .npz/.safetensors)")  # fmt: skip
    cmp_.add_argument("--out", required=True, help="output folder (tables, figures, report)")
    cmp_.add_argument("--store", default=None, help="run store (default OUT/store)")
    cmp_.add_argument("--config", default=None, help="a TOML file with a [compare] table")
    cmp_.add_argument("--quick", action="store_true",
                      help="a smoke test: 3 points, SLM, 1 seed, few images and steps")
    for side in ("front", "back"):
        cmp_.add_argument(f"--{side}-weights", default=None,
                          help=f"weights of the {side} model (safetensors or a state dict)")
        cmp_.add_argument(f"--{side}-num-classes", type=int, default=None,
                          help="default: read from the weights")
        cmp_.add_argument(f"--{side}-size", type=int, default=None,
                          help=f"image side the {side} model reads (default: its own)")
        cmp_.add_argument(f"--{side}-mean", type=float, nargs=3, default=None)
        cmp_.add_argument(f"--{side}-std", type=float, nargs=3, default=None)
        cmp_.add_argument(f"--{side}-rate", type=int, default=None, metavar="HZ",
                          help=f"sample rate the {side} speech model reads (default: its own)")
    cmp_.add_argument("--clip-seconds", type=float, default=None,
                      help="seconds of audio each speech model reads (default: its own)")
    cmp_.add_argument("--image-size", type=int, default=None,
                      help="resize (and centre-crop) the data's images to this side")
    cmp_.add_argument("--test-fraction", type=float, default=None)
    cmp_.add_argument("--points", nargs="+", default=None, metavar="POINT",
                      help="'depth' (default), 'grid', or points: NAME or FRONT:BACK")
    cmp_.add_argument("--n-points", type=int, default=None, help="points per model (5)")
    cmp_.add_argument("--objectives", nargs="+", choices=OBJECTIVES, default=None)
    cmp_.add_argument("--protocols", nargs="+", choices=("standard", "iris"), default=None)
    cmp_.add_argument("--seeds", type=int, default=None, help="stitch seeds (3)")
    cmp_.add_argument("--null-seeds", type=int, default=None,
                      help="random fronts per cell (default: --seeds; 0: no null)")
    cmp_.add_argument("--n-stitch", type=int, default=None, help="stitching images (2000)")
    cmp_.add_argument("--n-test", type=int, default=None, help="test images (1000)")
    cmp_.add_argument("--n-init", type=int, default=None)
    cmp_.add_argument("--epochs", type=int, default=None, help="stitch epochs (6)")
    cmp_.add_argument("--lr", type=float, default=None)
    cmp_.add_argument("--iri-steps", type=int, default=None,
                      help="IRI optimisation steps (200 for images, 300 for audio)")
    cmp_.add_argument("--iri-seeds", action="store_true", default=None,
                      help="each stitch seed on IRIs of its own random start: the interval "
                      "includes IRI-generation variability (the front's IRIs cost --seeds "
                      "times as much)")
    cmp_.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    _add_random_init(cmp_)
    _add_ray_arguments(cmp_, "stitch jobs (one per front model and cell)")
    _add_plan_argument(cmp_)
    cmp_.add_argument("--no-progress", action="store_true")
    cmp_.set_defaults(func=_cmd_compare)

    run = add("run", "Run (or resume) an experiment config; then write its report.")
    run.add_argument("config", help="a TOML experiment config (see configs/)")
    run.add_argument("--out", required=True, help="output folder (results, store, report)")
    run.add_argument("--store", default=None,
                     help="job store shared between runs (default OUT/store)")  # fmt: skip
    run.add_argument("--check", action="store_true", help="only validate the config")
    _add_plan_argument(run)
    _add_ray_arguments(run, "jobs")
    run.add_argument("--no-report", action="store_true")
    run.add_argument("--no-progress", action="store_true")
    run.set_defaults(func=_cmd_run)

    rep = add("report", "Write figures and an HTML report from a run folder's tables.")
    rep.add_argument("dir", help="a run folder (with results.csv)")
    rep.add_argument("--num-classes", type=int, default=None, help="for the chance level")
    rep.add_argument("--spread", default="minmax", choices=("minmax", "std", "none"),
                     help="seed spread drawn around the mean curves")  # fmt: skip
    rep.set_defaults(func=_cmd_report)

    st = add("stitch", "Stitch two models at one point and print the scores.")
    st.add_argument("front", help="checkpoint path, registered name, torchvision:NAME or timm:NAME")
    st.add_argument("back", help="checkpoint path, registered name, torchvision:NAME or timm:NAME")
    st.add_argument("point", help="stitch point of the front (see stitchlab layers)")
    st.add_argument("--back-point", default=None)
    st.add_argument("--objective", default="slm", choices=OBJECTIVES)
    st.add_argument("--protocol", default="standard", choices=("standard", "iris"))
    st.add_argument("--iris-cache", default=None, help="folder to cache IRI sets in")
    st.add_argument("--epochs", type=int, default=30)
    st.add_argument("--lr", type=float, default=1e-3)
    _add_data_arguments(st)
    st.add_argument("--n", type=int, default=2000, help="stitching images")
    st.add_argument("--n-test", type=int, default=1000, help="test images")
    _add_tracing_arguments(st)
    _add_random_init(st)
    st.set_defaults(func=_cmd_stitch)

    from .iris import PRESETS

    ir = add("iris", "Generate (or resume) the IRI set of a model at a point; print quality.")
    ir.add_argument("model", help="checkpoint path or registered model name")
    ir.add_argument("point")
    ir.add_argument("--cache", required=True, help="IRI cache folder")
    ir.add_argument("--preset", default="default",
                    choices=sorted(PRESETS),
                    help="stitchlab's recipe (default), the paper's (200 signed steps of "
                    "1/255), or for waveforms the audio recipe (docs/recipes.md)")  # fmt: skip
    ir.add_argument("--steps", type=int, default=None, help="override the preset's steps")
    ir.add_argument("--step-size", type=float, default=None)
    ir.add_argument("--final-step-size", type=float, default=None)
    ir.add_argument("--optimizer", default=None, choices=("adam", "sign"),
                    help="override the preset's optimizer")  # fmt: skip
    ir.add_argument("--tolerance", type=float, default=None)
    _add_data_arguments(ir)
    ir.add_argument("--n", type=int, default=2000)
    ir.add_argument("--n-test", type=int, default=1)
    _add_tracing_arguments(ir)
    _add_random_init(ir)
    ir.set_defaults(func=_cmd_iris)

    from .train.command import add_train_arguments

    tr = add("train", "Train a base model (standard, shortcut, adversarial, SimCLR).")
    add_train_arguments(tr)
    tr.set_defaults(func=_cmd_train)
    return p


def _setup_logging() -> None:
    """stitchlab's log messages (progress, reuse, damaged entries) go to stderr."""
    import logging

    logger = logging.getLogger("stitchlab")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stitchlab`` command."""
    args = _parser().parse_args(argv)
    _setup_logging()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(
            f"\nstitchlab {args.command}: interrupted; finished work is stored. Rerun the same "
            "command to resume.",
            file=sys.stderr,
        )
        return 130
    except (KeyError, ValueError, TypeError, RuntimeError, OSError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"stitchlab {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
