"""One registry, one contract: ``create(name, num_classes=..., **options)``.

Every model built here is a plain torchvision/timm module (so that
:func:`stitchlab.stitch_points` knows its paper points) or carries a
``stitchlab_points`` attribute listing its stitch points.

==========================  ================================================  =========
name                        what                                              points
==========================  ================================================  =========
``resnet18``                torchvision ResNet-18; ``stem="cifar"`` (3x3      9
                            stride-1 conv, no max-pool) or ``"imagenet"``;
                            ``width`` = channels of the first stage (64)
``vgg16_bn``                torchvision VGG-16-BN; ``width`` scales every     6
                            conv (64); ``head="cifar"`` pools to 1x1 and has
                            one Linear, ``"torchvision"`` the 3-layer head
``vit_tiny_patch4_32``      timm ViT, 32x32, patch 4, depth 12, heads 3,      13
                            ``width`` = embedding size (192)
``vit_base_patch16_224``    timm ViT-Base/16 at 224x224 (768, 12, 12)          7
``small_cnn``               a 4-block CNN for tests and demos, global pooling  4
                            after the last block (``width`` = 16)
==========================  ================================================  =========

Checkpoints: :func:`save` writes the weights as safetensors with a JSON description
(architecture, options, data, recipe, seed, accuracy, ...); :func:`load` rebuilds the
model from it without executing anything stored in the file.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "create",
    "is_known",
    "default_input_size",
    "register",
    "list_models",
    "SmallCNN",
    "save",
    "load",
    "describe",
    "read_weights",
    "classifier_head",
    "CheckpointError",
]

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Register a model factory under ``name``."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco


def list_models() -> list[str]:
    """The registered model names."""
    return sorted(_REGISTRY)


_LIBRARIES = ("torchvision:", "timm:")


def is_known(name: str) -> bool:
    """Whether :func:`create` can build ``name`` (registered, or ``torchvision:NAME`` /
    ``timm:NAME`` of an architecture that library lists)."""
    if name in _REGISTRY:
        return True
    if name.startswith("torchvision:"):
        import torchvision

        return name.split(":", 1)[1] in torchvision.models.list_models()
    if name.startswith("timm:"):
        import timm

        return timm.is_model(name.split(":", 1)[1])
    return False


def _torchvision_input_size(arch: str) -> tuple[int, int, int] | None:
    try:
        import torchvision

        weights = list(torchvision.models.get_model_weights(arch))
        size = weights[0].transforms().crop_size[0]
        return 3, int(size), int(size)
    except Exception:  # no weights listed for it: the caller chooses
        return None


def _create_from_library(name: str, num_classes: int, options: dict) -> nn.Module:
    lib, arch = name.split(":", 1)
    if not is_known(name):
        raise KeyError(
            f"Unknown {lib} architecture {arch!r}; see "
            + ("torchvision.models.list_models()" if lib == "torchvision" else "timm.list_models()")
        )
    try:
        if lib == "torchvision":
            import torchvision

            return torchvision.models.get_model(
                arch, weights=None, num_classes=num_classes, **options
            )
        import timm

        return timm.create_model(arch, pretrained=False, num_classes=num_classes, **options)
    except TypeError as exc:
        raise TypeError(f"Bad options for model {name!r}: {exc}") from exc


def create(name: str, num_classes: int = 10, **options) -> nn.Module:
    """Build model ``name`` with random weights (no download, ever).

    ``name`` is a registered name (:func:`list_models`), ``torchvision:NAME`` (any
    architecture of ``torchvision.models.list_models()``) or ``timm:NAME``; options go to
    the factory (``timm.create_model``'s ``img_size=``, ``depth=``, ...).
    """
    if name.startswith(_LIBRARIES):
        model = _create_from_library(name, num_classes, options)
        if name.startswith("torchvision:"):  # the input its weights' transforms expect
            model.stitchlab_input_size = _torchvision_input_size(name.split(":", 1)[1])
        model.stitchlab_name = name  # type: ignore[assignment]
        model.stitchlab_num_classes = num_classes  # type: ignore[assignment]
        model.stitchlab_options = dict(options)  # type: ignore[assignment]
        return model
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"Unknown model {name!r}.{hint} Available: {', '.join(list_models())}, or "
            "torchvision:NAME / timm:NAME for an architecture of those libraries."
        )
    try:
        model = _REGISTRY[name](num_classes=num_classes, **options)
    except TypeError as exc:
        raise TypeError(f"Bad options for model {name!r}: {exc}") from exc
    model.stitchlab_name = name  # type: ignore[assignment]
    model.stitchlab_num_classes = num_classes  # type: ignore[assignment]
    model.stitchlab_options = dict(options)  # type: ignore[assignment]
    return model


def _init_conv_bn(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)


@register("resnet18")
def resnet18(num_classes: int = 10, stem: str = "cifar", width: int = 64) -> nn.Module:
    """ResNet-18 (torchvision) with a CIFAR or ImageNet stem and a base width."""
    from torchvision.models.resnet import BasicBlock, ResNet

    if stem not in ("cifar", "imagenet"):
        raise ValueError(f"stem must be 'cifar' or 'imagenet', got {stem!r}")
    model = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes)
    if stem == "cifar" or width != 64:
        w = width
        model.inplanes = w
        if stem == "cifar":
            model.conv1 = nn.Conv2d(3, w, 3, 1, 1, bias=False)
            model.maxpool = nn.Identity()
        else:
            model.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        model.bn1 = nn.BatchNorm2d(w)
        model.layer1 = model._make_layer(BasicBlock, w, 2)
        model.layer2 = model._make_layer(BasicBlock, 2 * w, 2, stride=2)
        model.layer3 = model._make_layer(BasicBlock, 4 * w, 2, stride=2)
        model.layer4 = model._make_layer(BasicBlock, 8 * w, 2, stride=2)
        model.fc = nn.Linear(8 * w, num_classes)
        _init_conv_bn(model)
    return model


@register("vgg16_bn")
def vgg16_bn(num_classes: int = 10, width: int = 64, head: str = "cifar") -> nn.Module:
    """VGG-16-BN (torchvision); ``width`` scales all convolutions (64 is the original)."""
    from torchvision.models.vgg import VGG, cfgs, make_layers

    cfg = [c if c == "M" else int(c) * width // 64 for c in cfgs["D"]]
    model = VGG(make_layers(cfg, batch_norm=True), num_classes=num_classes)
    if head == "cifar":
        model.avgpool = nn.AdaptiveAvgPool2d(1)
        model.classifier = nn.Linear(8 * width, num_classes)
    elif head != "torchvision":
        raise ValueError(f"head must be 'cifar' or 'torchvision', got {head!r}")
    return model


def _vit(img_size: int, patch: int, dim: int, depth: int, heads: int, num_classes: int):
    from timm.models.vision_transformer import VisionTransformer

    if dim % heads:
        raise ValueError(f"width {dim} must be divisible by the number of heads {heads}")
    return VisionTransformer(
        img_size=img_size,
        patch_size=patch,
        embed_dim=dim,
        depth=depth,
        num_heads=heads,
        num_classes=num_classes,
    )


@register("vit_tiny_patch4_32")
def vit_tiny_patch4_32(
    num_classes: int = 10, width: int = 192, depth: int = 12, heads: int = 3
) -> nn.Module:
    """ViT-Tiny/4 for 32x32 images (timm)."""
    return _vit(32, 4, width, depth, heads, num_classes)


@register("vit_base_patch16_224")
def vit_base_patch16_224(
    num_classes: int = 100, width: int = 768, depth: int = 12, heads: int = 12
) -> nn.Module:
    """ViT-Base/16 for 224x224 images (timm)."""
    return _vit(224, 16, width, depth, heads, num_classes)


def conv_blocks(in_channels: int, widths: list[int], strides: tuple[int, ...]) -> nn.Sequential:
    """One 3x3 Conv (no bias) - BatchNorm - ReLU block per width, with its stride."""
    blocks, c_in = [], in_channels
    for c, stride in zip(widths, strides, strict=True):
        blocks.append(nn.Sequential(nn.Conv2d(c_in, c, 3, stride=stride, padding=1, bias=False),
                                    nn.BatchNorm2d(c), nn.ReLU(inplace=True)))  # fmt: skip
        c_in = c
    return nn.Sequential(*blocks)


class SmallCNN(nn.Module):
    """Four conv blocks (conv-BN-ReLU, stride 2 from the second), global pooling, Linear.

    Stitch points: ``blocks.0`` .. ``blocks.3`` (32x32 input: 32, 16, 8, 4 pixels).
    """

    def __init__(self, num_classes: int = 10, width: int = 16, in_channels: int = 3) -> None:
        super().__init__()
        chans = [width, 2 * width, 4 * width, 4 * width]
        self.blocks = conv_blocks(in_channels, chans, strides=(1, 2, 2, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(chans[-1], num_classes)
        self.stitchlab_points = [f"blocks.{i}" for i in range(len(chans))]
        _init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return self.fc(torch.flatten(self.pool(self.blocks(x)), 1))


@register("small_cnn")
def small_cnn(num_classes: int = 10, width: int = 16, in_channels: int = 3) -> nn.Module:
    """The small CNN of tests and demos."""
    return SmallCNN(num_classes, width, in_channels)


def default_input_size(model: nn.Module) -> tuple[int, int, int] | None:
    """``(C, H, W)`` the model expects, when it says (timm's ``pretrained_cfg``, a
    torchvision ViT/Swin ``image_size``), else None."""
    img = (getattr(model, "stitchlab_options", None) or {}).get("img_size")
    if isinstance(img, (tuple, list)) and len(img) == 2:
        return 3, int(img[0]), int(img[1])
    if isinstance(img, int):  # built with img_size=
        return 3, img, img
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    if isinstance(cfg, dict) and cfg.get("input_size"):
        c, h, w = cfg["input_size"]
        img = getattr(getattr(model, "patch_embed", None), "img_size", None)
        if isinstance(img, (tuple, list)) and len(img) == 2:
            h, w = img  # built with another img_size than the pretrained default
        return int(c), int(h), int(w)
    size = getattr(model, "image_size", None)
    if isinstance(size, int):
        return 3, size, size
    return getattr(model, "stitchlab_input_size", None)


def classifier_head(model: nn.Module) -> tuple[str, nn.Linear]:
    """``(attribute name, Linear)`` of the final classifier of a registry model.

    ResNet and SmallCNN: ``fc``; VGG with the CIFAR head: ``classifier``; timm ViT: ``head``.
    """
    for name in ("fc", "head", "classifier"):
        layer = getattr(model, name, None)
        if isinstance(layer, nn.Linear):
            return name, layer
    raise ValueError(
        f"{type(model).__name__} has no single Linear classifier (fc, head or classifier); "
        "use a model with a linear head (for vgg16_bn: head='cifar')."
    )


from . import audio as _audio  # noqa: E402, F401  (registers mel_cnn, wave_cnn)
from .checkpoint import CheckpointError, describe, load, read_weights, save  # noqa: E402
