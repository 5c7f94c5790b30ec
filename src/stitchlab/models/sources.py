"""Models named by the user, each behind its own input pipeline.

A *model source* is what ``stitchlab compare`` reads as FRONT or BACK:

=====================  ===================================================================
``PATH``               a stitchlab checkpoint (``stitchlab train`` writes one)
``NAME``               a registry architecture (:func:`stitchlab.models.list_models`)
``torchvision:NAME``   a torchvision architecture
``timm:NAME``          a timm architecture
``hf:FOLDER``          a Hugging Face ``transformers`` image classifier saved with
                       ``save_pretrained`` (needs the optional ``transformers`` package)
=====================  ===================================================================

Weights come from local files only (safetensors, or a PyTorch state dict read with
``weights_only=True``; timm's and torchvision's checkpoint files as those libraries save
them). Nothing is downloaded. A name without weights is an error unless ``random_init``
is given, so a random network is never compared by accident. The number of classes is read
from the weights (the classifier's shape) unless given.

Every model reads images in [0, 1] at the data's size. :class:`InputSpec` is its own
pipeline, applied inside :class:`WithInput`: a bilinear (antialiased) resize to the size it
expects, then ``(x - mean) / std``. The pipeline comes from the model (timm's pretrained
config, torchvision's weight transforms, the Hugging Face image processor's config;
stitchlab's own models read [0, 1] pixels unnormalised) or from the caller. Because the
pipeline is part of the traced network, IRIs live in the shared [0, 1] pixel space and each
model sees them through its own resize and normalisation. torchvision's transforms resize
the shorter side and then crop; here the whole image is resized to the crop size (the data
is expected to be framed already).

Speech models (a ``stitchlab_input_shape`` of rank 2, ``(channels, samples)``: ``mel_cnn``,
``wave_cnn``) read mono waveforms in [-1, 1] instead: :class:`AudioSpec` is their pipeline
(a sample rate and a clip length, no normalisation), applied inside
:class:`WithAudioInput`: a windowed-sinc resampling from the data's rate to the model's
(:func:`stitchlab.data.speech.resample`'s filter, as one strided convolution) when they
differ, then zero padding or a centre crop to the model's clip length. IRIs of speech models
live in the shared waveform space.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import CheckpointError

__all__ = ["InputSpec", "WithInput", "AudioSpec", "WithAudioInput", "ModelSource",
           "load_model_source", "IMAGENET_MEAN", "IMAGENET_STD"]  # fmt: skip

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_PROBE_CLASSES = 977  # an unlikely class count, to find the classifier's tensors


@dataclass(frozen=True)
class InputSpec:
    """How a model reads an image: the ``(H, W)`` it expects (None: the data's own size)
    and the per-channel normalisation applied to [0, 1] pixels."""

    size: tuple[int, int] | None = None
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    source: str = "stitchlab: [0, 1] pixels, no normalisation"

    def __post_init__(self) -> None:
        if self.size is not None:
            size = tuple(int(s) for s in self.size)
            if len(size) != 2 or min(size) < 1:
                raise ValueError(f"an input size is (height, width) >= 1, got {self.size}")
            object.__setattr__(self, "size", size)
        mean = tuple(float(m) for m in self.mean)
        std = tuple(float(s) for s in self.std)
        if len(mean) != len(std) or not mean:
            raise ValueError(f"mean {mean} and std {std} need one value per channel")
        if min(std) <= 0:
            raise ValueError(f"std must be > 0, got {std}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def replace(
        self,
        size: int | Sequence[int] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> InputSpec:
        """This spec with the given parts overridden (``size`` an int means square)."""
        if size is None and mean is None and std is None:
            return self
        if isinstance(size, int):
            size = (size, size)
        return InputSpec(
            size=tuple(size) if size is not None else self.size,  # type: ignore[arg-type]
            mean=tuple(mean) if mean is not None else self.mean,
            std=tuple(std) if std is not None else self.std,
            source=f"{self.source}; overridden on the command line",
        )

    def __str__(self) -> str:
        size = "the data's size" if self.size is None else f"{self.size[0]}x{self.size[1]}"
        mean = ", ".join(f"{m:.3g}" for m in self.mean)
        std = ", ".join(f"{s:.3g}" for s in self.std)
        return f"{size}, mean ({mean}), std ({std}) [{self.source}]"


#: ITU-R 601-2 luma weights (Pillow's RGB -> "L"): greyscale images given as RGB (equal
#: channels) come back as their grey level.
LUMA = (0.299, 0.587, 0.114)


def input_channels(net: nn.Module) -> int | None:
    """The channels of the images ``net`` takes: its ``stitchlab_input_size``, else its
    first ``Conv2d``'s input channels (None when it has neither)."""
    size = getattr(net, "stitchlab_input_size", None)
    if isinstance(size, (tuple, list)) and len(size) == 3:
        return int(size[0])
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            return int(m.in_channels)
    return None


def for_channels(spec: InputSpec, channels: int | None, what: str = "the model") -> InputSpec:
    """``spec`` for a model of ``channels`` input channels: for a greyscale model (1
    channel) the RGB images are turned to grey (luma), and a normalisation given per RGB
    channel must be one value repeated (else a clear error)."""
    if channels != 1 or len(spec.mean) == 1:
        return spec
    if len(set(spec.mean)) != 1 or len(set(spec.std)) != 1:
        raise ValueError(
            f"{what} takes 1-channel (greyscale) images, but its normalisation has one value "
            f"per RGB channel (mean {spec.mean}, std {spec.std}); give the same value for "
            "every channel (e.g. --front-mean 0.5 0.5 0.5 --front-std 0.25 0.25 0.25)."
        )
    return InputSpec(spec.size, spec.mean[:1], spec.std[:1],
                     f"{spec.source}; RGB to grey (luma) for its 1 input channel")  # fmt: skip


class WithInput(nn.Module):
    """``net`` behind its input pipeline: RGB to grey for a 1-channel ``spec`` (luma),
    resize to ``spec.size`` (when the data's size differs), then normalise. Stitch points
    are the net's, prefixed ``net.``."""

    def __init__(
        self,
        net: nn.Module,
        spec: InputSpec,
        data_size: tuple[int, int],
        points: Sequence[str],
    ) -> None:
        super().__init__()
        self.net = net
        self.size = spec.size
        self.resize = spec.size is not None and tuple(spec.size) != tuple(data_size)
        c = len(spec.mean)
        # luma only for a model of 1 input channel (an RGB model given one mean and std
        # broadcasts them over its three channels, as before)
        self.grey = c == 1 and input_channels(net) == 1
        if self.grey:  # (a buffer only here: RGB models keep their fingerprints)
            self.register_buffer("luma", torch.tensor(LUMA).view(1, 3, 1, 1))
        self.register_buffer("mean", torch.tensor(spec.mean).view(1, c, 1, 1))
        self.register_buffer("std", torch.tensor(spec.std).view(1, c, 1, 1))
        self.stitchlab_points = [f"net.{p}" for p in points]
        self.stitchlab_wraps = "net"  # its pre_logits point is net.pre_logits

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        if self.grey:  # the data are RGB (greyscale files are read as equal channels)
            x = (x * self.luma).sum(1, keepdim=True)
        if self.resize:
            x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False,
                              antialias=True)  # fmt: skip
        return self.net((x - self.mean) / self.std)


@dataclass(frozen=True)
class AudioSpec:
    """How a speech model reads audio: mono waveforms in [-1, 1], no normalisation, at
    ``sample_rate`` Hz (None: not known yet), ``samples`` samples per clip."""

    sample_rate: int | None
    samples: int
    source: str = "stitchlab: waveforms in [-1, 1], no normalisation"

    def __post_init__(self) -> None:
        if self.sample_rate is not None and int(self.sample_rate) < 1:
            raise ValueError(f"a sample rate is >= 1 Hz, got {self.sample_rate}")
        if int(self.samples) < 1:
            raise ValueError(f"a clip has >= 1 samples, got {self.samples}")
        if self.sample_rate is not None:
            object.__setattr__(self, "sample_rate", int(self.sample_rate))
        object.__setattr__(self, "samples", int(self.samples))

    @property
    def seconds(self) -> float:
        """The clip length in seconds (needs the sample rate)."""
        if self.sample_rate is None:
            raise ValueError("the sample rate is not known")
        return self.samples / self.sample_rate

    def replace(self, sample_rate: int | None = None, seconds: float | None = None) -> AudioSpec:
        """This spec at another rate (the clip keeps its duration) and/or clip length."""
        if sample_rate is None and seconds is None:
            return self
        rate = sample_rate if sample_rate is not None else self.sample_rate
        if seconds is None:
            seconds = self.seconds if self.sample_rate is not None else None
        samples = self.samples if seconds is None or rate is None else round(seconds * rate)
        return AudioSpec(rate, max(1, samples), f"{self.source}; overridden on the command line")

    def __str__(self) -> str:
        if self.sample_rate is None:
            return f"{self.samples} samples at an unknown rate [{self.source}]"
        return (f"{self.samples} samples ({self.seconds:.3g} s) at {self.sample_rate} Hz, "
                f"waveforms in [-1, 1], no normalisation [{self.source}]")  # fmt: skip


class _Resample(nn.Module):
    """:func:`stitchlab.data.speech.resample` (the same windowed-sinc filter) as one strided
    ``conv1d``, differentiable and traceable: ``(N, C, length)`` at ``rate_in`` to
    ``(N, C, floor(length * rate_out / rate_in))`` at ``rate_out``.

    Output ``k * up + j`` (``up / down`` the reduced rate ratio) is filter phase
    ``j * down % up`` applied from input ``k * down + j * down // up``: one output channel
    per ``j``, each filter shifted by its offset, stride ``down``, interleaved.
    """

    _MAX_WEIGHTS = 1 << 24  # 64 MiB of filters: rates without a small common ratio

    def __init__(self, rate_in: int, rate_out: int, length: int) -> None:
        super().__init__()
        import numpy as np

        from ..data.speech import _polyphase

        up, down, taps, table = _polyphase(int(rate_in), int(rate_out), 16)
        width = len(taps) + down - 1
        if up * width > self._MAX_WEIGHTS:
            raise ValueError(
                f"resampling {rate_in} Hz to {rate_out} Hz inside the network needs a "
                f"{up} x {width} filter bank (the rates share no small ratio): resample the "
                f"data to {rate_out} Hz first, or pass a sample rate (--front-rate / "
                "--back-rate) both models can share."
            )
        weight = np.zeros((up, 1, width))
        for j in range(up):
            offset = (j * down) // up
            weight[j, 0, offset : offset + len(taps)] = table[(j * down) % up]
        self.up, self.down = up, down
        self.n_out = (int(length) * up) // down
        lead = -int(taps[0])  # the first tap reads this many samples before the output
        per_phase = -(-self.n_out // up)
        need = (per_phase - 1) * down + width
        self.padding = (lead, max(0, need - int(length) - lead))
        self.register_buffer("weight", torch.from_numpy(weight).float())

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        y = F.pad(x.flatten(0, 1).unsqueeze(1), self.padding)
        y = F.conv1d(y, self.weight, stride=self.down)  # (N * C, up, per phase)
        y = y.transpose(1, 2).flatten(1)[:, : self.n_out]
        return y.reshape(x.shape[0], x.shape[1], self.n_out)


class WithAudioInput(nn.Module):
    """``net`` behind its audio pipeline: waveforms of ``data_samples`` samples at
    ``data_rate`` resampled to ``spec.sample_rate`` (when the rates differ), then centred in
    ``spec.samples`` samples (zero padding or a centre crop, as the data loader fits clips).
    Stitch points are the net's, prefixed ``net.``."""

    def __init__(
        self,
        net: nn.Module,
        spec: AudioSpec,
        data_rate: int,
        data_samples: int,
        points: Sequence[str],
    ) -> None:
        super().__init__()
        from ..data.user import centre_padding

        if spec.sample_rate is None:
            raise ValueError("the model's sample rate is not known: pass it (--front-rate / "
                             "--back-rate)")  # fmt: skip
        self.net = net
        rate = spec.sample_rate
        self.resample = None if rate == data_rate else _Resample(data_rate, rate, data_samples)
        length = data_samples if self.resample is None else self.resample.n_out
        self.padding = centre_padding(length, spec.samples)  # negative: cropped
        # the pipeline in the state dict, so that a model fingerprint includes it
        self.register_buffer("pipeline", torch.tensor([data_rate, rate, data_samples,
                                                       spec.samples]))  # fmt: skip
        self.stitchlab_points = [f"net.{p}" for p in points]
        self.stitchlab_wraps = "net"

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        if self.resample is not None:
            x = self.resample(x)
        if self.padding != (0, 0):
            x = F.pad(x, self.padding)
        return self.net(x)


class _HFAdapter(nn.Module):
    """A ``transformers`` image classifier re-expressed as a chain of its own modules, so
    that torch.fx can trace it (the models' own ``forward`` checks shapes and dtypes in
    Python, which tracing cannot follow). The same modules, the same computation: the
    logits equal ``model(pixel_values=x).logits`` (tested). Families:

    * ``vit`` (ViT, DeiT): embeddings and every encoder layer (leaves), the final norm,
      the class token into the classifier; points ``layers.i`` and ``pre_logits``;
    * ``resnet``: embedder (a leaf), every stage, global pooling (flattened), the
      classifier;
    * ``convnext``: embeddings (a leaf), every stage, mean pooling and the final norm.
    """

    FAMILIES = {"ViTForImageClassification": "vit", "DeiTForImageClassification": "vit",
                "ResNetForImageClassification": "resnet",
                "ConvNextForImageClassification": "convnext"}  # fmt: skip

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        kind = self.FAMILIES.get(type(model).__name__)
        if kind is None:
            raise CheckpointError(
                f"hf: {type(model).__name__} is not a supported Hugging Face family; "
                f"supported: {', '.join(sorted(self.FAMILIES))}. Export the model to timm or "
                "torchvision weights, or wrap it as a module that torch.fx can trace."
            )
        self.family = kind
        self.config = model.config
        base = getattr(model, model.base_model_prefix)
        if kind == "vit":
            self.embeddings = base.embeddings
            self.layers = _first(base, "layers", "encoder.layer", "encoder.layers")
            self.norm = base.layernorm
        else:
            self.embeddings = base.embedder if kind == "resnet" else base.embeddings
            self.stages = _first(base, "stages", "encoder.stages")
            self.pool = base.pooler if kind == "resnet" else None
            self.norm = base.layernorm if kind == "convnext" else None
        self.classifier = model.classifier
        # leaves: the embedding (shape checks) and a transformer layer (its attention
        # unpacks shapes and returns tuples); their outputs are still points
        leaves = [type(self.embeddings)]
        if kind == "vit":
            leaves += list(dict.fromkeys(type(layer) for layer in self.layers))
        self.stitchlab_leaf_types = tuple(leaves)
        # a leaf's output layout cannot be followed through the graph: declared here
        if kind == "vit":
            self.stitchlab_layouts = {f"layers.{i}": "NLC" for i in range(len(self.layers))}
        else:
            self.stitchlab_layouts = {f"stages.{i}": "NCHW" for i in range(len(self.stages))}
        self.stitchlab_layouts["pre_logits"] = "NC"

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        h = self.embeddings(x)
        if self.family == "vit":
            for layer in self.layers:
                h = layer(h)
            return self.classifier(self.norm(h)[:, 0, :])
        for stage in self.stages:
            h = stage(h)
        if self.family == "resnet":  # its classifier flattens first: the same logits
            return self.classifier(self.pool(h).flatten(1))
        return self.classifier(self.norm(h.mean([-2, -1])))


def _first(module: nn.Module, *paths: str) -> nn.Module:
    """The first submodule found at one of ``paths`` (transformers versions move them)."""
    for path in paths:
        m = module
        try:
            for part in path.split("."):
                m = getattr(m, part)
        except AttributeError:
            continue
        return m
    raise CheckpointError(f"hf: {type(module).__name__} has none of {', '.join(paths)}; this "
                          "transformers version lays the model out differently.")  # fmt: skip


@dataclass
class ModelSource:
    """A loaded model and how to rebuild it: ``spec`` as given, ``kind`` (checkpoint,
    registry, torchvision, timm, hf), the architecture ``name``, the model (eval mode),
    its :class:`InputSpec` (an :class:`AudioSpec` for a speech model), its number of
    classes and the weights file."""

    spec: str
    kind: str
    name: str
    model: nn.Module
    input: InputSpec | AudioSpec
    num_classes: int
    weights: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    random: bool = False

    def random_twin(self, seed: int) -> nn.Module:
        """A freshly initialised model of the same architecture (the null's front)."""
        from . import create

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if self.kind == "hf":
                from transformers import AutoModelForImageClassification

                config = self.model.config  # type: ignore[union-attr]
                return _HFAdapter(AutoModelForImageClassification.from_config(config)).eval()
            return create(self.name, num_classes=self.num_classes, **self.options).eval()

    @property
    def modality(self) -> str:
        """``"audio"`` for a speech model (waveform input), else ``"image"``."""
        return "audio" if isinstance(self.input, AudioSpec) else "image"

    @property
    def leaf_modules(self) -> tuple[type, ...]:
        """Module classes torch.fx must not trace into (a Hugging Face embedding)."""
        return tuple(getattr(self.model, "stitchlab_leaf_types", ()))

    @property
    def layouts(self) -> dict[str, str]:
        """Activation layouts the model declares for points whose layout tracing cannot
        follow (the outputs of leaf modules)."""
        return dict(getattr(self.model, "stitchlab_layouts", {}))

    def points(self) -> list[str]:
        """The model's stitch points (:func:`stitchlab.stitch_points`)."""
        from ..splitting import stitch_points

        return stitch_points(self.model, leaf_modules=self.leaf_modules)

    def describe(self) -> str:
        """One line: what the model is and where its weights come from."""
        weights = "random weights (--random-init)" if self.random else (self.weights or "")
        return f"{self.spec} ({self.kind} {self.name}, {self.num_classes} classes, {weights})"


def load_model_source(
    spec: str,
    weights: str | None = None,
    *,
    random_init: bool = False,
    num_classes: int | None = None,
    options: dict[str, Any] | None = None,
) -> ModelSource:
    """Load ``spec`` (see the module docstring) with its weights and input pipeline."""
    from . import create, describe, is_known, load

    options = dict(options or {})
    if spec.startswith("hf:"):
        if weights is not None:
            raise ValueError(f"{spec}: a Hugging Face folder holds its own weights; drop the "
                             "weights file argument.")  # fmt: skip
        return _load_hf(spec, num_classes)
    path = Path(spec)
    if path.is_file():
        if weights is not None:
            raise ValueError(f"{spec} is a checkpoint file; a second weights file makes no sense.")
        desc = describe(path)
        if not desc.get("architecture"):
            raise CheckpointError(
                f"{spec!r} is a weights file without a stitchlab description; name the "
                "architecture instead, e.g. timm:resnet18 --front-weights " + spec
            )
        model = load(path, num_classes=num_classes)
        arch = desc["architecture"]
        return ModelSource(spec, "checkpoint", arch, model, _own_input(model, arch),
                           int(model.stitchlab_num_classes), str(path),
                           dict(desc.get("options") or {}))  # fmt: skip
    if not is_known(spec):
        raise ValueError(
            f"{spec!r} is neither a file nor a known model: give a stitchlab checkpoint, a "
            "registry name (stitchlab.models.list_models()), torchvision:NAME, timm:NAME or "
            "hf:FOLDER."
        )
    kind = spec.split(":", 1)[0] if ":" in spec else "registry"
    if weights is None:
        if not random_init:
            raise ValueError(
                f"{spec!r} is an architecture without weights: it would be a randomly "
                "initialised network. Pass its weights file (--front-weights / "
                "--back-weights; safetensors or a PyTorch state dict), or --random-init to "
                "compare random networks on purpose."
            )
        model = create(spec, num_classes=num_classes or 10, **options).eval()
        return ModelSource(spec, kind, spec, model, _own_input(model, spec),
                           num_classes or 10, None, options, random=True)  # fmt: skip
    from .checkpoint import read_weights

    tensors = read_weights(weights)
    k = num_classes if num_classes is not None else _classes_in(spec, tensors, options, weights)
    model = load(weights, architecture=spec, num_classes=k, **options)
    return ModelSource(spec, kind, spec, model, _own_input(model, spec), k, str(weights),
                       options)  # fmt: skip


def _classes_in(name: str, weights: dict[str, Tensor], options: dict, path: str) -> int:
    """The number of classes of ``weights``: the first dimension of the tensors that
    depend on it (found by building the architecture with an unlikely class count)."""
    from . import create

    try:
        with torch.device("meta"):
            probe = create(name, num_classes=_PROBE_CLASSES, **options)
    except Exception:  # an initialiser that does not run on meta tensors
        probe = create(name, num_classes=_PROBE_CLASSES, **options)
    for key, t in probe.state_dict().items():
        if t.dim() >= 1 and t.shape[0] == _PROBE_CLASSES and key in weights:
            return int(weights[key].shape[0])
    raise CheckpointError(
        f"cannot tell how many classes {path!r} has for {name}: no classifier tensor found "
        "in it; pass the number of classes (--front-num-classes / --back-num-classes)."
    )


def _own_input(model: nn.Module, name: str) -> InputSpec | AudioSpec:
    """The input pipeline a model's library documents for it."""
    shape = getattr(model, "stitchlab_input_shape", None)
    if shape is not None and len(shape) == 2:  # (channels, samples): a speech model
        rate = getattr(model, "sample_rate", None)
        rate = rate or (getattr(model, "stitchlab_options", None) or {}).get("sample_rate")
        return AudioSpec(rate, int(shape[-1]), "the model's own rate and clip length")
    if name.startswith("timm:"):
        import timm.data

        cfg = timm.data.resolve_model_data_config(model)
        _, h, w = cfg["input_size"]
        return InputSpec((int(h), int(w)), tuple(cfg["mean"]), tuple(cfg["std"]),
                         "timm's pretrained config")  # fmt: skip
    if name.startswith("torchvision:"):
        import torchvision

        arch = name.split(":", 1)[1]
        try:
            enum = list(torchvision.models.get_model_weights(arch))
        except (ValueError, KeyError):
            enum = []
        if enum:
            t = enum[0].transforms()
            crop = t.crop_size[0] if isinstance(t.crop_size, (list, tuple)) else t.crop_size
            return InputSpec((int(crop), int(crop)), tuple(t.mean), tuple(t.std),
                             f"torchvision's {enum[0]} transforms")  # fmt: skip
        return InputSpec(None, IMAGENET_MEAN, IMAGENET_STD,
                         "torchvision lists no weights for it: ImageNet statistics")  # fmt: skip
    from . import default_input_size

    size = default_input_size(model)
    return InputSpec(None if size is None else (size[1], size[2]))


def _load_hf(spec: str, num_classes: int | None) -> ModelSource:
    folder = Path(spec.split(":", 1)[1])
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"{spec}: {str(folder)!r} is not a Hugging Face model folder (no config.json); "
            "save one with model.save_pretrained(FOLDER)."
        )
    try:
        from transformers import AutoModelForImageClassification
    except ImportError as exc:
        raise ImportError(
            f"{spec} needs the transformers package: pip install 'stitchlab[hf]'"
        ) from exc
    model = AutoModelForImageClassification.from_pretrained(
        str(folder), local_files_only=True, use_safetensors=None
    )
    k = int(model.config.num_labels)
    if num_classes is not None and num_classes != k:
        raise ValueError(f"{spec} has {k} classes (config.num_labels), not {num_classes}")
    wrapped = _HFAdapter(model).eval()
    return ModelSource(spec, "hf", str(folder), wrapped, _hf_input(folder, model), k,
                       str(folder))  # fmt: skip


def _hf_input(folder: Path, model: nn.Module) -> InputSpec:
    """The image processor's size and normalisation (``preprocessor_config.json``), else
    the model config's image size and ImageNet statistics."""
    path = folder / "preprocessor_config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    size = cfg.get("size") or cfg.get("crop_size")
    if isinstance(size, dict):
        if "height" in size:
            size = (size["height"], size["width"])
        elif "shortest_edge" in size:
            size = (size["shortest_edge"],) * 2
        else:
            size = None
    elif isinstance(size, int):
        size = (size, size)
    if size is None:
        img = getattr(model.config, "image_size", None)
        size = (img, img) if isinstance(img, int) else None
    do_norm = cfg.get("do_normalize", True)
    mean = tuple(cfg.get("image_mean", IMAGENET_MEAN)) if do_norm else (0.0, 0.0, 0.0)
    std = tuple(cfg.get("image_std", IMAGENET_STD)) if do_norm else (1.0, 1.0, 1.0)
    source = "the Hugging Face image processor" if cfg else "the model config (no processor)"
    return InputSpec(size, mean, std, source)  # type: ignore[arg-type]


def fields_of(spec: InputSpec) -> dict[str, Any]:
    """The spec as plain values (for tables and store keys)."""
    return dataclasses.asdict(spec)
