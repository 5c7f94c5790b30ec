"""Render a ``stitchlab compare`` report in a real browser (headless Chromium) and check it.

Without ``--dir`` it first runs a small comparison (two timm models with random weights
saved to files, a generated image folder, ``--quick``) into a temporary folder. Then it
loads ``report.html`` in headless Chromium (Debian's ``chromium`` package), takes a
full-page screenshot (written outside the repository, ``--screenshot``), and checks:

* the browser's DOM after loading has the figures (``<img>`` with PNG data) and the table;
* every embedded image decodes (Pillow) and is not blank;
* the screenshot is not blank (at least 3% of its pixels differ from the background).

    python validation/compare_browser.py [--dir RUN] [--screenshot /tmp/compare_report.png]
"""

from __future__ import annotations

import argparse
import base64
import io
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image


def _small_run(root: Path) -> Path:
    import timm
    import torch
    from safetensors.torch import save_file

    from stitchlab.cli import main

    g = np.random.default_rng(0)
    for k, name in enumerate("abc"):
        (root / "imgs" / name).mkdir(parents=True)
        for i in range(24):
            img = g.integers(0, 60, size=(32, 32, 3)).astype(np.uint8)
            img[..., k] += 150
            Image.fromarray(img).save(root / "imgs" / name / f"{i}.png")
    weights = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = timm.create_model("test_convnext", pretrained=False, num_classes=3)
        weights.append(root / f"m{seed}.safetensors")
        save_file(m.state_dict(), str(weights[-1]))
    out = root / "run"
    rc = main(["compare", "timm:test_convnext", "timm:test_convnext", "--front-weights",
               str(weights[0]), "--back-weights", str(weights[1]), "--data",
               str(root / "imgs"), "--out", str(out), "--quick", "--front-size", "32",
               "--back-size", "48", "--no-progress"])  # fmt: skip
    if rc:
        sys.exit(f"the comparison failed (exit {rc})")
    return out


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no Chromium found: apt-get install chromium")


def _not_blank(img: Image.Image, what: str, min_fraction: float) -> float:
    a = np.asarray(img.convert("RGB")).astype(int)
    background = a[0, 0]
    fraction = float((np.abs(a - background).sum(axis=2) > 30).mean())
    status = "ok" if fraction >= min_fraction else "BLANK"
    print(f"  {what}: {img.size[0]}x{img.size[1]}, {100 * fraction:.1f}% non-background "
          f"pixels [{status}]")  # fmt: skip
    return fraction


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="a compare output folder (default: run one)")
    p.add_argument("--screenshot", default="/tmp/stitchlab_compare_report.png")
    args = p.parse_args()
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory()
        run = _small_run(Path(tmp.name))
    else:
        run = Path(args.dir)
    report = (run / "report.html").resolve()
    browser = _chromium()
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--allow-file-access-from-files"]  # fmt: skip
    dom = subprocess.run([browser, *flags, "--dump-dom", report.as_uri()], capture_output=True,
                         text=True, timeout=120).stdout  # fmt: skip
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', dom)
    tables = dom.count("<table")
    print(f"{report}: the browser's DOM has {len(images)} images and {tables} tables")
    failures = []
    if not images or not tables:
        failures.append("figures or table missing from the rendered DOM")
    for i, data in enumerate(images):
        img = Image.open(io.BytesIO(base64.b64decode(data)))
        if _not_blank(img, f"figure {i + 1}", 0.03) < 0.03:
            failures.append(f"figure {i + 1} is blank")
    height = 900 + 700 * len(images) + 40 * dom.count("<tr")
    subprocess.run([browser, *flags, f"--screenshot={args.screenshot}",
                    f"--window-size=1280,{height}", report.as_uri()], capture_output=True,
                   timeout=120, check=True)  # fmt: skip
    shot = Image.open(args.screenshot)
    if _not_blank(shot, f"screenshot {args.screenshot}", 0.03) < 0.03:
        failures.append("the screenshot is blank")
    version = subprocess.run([browser, "--version"], capture_output=True, text=True).stdout
    print(f"browser: {version.strip()}")
    if tmp is not None:
        tmp.cleanup()
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print("the report renders: figures and tables present, nothing blank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
