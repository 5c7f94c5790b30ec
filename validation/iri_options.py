"""IRI quality of recipe options at stored fronts: one quick row per (front, point, options).

For each ``FRONT:POINT`` cell of an experiment config (models from its store) and each
set of IRI recipe options (any :class:`stitchlab.IRIRecipe` field or ``preset``, over
stitchlab's default), generates IRIs of the front's first ``--n`` stitching images (with
its marker) and prints the median / p90 relative error after storage quantisation, the
median pixel RMS distance to the sources, the null and the seconds. For trying an option
at the cells where a recipe misses, e.g. more steps, another ReLU gradient or start:

    python validation/iri_options.py configs/cpu/a_smooth_3fronts.toml --store runs/store \\
        --cells shortcut3:layer2.1,seed1:layer2.1 \\
        --options "steps=180;steps=360;relu_width=0.1;start='image', steps=0"

Options are ``;``-separated sets of ``name=value`` pairs separated by ``,``; values are
Python literals without commas (``0.1``, ``'image'``, ``None``), a bare word is a string.
The empty set is the default recipe.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _common import model_and_images, script_commit

from stitchlab import generate_iris
from stitchlab.cli import parse_key_values
from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.iris import IRIRecipe
from stitchlab.report import markdown_table


def parse_options(text: str) -> dict:
    """``"steps=360, start='image'"`` -> ``{"steps": 360, "start": "image"}``, checked
    against :class:`IRIRecipe` (an unknown name or bad value is a SystemExit)."""
    try:
        out = parse_key_values(filter(None, (p.strip() for p in text.split(","))), "--options")
        IRIRecipe.from_kwargs(**out)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"bad IRI options {text!r}: {e}") from None
    return out


def rows(raw: dict, store: Path, cells: list[tuple[str, str]], options: list[dict], n: int):
    """One row per (cell, options): the quality of ``generate_iris`` with those options."""
    for front, point in cells:
        model, x = model_and_images(raw, store, front, n)
        for kw in options:
            t0 = time.perf_counter()
            q = generate_iris(model, point, x, **kw).quality()
            yield {
                "front": front, "point": point,
                "options": ", ".join(f"{k}={v!r}" for k, v in kw.items()) or "(default)",
                "median / p90 error": f"{q.median_error:.4f} / {q.p90_error:.4f}",
                "pixel RMS": f"{q.median_pixel_rms:.3f}",
                "null": f"{q.null_median:.3f}" if q.null_median is not None else "-",
                "seconds": f"{time.perf_counter() - t0:.1f}",
            }  # fmt: skip


def main() -> None:
    """Parse the arguments and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--cells", required=True, help="FRONT:POINT,... of the config's models")
    ap.add_argument("--options", default="", help="';'-separated option sets (see above)")
    ap.add_argument("--n", type=int, default=32, help="stitching images (default 32)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cells = []
    for c in args.cells.split(","):
        front, sep, point = c.partition(":")
        if not sep:
            raise SystemExit(f"cell {c!r} is not FRONT:POINT")
        cells.append((front, point))
    options = [parse_options(t) for t in args.options.split(";")]
    raw = with_fingerprints(load_config(args.config).raw)
    print(f"commit {script_commit()}; {args.config}; {args.n} images; {args.threads} threads")
    print(markdown_table(list(rows(raw, args.store, cells, options, args.n))))


if __name__ == "__main__":
    main()
