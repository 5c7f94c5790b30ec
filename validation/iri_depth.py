"""IRI error at every exact cut of a model: where along the network IRIs stop converging.

For each named model of an experiment config (from its store), generates IRIs with
stitchlab's default recipe (or ``--preset paper``, or ``v1``: the default before
December 2026, with which docs/validation/iri_convergence.md's depth table was made) for
the first ``--n`` stitching images at every exact cut (``stitch_points(model,
which="all")``, the logits excluded) and prints the median / p90 relative error after
uint8 quantisation, the null (the relative distance to another image's representation),
the IRIs' pixel RMS distance to their sources and the seconds. A jump in error that comes
with a jump in pixel distance marks the first point where the representation stops
determining the image.

    python validation/iri_depth.py CONFIG --store STORE --models seed1,back [--n 32]
"""

from __future__ import annotations

import time

from _common import model_and_images, model_study_args, script_commit

from stitchlab import generate_iris, stitch_points
from stitchlab.experiments import load_config, with_fingerprints


def main() -> None:
    args = model_study_args(__doc__)
    raw = with_fingerprints(load_config(args.config).raw)
    preset = {"preset": args.preset}
    print(f"commit {script_commit()}; {args.n} images; recipe {args.preset}")
    print("| model | point | median / p90 error | null | pixel RMS | seconds |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model, x = model_and_images(raw, args.store, name, args.n, args.config)
        for point in stitch_points(model, which="all")[:-1]:
            t0 = time.perf_counter()
            out = generate_iris(model, point, x, **preset)
            med, p90 = float(out.rel_error.median()), float(out.rel_error.quantile(0.9))
            print(
                f"| {name} | {point} | {med:.3f} / {p90:.3f} | "
                f"{float(out.null_error.median()):.2f} | {float(out.pixel_rms.median()):.3f} | "
                f"{time.perf_counter() - t0:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
