"""The point catalogue: the points of known architectures (the paper's, see
docs/method.md section 1, or a model's declared ``stitchlab_points``), the repeated
blocks that make the default points of any other model, and the error for a name that
is no point."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from torch import nn

from ..layouts import _FIRST_MODULES
from ._outputs import SplitError

#: The point before the classifier head: the feature vector the head reads.
PRE_LOGITS = "pre_logits"


def _paper_points(model: nn.Module) -> list[str] | None:
    """The paper's stitch points for torchvision ResNets, VGG-BN and timm ViTs."""
    try:
        from torchvision.models import VGG, ResNet
    except Exception:  # pragma: no cover
        ResNet = VGG = ()  # type: ignore[assignment]
    if ResNet and isinstance(model, ResNet):
        pts = ["relu"]
        for layer in ("layer1", "layer2", "layer3", "layer4"):
            pts += [f"{layer}.{i}" for i in range(len(getattr(model, layer)))]
        return pts
    if VGG and isinstance(model, VGG):
        # the ReLU after the last conv of each stage, plus after conv1_1
        feats = list(model.features)
        relus = [i for i, m in enumerate(feats) if isinstance(m, nn.ReLU)]
        stage_ends = [i - 1 for i, m in enumerate(feats) if isinstance(m, nn.MaxPool2d)]
        pts = [relus[0]] + [i for i in stage_ends if i in relus]
        return [f"features.{i}" for i in sorted(set(pts))]
    try:
        from timm.models.vision_transformer import VisionTransformer
    except Exception:  # pragma: no cover
        VisionTransformer = ()  # type: ignore[assignment]
    if VisionTransformer and isinstance(model, VisionTransformer):
        depth = len(model.blocks)
        patch = model.patch_embed.patch_size[0]
        every = 2 if (model.embed_dim >= 768 and patch >= 16 and depth == 12) else 1
        # distilled ViTs (DeiT) read two tokens: no single feature vector before the heads
        last = "norm" if getattr(model, "head_dist", None) is not None else PRE_LOGITS
        return [f"blocks.{i}" for i in range(0, depth, every)] + [last]
    return None


def _sequential_points(model: nn.Sequential) -> list[str]:
    return [name for name, _ in model.named_children()][:-1]  # not after the last child


_LAYER_TYPES = (*_FIRST_MODULES, nn.Linear, nn.LayerNorm)


def _block_names(model: nn.Module) -> set[str]:
    """Modules that are blocks: in a list of two or more siblings of their class, and
    more than a plain chain of layers (ResNet ``layer1.0``, Swin ``features.1.0``, MaxViT
    ``blocks.0.layers.1``; not a conv-norm-activation ``nn.Sequential``)."""
    blocks: set[str] = set()
    for parent_name, parent in model.named_modules():
        children = list(parent.named_children())
        counts: dict[type, int] = {}
        for _, c in children:
            counts[type(c)] = counts.get(type(c), 0) + 1
        for name, c in children:
            grandchildren = list(c.children())
            chain = isinstance(c, (nn.Sequential, nn.ModuleList)) and not any(
                any(True for _ in g.children()) for g in grandchildren
            )
            chain = chain or isinstance(c, _LAYER_TYPES)  # timm's BatchNormAct2d, ...
            if counts[type(c)] >= 2 and grandchildren and not chain:
                blocks.add(f"{parent_name}.{name}" if parent_name else name)
    return blocks


def _closest(name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.0)
    return close[0] if close else ""


def _unknown_point(name: str, valid: Sequence[str], why: str | None = None) -> SplitError:
    closest = _closest(name, valid) if not why else ""
    reason = f" It is not a cut point: {why}." if why else ""
    hint = f" Did you mean {closest!r}?" if closest else ""
    if not valid:
        return SplitError(
            f"Unknown stitch point {name!r}: the model has no stitch points. stitchlab cuts "
            "at the outputs of submodules (torch.fx traces their calls), and this model's "
            "forward calls none, or only its output layer (functional code such as F.conv2d "
            "with its own parameters has no names to cut at). Wrap the layers in nn.Module "
            "attributes (nn.Conv2d, nn.Sequential, ...)."
        )
    return SplitError(
        f"Unknown stitch point {name!r}.{reason}{hint} Valid points: {', '.join(valid)}"
    )


def _known_points(model: nn.Module) -> list[str] | None:
    """Points declared by the model (``stitchlab_points``) or the paper's, else None."""
    declared = getattr(model, "stitchlab_points", None)
    if declared is not None:  # a model may declare its points (the registry's contract)
        return list(declared)
    return _paper_points(model)
