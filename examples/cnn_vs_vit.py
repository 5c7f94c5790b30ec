"""A CNN against a ViT, both from timm: a stitch across architectures.

What it shows: a convolutional front (``timm:resnet18``) stitched into a vision
transformer's back (``timm:vit_tiny_patch16_224``). The two points have different formats
(a CNN's NCHW map, a ViT's tokens); stitchlab reads each point's layout from the traced
graph and chooses the cross-format stitch layer (the map resized to the token grid, a
per-token linear map over channels). The script prints the agreement with the ViT of the
CNN -> ViT stitch under the standard protocol and under invariance-aware stitching, beside
the ViT stitched into itself by the least-squares stitch alone (the identity: 100).

With weights (``--cnn-weights``/``--vit-weights``: local timm checkpoint files, e.g. ImageNet
ones; nothing is downloaded) both models read the data through their own input pipeline
(timm's resize and normalisation) and ``--data`` is a folder of your images. Without them
both are trained from scratch here on the data (default: generated shapes, 32x32), with a
ViT of patch 4 for 32x32 images. Full size::

    python examples/cnn_vs_vit.py
    python examples/cnn_vs_vit.py --data my_images/ --cnn-weights resnet18.safetensors \\
        --vit-weights vit_tiny.safetensors --cnn-point layer3 --vit-point blocks.6
    python examples/cnn_vs_vit.py --smoke      # tiny models, a few seconds
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
import torch

import stitchlab as sl
from stitchlab import data, models, train
from stitchlab.data.user import load_user_data
from stitchlab.fit import TrainingConfig
from stitchlab.models.sources import InputSpec, WithInput, load_model_source


def build(spec: str, weights: str | None, options: dict, image_size, train_data, epochs: int,
          seed: int) -> WithInput:  # fmt: skip
    """``spec`` behind its input pipeline: loaded from ``weights`` (its own pipeline), or
    created with ``options`` and trained on ``train_data`` ([0, 1] pixels as they are)."""
    if weights is not None:
        source = load_model_source(spec, weights)
        return WithInput(source.model, source.input, image_size, source.points()).eval()
    torch.manual_seed(seed)
    net = models.create(spec, num_classes=10, **options)
    train.train_classifier(net, train_data, epochs=epochs, seed=seed)
    return WithInput(net, InputSpec(), image_size, sl.stitch_points(net)).eval()


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Stitch the CNN into the ViT, print and return the agreement table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes (a few seconds)")
    p.add_argument("--data", help="an image folder (default: generated shapes)")
    p.add_argument("--cnn", default="timm:resnet18")
    p.add_argument("--vit", default="timm:vit_tiny_patch16_224")
    p.add_argument("--cnn-weights", help="a local timm checkpoint (else trained here)")
    p.add_argument("--vit-weights", help="a local timm checkpoint (else trained here)")
    p.add_argument("--cnn-point", default="layer3")
    p.add_argument("--vit-point", default="blocks.6")
    p.add_argument("--vit-depth", type=int, default=12, help="depth of a ViT trained here")
    p.add_argument("--n-train", type=int, default=5000, help="training images (generated)")
    p.add_argument("--n-stitch", type=int, default=1000)
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=8, help="epochs of models trained here")
    p.add_argument("--stitch-epochs", type=int, default=6)
    p.add_argument("--iri-steps", type=int, help="IRI steps (default: stitchlab's recipe)")
    p.add_argument(
        "--allow-flagged",
        action="store_true",
        help="train on IRIs that miss the quality limits (the smoke sizes do)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.allow_flagged = True
        args.n_train, args.n_stitch, args.n_test, args.epochs = 64, 24, 16, 1
        args.stitch_epochs, args.iri_steps, args.vit_depth = 1, 3, 2
        args.vit_point = "blocks.1"
    start = time.time()

    if args.data:
        folder = load_user_data(args.data, n_stitch=args.n_stitch, n_test=args.n_test)
        stitching, test, size = folder.stitch, folder.test, folder.image_size
        train_data = folder.stitch
    else:
        x, y = data.shapes(args.n_train, seed=0)
        train_data, stitching = (x, y), (x[: args.n_stitch], y[: args.n_stitch])
        test, size = data.shapes(args.n_test, seed=1), (32, 32)
    vit_options = {"img_size": size, "patch_size": 4, "depth": args.vit_depth}
    cnn = build(args.cnn, args.cnn_weights, {}, size, train_data, args.epochs, seed=0)
    vit = build(args.vit, args.vit_weights, vit_options, size, train_data, args.epochs, seed=1)
    cnn_point, vit_point = f"net.{args.cnn_point}", f"net.{args.vit_point}"

    recipe = sl.IRIRecipe() if args.iri_steps is None else sl.IRIRecipe(steps=args.iri_steps)
    protocols = [sl.Standard(), sl.InvarianceAware(recipe=recipe, allow_flagged=args.allow_flagged)]
    settings = TrainingConfig(epochs=args.stitch_epochs)
    identity = TrainingConfig(epochs=0)  # the least-squares stitch alone
    rows = []
    pairs = (("ViT -> ViT (least squares)", vit, vit_point), ("CNN -> ViT", cnn, cnn_point))
    for pair, front, point in pairs:
        st = sl.Stitcher(front, vit, point, vit_point)
        init = st.initialise(stitching)
        for protocol in protocols[:1] if front is vit else protocols:
            model = st.fit("slm", st.collect(stitching, protocol), init=init,
                           settings=settings if front is cnn else identity)  # fmt: skip
            scores = st.evaluate(model, test)
            layer = model.stitch_layer
            rows.append({"pair": pair, "front point": point[4:], "back point": vit_point[4:],
                         "formats": f"{layer.src.kind} -> {layer.dst.kind}",
                         "protocol": protocol.name, "agreement": scores["agreement"],
                         "hard": scores["hard_agreement"],
                         "accuracy": scores["accuracy"]})  # fmt: skip
    table = pd.DataFrame(rows)
    print(
        "SLM stitches into the ViT: agreement with it (soft; hard: equal decisions) "
        "and accuracy (%):"
    )
    print(table.round(1).to_string(index=False))
    print(f"({time.time() - start:.0f} s)")
    return table


if __name__ == "__main__":
    main()
