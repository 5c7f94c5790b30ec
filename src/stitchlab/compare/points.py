"""Which points to stitch: the front's points matched to the back's by relative depth, a
grid, or named pairs."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["match_points"]

def _depths(points: Sequence[str]) -> list[float]:
    n = len(points)
    return [(i + 1) / n for i in range(n)]


def _spread(points: Sequence[str], k: int) -> list[str]:
    """``k`` points spread evenly over the depth (always the last one)."""
    n = len(points)
    if k >= n:
        return list(points)
    idx = sorted({round((j + 1) * n / k) - 1 for j in range(k)})
    return [points[i] for i in idx]


def match_points(
    front_points: Sequence[str],
    back_points: Sequence[str],
    mode: str | Sequence[str] = "depth",
    n_points: int = 5,
) -> list[tuple[str, str]]:
    """The ``(front point, back point)`` cells to stitch (see the module docstring).

    ``depth``: ``n_points`` front points spread over the depth, each with the back point
    of the nearest relative depth; ``grid``: ``n_points`` of each, every combination; a
    list: ``"p"`` (the same name in both) or ``"p:q"``.
    """
    fd = dict(zip(front_points, _depths(front_points)))
    bd = dict(zip(back_points, _depths(back_points)))
    if mode == "grid":
        return [(f, b) for f in _spread(front_points, n_points)
                for b in _spread(back_points, n_points)]  # fmt: skip
    if mode == "depth":
        cells = []
        for f in _spread(front_points, n_points):
            b = min(back_points, key=lambda p: (abs(bd[p] - fd[f]), -bd[p]))
            cells.append((f, b))
        return cells
    if isinstance(mode, str):
        raise ValueError(f"points must be 'depth', 'grid' or a list, got {mode!r}")
    cells = []
    for item in mode:
        f, _, b = item.partition(":")
        b = b or f
        for name, valid, side in ((f, front_points, "front"), (b, back_points, "back")):
            if name not in valid:
                import difflib

                close = difflib.get_close_matches(name, valid, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{name!r} is not a stitch point of the {side} model.{hint} "
                                 f"Its points: {', '.join(valid)}")  # fmt: skip
        cells.append((f, b))
    return cells

