"""The self-contained HTML page: inline CSS, figures as base64 PNG, every text escaped."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       max-width: 1200px; margin: 2em auto; padding: 0 1.5em; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meta { color: #555; margin: 0.2em 0; }
.meta b { color: #222; }
nav ul { columns: 2; padding-left: 1.2em; }
figure { margin: 1em 0 2em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; font-size: 0.92em; margin-top: 0.4em; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.8em 0 1.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr:nth-child(even) td { background: #fafafa; }
.note { color: #555; font-size: 0.92em; }
.skipped li { color: #8a5a00; }
table.audio td { vertical-align: top; font-size: 0.85em; }
table.audio audio { width: 190px; height: 32px; display: block; }
"""


@dataclass
class FigureEntry:
    """A figure of the page: its PNG bytes and the paths of its files."""

    anchor: str
    title: str
    caption: str
    png: bytes
    files: list[str] = field(default_factory=list)


@dataclass
class TableEntry:
    """A table of the page, already formatted as text cells."""

    anchor: str
    title: str
    table: pd.DataFrame
    caption: str = ""
    numeric: Sequence[str] = ()


@dataclass
class AudioEntry:
    """A grid of audio players: ``rows`` of ``(label, [(wav bytes, caption), ...])``."""

    anchor: str
    title: str
    caption: str
    rows: Sequence[tuple[str, Sequence[tuple[bytes, str]]]]


def fmt(value: object, digits: int = 1) -> str:
    """A number with ``digits`` decimals, "—" for missing values; other values as text."""
    if value is None:
        return "—"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if isinstance(value, float) and math.isnan(value):
            return "—"
        if isinstance(value, int):
            return str(value)
        return f"{value:.{digits}f}"
    try:
        if pd.isna(value):  # type: ignore[arg-type]
            return "—"
    except (TypeError, ValueError):
        pass
    return str(value)


def html_table(df: pd.DataFrame, numeric: Sequence[str] = ()) -> str:
    """``df`` (cells already text or numbers) as an escaped HTML table."""
    head = "".join(f"<th>{escape(str(c))}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, row):
            cls = ' class="num"' if c in numeric else ""
            cells.append(f"<td{cls}>{escape(fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def page(
    title: str,
    meta: Sequence[tuple[str, str]],
    figures: Sequence[FigureEntry],
    tables: Sequence[TableEntry],
    skipped: Sequence[str],
    audio: Sequence[AudioEntry] = (),
) -> str:
    """The whole HTML document (audio players, as embedded WAV, after the figures)."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
    ]
    out += [f'<p class="meta"><b>{escape(k)}:</b> {escape(v)}</p>' for k, v in meta]
    toc = [(f.anchor, f.title) for f in figures] + [(a.anchor, a.title) for a in audio]
    toc += [(t.anchor, t.title) for t in tables]
    if skipped:
        toc.append(("skipped", "Not shown"))
    out.append("<nav><ul>")
    out += [f'<li><a href="#{escape(a)}">{escape(t)}</a></li>' for a, t in toc]
    out.append("</ul></nav>")
    for f in figures:
        data = base64.b64encode(f.png).decode("ascii")
        links = " ".join(f'<a href="{escape(p)}">{escape(p.rsplit(".", 1)[-1].upper())}</a>'
                         for p in f.files)  # fmt: skip
        out += [
            f'<section id="{escape(f.anchor)}"><h2>{escape(f.title)}</h2><figure>',
            f'<img src="data:image/png;base64,{data}" alt="{escape(f.title)}">',
            f"<figcaption>{escape(f.caption)} <span class='note'>Files: {links}</span>"
            "</figcaption></figure></section>",
        ]
    for a in audio:
        out += [f'<section id="{escape(a.anchor)}"><h2>{escape(a.title)}</h2>',
                f'<p class="note">{escape(a.caption)}</p><table class="audio"><tbody>']  # fmt: skip
        for label, clips in a.rows:
            cells = "".join(
                '<td><audio controls preload="none" src="data:audio/wav;base64,'
                f'{base64.b64encode(wav).decode("ascii")}"></audio>{escape(text)}</td>'
                for wav, text in clips
            )
            out.append(f"<tr><th>{escape(label)}</th>{cells}</tr>")
        out.append("</tbody></table></section>")
    for t in tables:
        out.append(f'<section id="{escape(t.anchor)}"><h2>{escape(t.title)}</h2>')
        if t.caption:
            out.append(f'<p class="note">{escape(t.caption)}</p>')
        out.append(html_table(t.table, t.numeric))
        out.append("</section>")
    if skipped:
        out.append('<section id="skipped"><h2>Not shown</h2><ul class="skipped">')
        out += [f"<li>{escape(s)}</li>" for s in skipped]
        out.append("</ul></section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def figure_files(fig: Any, folder: Path, name: str) -> bytes:
    """Save a matplotlib figure as ``folder/name.png`` and ``.pdf`` (atomically), close
    it, and return the PNG's bytes (for the page)."""
    import matplotlib.pyplot as plt

    from ..store import write_bytes

    folder.mkdir(parents=True, exist_ok=True)
    png, pdf = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
    fig.savefig(pdf, format="pdf", bbox_inches="tight")
    plt.close(fig)
    write_bytes(folder / f"{name}.png", png.getvalue())
    write_bytes(folder / f"{name}.pdf", pdf.getvalue())
    return png.getvalue()


def write_page(out: Path, html: str) -> Path:
    """Write ``out/report.html`` atomically; returns its path."""
    from ..store import write_text

    return write_text(Path(out) / "report.html", html)
