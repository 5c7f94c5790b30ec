"""The two models of a comparison behind their input pipelines, and the data they read."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..models.sources import ModelSource, _own_input
from .settings import CompareSettings


@dataclass
class _Side:
    source: Any  # ModelSource
    model: nn.Module  # behind its input pipeline
    points: list[str]  # the model's own point names
    fingerprint: str
    wrap: Callable[[nn.Module], nn.Module]  # a net of this architecture behind the pipeline


class _Unlabelled(Dataset):
    """Labels -1 shown as 0 (the stitching code checks labels; nothing here reads them)."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        x, _ = self.inner[i]
        return x, 0


def _source(s: CompareSettings, side: str):
    """The front's or back's ModelSource (a registry speech model built at ``*_rate``)."""
    import inspect

    from ..models import _REGISTRY
    from ..models.sources import load_model_source

    spec, rate = getattr(s, side), getattr(s, f"{side}_rate")
    options = {}
    if rate is not None and spec in _REGISTRY and (
            "sample_rate" in inspect.signature(_REGISTRY[spec]).parameters):  # fmt: skip
        options["sample_rate"] = rate
    return load_model_source(spec, getattr(s, f"{side}_weights"), random_init=s.random_init,
                             num_classes=getattr(s, f"{side}_num_classes"),
                             options=options)  # fmt: skip


def _modality(s: CompareSettings, front, back) -> str:
    """``"audio"`` or ``"image"``: what both models read (an error when they differ, or when
    options of the other modality are given)."""
    if front.modality != back.modality:
        audio, image = (front, back) if front.modality == "audio" else (back, front)
        raise ValueError(
            f"{audio.spec} is a speech model (it reads waveforms) and {image.spec} an image "
            "model: compare needs two models that read the same kind of input (two speech "
            "models on audio data, or two image models on images)."
        )
    if front.modality == "audio":
        given = [n for n in ("front_size", "back_size", "front_mean", "front_std", "back_mean",
                             "back_std", "image_size") if getattr(s, n) is not None]  # fmt: skip
        if given:
            raise ValueError(
                f"{', '.join(given)}: image options, but both models read audio; "
                "for speech models give front_rate/back_rate or clip_seconds."
            )
    else:
        given = [n for n in ("front_rate", "back_rate", "clip_seconds") if getattr(s, n)]
        if given:
            raise ValueError(
                f"{', '.join(given)}: audio options, but both models read images "
                "(front_size/back_size, the means and stds are theirs)."
            )
    return front.modality


def _audio_spec(s: CompareSettings, source, side: str):
    """A speech model's AudioSpec: its own rate (or ``*_rate``) and clip length (or
    ``clip_seconds``)."""
    spec, rate = source.input, getattr(s, f"{side}_rate")
    if rate is not None and spec.sample_rate not in (None, rate):
        raise ValueError(
            f"{source.spec} reads {spec.sample_rate} Hz audio (its own setting), not the "
            f"{rate} Hz of --{side}-rate: drop --{side}-rate, or give a model built at "
            f"{rate} Hz."
        )
    if rate is None and spec.sample_rate is None:
        raise ValueError(f"cannot tell the sample rate {source.spec} reads: pass it "
                         f"(--{side}-rate HZ, {side}_rate in a config).")  # fmt: skip
    if rate is None and s.clip_seconds is None:
        return spec
    return spec.replace(sample_rate=rate or spec.sample_rate, seconds=s.clip_seconds)


def _side(source, spec, wrap) -> _Side:
    from ..iris.store import model_fingerprint

    source.input = spec
    points = source.points()

    def wrapped(net: nn.Module) -> nn.Module:
        return wrap(net, points).eval()

    model = wrapped(source.model)
    return _Side(source, model, points, model_fingerprint(model), wrapped)


def _sides(s: CompareSettings, front_source, back_source,
           read: Callable[..., Any] | None = None) -> tuple[Any, _Side, _Side]:  # fmt: skip
    """Load the data for the two models (images, or audio at the models' rate and length)
    with ``read`` (:func:`~stitchlab.data.user.load_user_data`'s keywords; default: from
    the path ``s.data``) and put each model behind its input pipeline."""
    data, front, back = _loaded_sides(s, front_source, back_source, read)
    for side in (front, back):
        if side.source.num_classes == 0:  # an nn.Module: its logits' width
            from torch.utils.data import Subset

            from .._data import predict

            with torch.no_grad():
                logits = predict(side.model, Subset(data.stitch, [0]))[0]
            side.source.num_classes = int(logits.shape[-1])
    return data, front, back


def _loaded_sides(s: CompareSettings, front_source, back_source, read) -> tuple[Any, _Side, _Side]:
    from ..data.user import load_user_data

    if read is None:
        def read(**kw: Any):
            return load_user_data(s.data, **kw)
    from ..models.sources import WithAudioInput, WithInput, for_channels, input_channels

    common = dict(test_fraction=s.test_fraction, seed=s.data_seed, n_stitch=s.n_stitch,
                  n_test=s.n_test)  # fmt: skip
    if _modality(s, front_source, back_source) == "audio":
        specs = _audio_spec(s, front_source, "front"), _audio_spec(s, back_source, "back")
        rate = max(spec.sample_rate for spec in specs)
        samples = max(round(spec.seconds * rate) for spec in specs)
        data = read(audio=True, sample_rate=rate, samples=samples, **common)

        def wrap_for(spec):
            return lambda net, points: WithAudioInput(net, spec, rate, samples, points)

        return data, *(_side(src, spec, wrap_for(spec)) for src, spec in
                       zip((front_source, back_source), specs))  # fmt: skip
    data = read(size=s.image_size, **common)
    if data.modality == "audio":
        raise ValueError(
            f"{s.data} holds audio clips, but {front_source.spec} and {back_source.spec} are "
            "image models: compare speech models (mel_cnn, wave_cnn, ...) on audio."
        )
    sides = []
    for src, size, mean, std in ((front_source, s.front_size, s.front_mean, s.front_std),
                                 (back_source, s.back_size, s.back_mean, s.back_std)):  # fmt: skip
        spec = for_channels(src.input.replace(size=size, mean=mean, std=std),
                            input_channels(src.model), src.spec)  # fmt: skip

        def wrap(net, points, spec=spec):
            return WithInput(net, spec, data.image_size, points)

        sides.append(_side(src, spec, wrap))
    return data, sides[0], sides[1]


def _leaves(front: _Side, back: _Side) -> tuple[type, ...]:
    """The leaf modules both models declare (each class once), for tracing a cell."""
    return tuple(dict.fromkeys(front.source.leaf_modules + back.source.leaf_modules))


def _null_front(front: _Side, seed: int, cache: dict[int, nn.Module]) -> nn.Module:
    """Null front ``seed``: a random twin of the front (initialised with ``10_000 +
    seed``) inside its input pipeline, built once per ``cache``."""
    if seed not in cache:
        cache[seed] = front.wrap(front.source.random_twin(10_000 + seed))
    return cache[seed]


def _back_logits(model: nn.Module, test: Dataset, device: str) -> Tensor:
    from .._data import predict

    model.to(device)
    with torch.no_grad():
        return predict(model, test, device=torch.device(device))[0]


def _recipe(s: CompareSettings, modality: str):
    """The IRI recipe: stitchlab's image default, or the ``audio`` preset for waveforms
    (the box (-1, 1), a quiet Gaussian start, int16 storage); ``iri_steps`` if given."""
    from ..iris import IRIRecipe

    steps = {} if s.iri_steps is None else {"steps": s.iri_steps}
    return IRIRecipe.from_kwargs(preset="audio" if modality == "audio" else "default", **steps)


def _layouts(front: _Side, back: _Side, f: str, b: str) -> tuple[dict | None, dict | None]:
    """The layouts the two models declare for the cell's points (``net.``-prefixed)."""

    def one(side: _Side, point: str) -> dict[str, str] | None:
        layout = side.source.layouts.get(point)
        return None if layout is None else {f"net.{point}": layout}

    return one(front, f), one(back, b)




# ---------------------------------------------------------------------------
# In memory: nn.Modules and tensors (stitchlab.compare)


class _ModuleSource(ModelSource):
    """An ``nn.Module`` given in Python, as a model source: it reads [0, 1] pixels at the
    data's size without normalisation (or waveforms, when it declares
    ``stitchlab_input_shape = (channels, samples)``); its null fronts are copies with every
    parameter reset by its module's ``reset_parameters``."""

    def random_twin(self, seed: int) -> nn.Module:
        """A copy with every module's ``reset_parameters()`` called under ``seed``."""
        twin = copy.deepcopy(self.model)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for m in twin.modules():
                if callable(getattr(m, "reset_parameters", None)):
                    m.reset_parameters()
        return twin.eval()

    def describe(self) -> str:
        """One line: what the model is."""
        return f"{self.spec}: an nn.Module given in Python"


def module_source(model: nn.Module, side: str, null: bool) -> ModelSource:
    """The source of an ``nn.Module`` given in Python: a copy (the caller's module is never
    moved or put in eval mode). A model built by :func:`stitchlab.models.create` is read
    as its name is on the command line (its input pipeline; its null built by ``create``);
    any other reads [0, 1] pixels at the data's size, its classes counted on the data, its
    null a copy reset by ``reset_parameters``. With ``null``, a module whose null cannot
    be built that way is refused: parameters held by a module without
    ``reset_parameters`` would keep their trained values."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{side} must be an nn.Module or a model spec (a checkpoint, "
                        f"registry name, timm:NAME, ...), got {type(model).__name__}")  # fmt: skip
    net = copy.deepcopy(model).cpu().eval()
    name = getattr(net, "stitchlab_name", None)
    if name is not None:  # built by stitchlab.models.create: rebuilt as its name is
        return ModelSource(f"{side} ({name})", "module", name, net, _own_input(net, name),
                           int(net.stitchlab_num_classes), None,
                           dict(getattr(net, "stitchlab_options", None) or {}))  # fmt: skip
    kept = [f"{mname}.{pname}" if mname else pname
            for mname, m in net.named_modules()
            if not callable(getattr(m, "reset_parameters", None))
            for pname, _ in m.named_parameters(recurse=False)]  # fmt: skip
    if kept and null:
        raise ValueError(
            f"the null needs a randomly initialised copy of the {side}, but "
            f"{', '.join(kept[:4])}{' ...' if len(kept) > 4 else ''} belong to modules "
            "without reset_parameters(), so they would keep their trained values: pass "
            "null_seeds=0 (no null), or give the model as a spec stitchlab can build "
            "(timm:NAME with front_weights=..., a stitchlab checkpoint)."
        )
    name = type(model).__name__
    return _ModuleSource(f"{side} ({name})", "module", name, net, _own_input(net, name), 0)


def tensor_reader(data: Any) -> Callable[..., Any]:
    """A reader of data given in memory, with :func:`~stitchlab.data.user.load_user_data`'s
    keywords: a tensor or array of images ``(N, C, H, W)`` (or waveforms ``(N, T)``), a
    pair ``(images, labels)``, a dict of arrays named as in a .npz file (``x``/``y``, or
    ``x_train``, ``y_train``, ``x_test``, ``y_test``), or a Dataset of (image, label)
    items. Read exactly as the same arrays in a .npz file."""
    import numpy as np

    if isinstance(data, Dataset):
        items = [data[i] for i in range(len(data))]  # type: ignore[arg-type]
        data = (torch.stack([torch.as_tensor(it[0]) for it in items]),
                torch.as_tensor([int(it[1]) for it in items]))  # fmt: skip
    if isinstance(data, (torch.Tensor, np.ndarray)):
        arrays = {"x": data}
    elif isinstance(data, tuple) and len(data) == 2:
        arrays = {"x": data[0], "y": data[1]}
    elif isinstance(data, dict):
        arrays = dict(data)
    else:
        raise TypeError(
            "data must be a path (an image folder, .npz, .safetensors, ...), a tensor of "
            "images, a pair (images, labels), a dict of arrays named as in a .npz file, or a "
            f"Dataset of (image, label) items; got {type(data).__name__}"
        )

    def read(**kw: Any):
        from pathlib import Path

        from ..data.user import _finish
        from ..data.user_arrays import _Arrays, _load_tensors
        from ..data.user_common import _Options

        where = Path("<in memory>")
        opts = _Options(kw.get("size"), kw["test_fraction"], kw["seed"], kw.get("audio", False),
                        kw.get("sample_rate"), kw.get("samples"))  # fmt: skip
        table = _Arrays(set(arrays), arrays.__getitem__, None, "the data given in memory")
        loaded = _load_tensors(where, table, "tensors", opts)
        return _finish(loaded, where, opts, kw.get("n_stitch"), kw.get("n_test"))

    return read
