"""Two torchvision models on a folder of your images.

What it shows: two torchvision classifiers (weights from your local files; nothing is
downloaded), each behind its own input pipeline (the resize and normalisation of its
weights' transforms), stitched at shared points on the images of a folder laid out
``ROOT/<class>/*.png`` (or ``ROOT/train/<class>/`` and ``ROOT/test/<class>/``). At each
point the script trains one stitch layer under the standard protocol and one under
invariance-aware stitching (on the front's IRIs), and prints the agreement of the
stitched network with the back on held-out images, beside the back stitched into itself by
the least-squares stitch alone (the identity: it scores 100). ``stitchlab compare`` does the
same from the command line, with intervals, a random-front null and a stored, resumable
run (docs/compare.md).

Run it at full size (ImageNet-trained weights saved with ``torch.save(model.state_dict())``
or as safetensors; three points by default)::

    python examples/torchvision_folder.py --data my_images/ \\
        --front torchvision:resnet18 --front-weights resnet18_a.pth \\
        --back torchvision:resnet18 --back-weights resnet18_b.safetensors
    python examples/torchvision_folder.py --smoke   # random networks, generated folder

``--smoke`` writes a tiny generated image folder to a temporary directory and uses
randomly initialised networks at 32x32 (a few seconds).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

import stitchlab as sl
from stitchlab import data
from stitchlab.data.user import load_user_data
from stitchlab.fit import TrainingConfig
from stitchlab.models.sources import WithInput, load_model_source


def write_folder(root: Path, classes: int = 3, per_class: int = 12, size: int = 32) -> Path:
    """A generated image folder ``root/<class>/*.png`` (shapes, one class per shape)."""
    from PIL import Image

    x, y = data.shapes(classes * per_class * 3, seed=0, size=size, num_classes=classes)
    count = [0] * classes
    for image, label in zip(x, y.tolist(), strict=True):
        if count[label] == per_class:
            continue
        folder = root / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (image.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"{count[label]:03d}.png")
        count[label] += 1
    return root


def load(spec: str, weights: str | None, size: int | None, image_size, random_init: bool,
         seed: int):  # fmt: skip
    """The model behind its own input pipeline; its stitch points (the model's names)."""
    torch.manual_seed(seed)  # the random start of a --random-init network
    source = load_model_source(spec, weights, random_init=random_init)
    points = source.points()
    pipeline = source.input.replace(size=size)
    return WithInput(source.model, pipeline, image_size, points).eval(), points


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Stitch FRONT into BACK at each point, print and return the agreement table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, generated data")
    p.add_argument("--data", help="an image folder (ROOT/<class>/*)")
    p.add_argument("--front", default="torchvision:resnet18")
    p.add_argument("--back", default="torchvision:resnet18")
    p.add_argument("--front-weights")
    p.add_argument("--back-weights")
    p.add_argument(
        "--random-init",
        action="store_true",
        help="random networks when no weights are given (on purpose)",
    )
    p.add_argument("--points", nargs="+", help="points both models have (default: 3 of them)")
    p.add_argument("--size", type=int, help="input size for both models (default: their own)")
    p.add_argument("--n-stitch", type=int, default=500)
    p.add_argument("--n-test", type=int, default=500)
    p.add_argument("--epochs", type=int, default=6, help="stitch-training epochs")
    p.add_argument("--objective", default="slm", choices=["hlm", "slm", "dm", "fula"])
    p.add_argument("--iri-steps", type=int, help="IRI steps (default: stitchlab's recipe)")
    p.add_argument(
        "--allow-flagged",
        action="store_true",
        help="train on IRIs that miss the quality limits (the smoke sizes do)",
    )
    args = p.parse_args(argv)
    tmp = None
    if args.smoke:
        args.allow_flagged = True
        tmp = tempfile.TemporaryDirectory()
        args.data = str(write_folder(Path(tmp.name) / "images"))
        args.random_init, args.size, args.n_stitch, args.n_test = True, 32, 24, 12
        args.epochs, args.iri_steps = 1, 3
        args.points = args.points or ["layer2.1"]
    if args.data is None:
        p.error("--data FOLDER is required (or --smoke)")
    start = time.time()

    images = load_user_data(args.data, size=args.size, n_stitch=args.n_stitch,
                            n_test=args.n_test)  # fmt: skip
    print(f"{args.data}: {len(images.stitch)} stitching and {len(images.test)} test "
          f"{images.describe_items()}, {images.num_classes} classes")  # fmt: skip
    front, front_points = load(args.front, args.front_weights, args.size, images.image_size,
                               args.random_init, seed=1)  # fmt: skip
    back, back_points = load(args.back, args.back_weights, args.size, images.image_size,
                             args.random_init, seed=0)  # fmt: skip
    shared = [q for q in front_points if q in back_points]
    if not shared and not args.points:
        p.error(f"{args.front} and {args.back} share no point name; use two models of one "
                "architecture, or stitchlab compare (it matches points by depth)")  # fmt: skip
    points = args.points or [shared[len(shared) * k // 3] for k in (1, 2)] + [shared[-1]]

    recipe = sl.IRIRecipe() if args.iri_steps is None else sl.IRIRecipe(steps=args.iri_steps)
    protocols = [sl.Standard(), sl.InvarianceAware(recipe=recipe, allow_flagged=args.allow_flagged)]
    settings = TrainingConfig(epochs=args.epochs)
    identity = TrainingConfig(epochs=0)  # the least-squares stitch alone
    rows = []
    for point in points:
        for pair, f in (("self (least squares)", back), ("front -> back", front)):
            st = sl.Stitcher(f, back, f"net.{point}")  # the wrapped models' names
            init = st.initialise(images.stitch)
            for protocol in protocols if f is front else protocols[:1]:
                model = st.fit(args.objective, st.collect(images.stitch, protocol), init=init,
                               settings=settings if f is front else identity)  # fmt: skip
                scores = st.evaluate(model, images.test)
                rows.append({"pair": pair, "point": point, "protocol": protocol.name,
                             "agreement": scores["agreement"],
                             "ci_low": scores["agreement_ci_low"],
                             "ci_high": scores["agreement_ci_high"],
                             "hard": scores["hard_agreement"]})  # fmt: skip
    table = pd.DataFrame(rows)
    print(
        f"\n{args.objective.upper()} agreement with the back (%), its 95% interval and "
        "equal decisions (hard):"
    )
    print(table.round(1).to_string(index=False))
    print(f"({time.time() - start:.0f} s)")
    if tmp is not None:
        tmp.cleanup()
    return table


if __name__ == "__main__":
    main()
