"""The architecture table of docs/architectures.md, measured on the model-zoo tier's models.

For every model of ``tests/test_zoo.py`` (random weights, the tier's input sizes): the
number of default stitch points and of exact cuts, the layouts found at the default
points, points without a format (and why), whether train and eval mode trace to different
graphs, and at how many exact cuts the back copies the activation first because an
in-place op follows the point.

    python validation/zoo_table.py > /tmp/zoo.md
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from stitchlab.report import markdown_table  # noqa: E402
from stitchlab.splitting import TracedModel  # noqa: E402
from test_zoo import ZOO, _build  # noqa: E402


def _code(half: torch.nn.Module) -> str:
    return getattr(half, "code", None) or half.eval_graph.code  # one graph, or one per mode


def main() -> None:
    """Print the markdown table."""
    torch.set_num_threads(2)
    rows = []
    for name in ZOO:
        t0 = time.perf_counter()
        model, side, _ = _build(name)
        tm = TracedModel(model)
        points = tm.points()
        fmts = tm.formats(torch.rand(3, 3, side, side), points)
        layouts = Counter(f.spec.layout for f in fmts.values() if f.spec is not None)
        missing = [p for p, f in fmts.items() if f.spec is None]
        copies = sum("torch.clone" in _code(tm.split(p)[1]) for p in tm.all_points())
        rows.append({
            "model": name,
            "params (M)": f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}",
            "input": f"3x{side}x{side}",
            "default points": len(points),
            "exact cuts": len(tm.all_points()),
            "layouts (default points)": ", ".join(f"{k} {v}" for k, v in layouts.items()),
            "no format": len(missing),
            "first / last point": f"`{points[0]}` / `{points[-1]}`",
            "train/eval graphs differ": "yes" if not tm.same_in_both_modes else "no",
            "cuts whose back copies its input": copies,
            "seconds": f"{time.perf_counter() - t0:.1f}",
        })  # fmt: skip
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
