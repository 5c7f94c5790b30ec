"""Experiment configuration: a TOML file (or dict) checked completely before anything runs.

A config names the data, the model families (each trained once and stored), the pairs
(front model(s) and back model, optionally a shortcut marker on the stitching and test
data), the points, objectives and protocols, and the stitch-training and IRI settings::

    name = "demo"
    reductions = ["small generated data set instead of CIFAR-10"]

    [data]
    kind = "cues"            # cues | shapes | cifar10 | mnist | coloured_mnist
    n_train = 3000
    n_test = 1000
    options = { label_cues = ["shape"] }

    [models.back]
    arch = "small_cnn"
    options = { width = 16 }
    seed = 0
    recipe = { epochs = 6 }          # fast recipe fields; base = "paper" for the paper's

    [models.shortcut]
    arch = "small_cnn"
    seed = 2
    marker = "pixel+loc"             # trained on marked data: a pixel-shortcut network
    data = { kind = "mnist" }        # optional: train this model on other data (the
                                     # stitching and test data are always [data])

    [models.random]
    arch = "small_cnn"
    options = { width = 16 }
    seed = 7
    method = "random"                # never trained: the front of a null pair

    [pairs.cross-bias]
    front = "shortcut"               # or a list of models: one curve per front seed
    back = "back"
    marker = "pixel+loc"             # stitching and test data carry the marker

    [pairs.null]                     # the random-front null (Smith et al. 2025): what a
    front = "random"                 # stitch layer and the back reach from a random front
    back = "back"

    [stitch]
    points = "all"
    objectives = ["hlm", "slm", "dm", "fula"]
    protocols = ["standard", "iris"]
    n_stitch = 1000
    training = { epochs = 8, lr = 3e-3 }

    [iris]                           # IRIRecipe fields (preset, steps, precondition, ...)
    steps = 40
    seed = 0                         # the IRIs' random start (0 keeps earlier stores' keys)
    per_stitch_seed = false          # true: stitch seed s on IRIs of random start seed + s
    threshold = 0.5                  # quality limits: a set above this median error, or
    min_null_ratio = 10              # under 10x closer than another image, is flagged
"""

from __future__ import annotations

import copy
import difflib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store import stable_hash
from ..vocabulary import (
    AUDIO_MARKERS,
    DATA_KINDS,
    DEVICE_KINDS,
    DISK_KINDS,
    IMAGE_MARKERS,
    METHODS,
    OBJECTIVES,
    PROTOCOLS,
    SPEECH_KINDS,
)

__all__ = ["ConfigError", "Experiment", "load_config"]


_TOP = {"name", "description", "reductions", "data", "models", "pairs", "stitch", "iris", "run"}
_DATA = {"kind", "root", "n_train", "n_test", "seed", "options", "num_classes"}
_MODEL = {"arch", "options", "seed", "method", "marker", "marker_rate", "recipe", "base",
          "robust_eval", "data", "leaf_modules", "output", "layouts"}  # fmt: skip
_TRACING = ("leaf_modules", "output", "layouts")
_PAIR = {"front", "back", "marker"}
# keys older configs carried that no code reads: refused, so nobody relies on them
_DEAD = {
    "test_iris": "the CKA of experiment D always uses test IRIs ([stitch] cka = true)",
    "back_point_map": "every pair stitches at the same named point of front and back",
}
_STITCH = {
    "points", "objectives", "protocols", "n_stitch", "n_init", "training", "seeds",
    "iris_branches", "excess", "eval_batch_size", "cka", "attack",
}  # fmt: skip
_RUN = {"threads", "device", "gpus_per_job"}


class ConfigError(ValueError):
    """An invalid experiment configuration; the message names the offending entry."""


def _check_keys(section: dict, allowed: set[str], where: str) -> None:
    if not isinstance(section, dict):
        raise ConfigError(f"{where} must be a table, got {type(section).__name__}")
    for key in section:
        if key in _DEAD:
            raise ConfigError(f"{where} {key} is not supported ({_DEAD[key]}); remove it.")
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"unknown key {key!r} in {where}{hint}; allowed: {', '.join(sorted(allowed))}"
            )


def _one_of(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{where} is {value!r}; choose one of {', '.join(allowed)}")
    return value


@dataclass
class Experiment:
    """A validated experiment configuration."""

    name: str
    raw: dict[str, Any]
    description: str = ""
    reductions: list[str] = field(default_factory=list)
    points: dict[str, list[str]] = field(default_factory=dict)  # pair -> points

    @property
    def data(self) -> dict[str, Any]:
        """The ``[data]`` table with defaults."""
        return self.raw["data"]

    @property
    def models(self) -> dict[str, dict[str, Any]]:
        """Model name -> model table."""
        return self.raw["models"]

    @property
    def pairs(self) -> dict[str, dict[str, Any]]:
        """Pair name -> pair table (``front`` always a list)."""
        return self.raw["pairs"]

    @property
    def stitch(self) -> dict[str, Any]:
        """The ``[stitch]`` table with defaults."""
        return self.raw["stitch"]

    @property
    def iris(self) -> dict[str, Any]:
        """IRI recipe options."""
        return self.raw["iris"]

    @property
    def run(self) -> dict[str, Any]:
        """Execution settings (threads per job, device, GPUs per job on Ray)."""
        return self.raw["run"]


def load_config(source: str | Path | dict[str, Any]) -> Experiment:
    """Read and validate a config (a TOML path or a dict); raise :class:`ConfigError`."""
    if isinstance(source, dict):
        raw = copy.deepcopy(source)
    else:
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return _validate(raw)


#: The [iris] keys that are not IRIRecipe fields: the quality limits and the random start
#: (one for all stitch seeds, or one per stitch seed)
IRIS_SET_KEYS = ("threshold", "min_null_ratio", "seed", "per_stitch_seed")


def _validate(raw: dict[str, Any]) -> Experiment:
    from .. import models as model_registry
    from ..models.audio import SPEECH_MODELS

    _check_keys(raw, _TOP, "the config")
    for required in ("name", "data", "models", "pairs"):
        if required not in raw:
            raise ConfigError(f"the config needs a {required!r} entry")
    for table in ("data", "models", "pairs", "stitch", "iris", "run"):
        if table in raw and not isinstance(raw[table], dict):
            raise ConfigError(f"[{table}] must be a table, got {raw[table]!r}")
    data = {"seed": 0, "options": {}, "num_classes": 10, "root": ""}
    data.update(raw["data"])
    _check_keys(data, _DATA, "[data]")
    _one_of(data.get("kind"), DATA_KINDS, "[data] kind")
    for key in ("n_train", "n_test", "num_classes"):
        _positive_int(data.get(key), f"[data] {key}")
    _int(data["seed"], "[data] seed")
    if data["kind"] in DISK_KINDS and not data["root"]:
        raise ConfigError(f"[data] kind {data['kind']!r} needs a root folder (root = '...')")
    _check_classes(data, "[data]")
    raw["data"] = data
    speech = data["kind"] in SPEECH_KINDS
    markers = AUDIO_MARKERS if speech else IMAGE_MARKERS
    modality = "speech" if speech else "image"

    models = {}
    for name, spec in raw["models"].items():
        where = f"[models.{name}]"
        _check_keys(spec, _MODEL, where)
        full = {"options": {}, "seed": 0, "method": "standard", "marker": None, "recipe": {},
                "base": "fast", "robust_eval": False, "data": {}, **spec}  # fmt: skip
        _check_keys(full["data"], _DATA, f"{where} data")
        if "kind" in full["data"]:
            _one_of(full["data"]["kind"], DATA_KINDS, f"{where} data kind")
            if (full["data"]["kind"] in SPEECH_KINDS) != speech:
                raise ConfigError(f"{where} data kind {full['data']['kind']!r} is not {modality} "
                                  f"data like [data] ({data['kind']!r}); a model trained on "
                                  "it could not read the stitching data")  # fmt: skip
        if full["data"]:
            _check_classes({**data, **full["data"]}, f"{where} data")
        full["tracing"] = _check_tracing({k: full.pop(k) for k in _TRACING if k in full}, where)
        if not model_registry.is_known(str(full.get("arch"))):
            close = difflib.get_close_matches(str(full.get("arch")), model_registry.list_models())
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{where} arch {full.get('arch')!r} is not a known model{hint}; known: "
                f"{', '.join(model_registry.list_models())}, or torchvision:NAME / timm:NAME"
            )
        if (full["arch"] in SPEECH_MODELS) != speech:
            kind = "a speech model" if full["arch"] in SPEECH_MODELS else "an image model"
            raise ConfigError(f"{where} arch {full['arch']!r} is {kind} but [data] kind "
                              f"{data['kind']!r} is {modality} data; speech models "
                              f"({', '.join(SPEECH_MODELS)}) read spoken_* data, image "
                              "models the others")  # fmt: skip
        _one_of(full["method"], (*METHODS, "random"), f"{where} method")
        if full["method"] == "random" and (full["recipe"] or full["marker"]):
            raise ConfigError(f"{where} method 'random' is an untrained network (a null "
                              "front): it takes no recipe and no marker")  # fmt: skip
        if full["marker"] is not None:
            _one_of(full["marker"], markers, f"{where} marker")
        if "marker_rate" in full:
            rate = full["marker_rate"]
            if full["marker"] is None:
                raise ConfigError(f"{where} marker_rate needs a marker")
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
                raise ConfigError(f"{where} marker_rate is the fraction of training items "
                                  f"that carry the marker, in (0, 1]; got {rate!r}")  # fmt: skip
        if speech and full["method"] != "random":
            if full["recipe"].get("augment", False):
                raise ConfigError(f"{where} recipe augment is an image flip + crop; speech "
                                  "data has none: remove it or set augment = false")  # fmt: skip
            if full["method"] != "standard":
                raise ConfigError(f"{where} method {full['method']!r} is for images; speech "
                                  "models are trained with method 'standard'")  # fmt: skip
            full["recipe"] = {**full["recipe"], "augment": False}
        _one_of(full["base"], ("fast", "paper"), f"{where} base")
        _int(full["seed"], f"{where} seed")
        for key in ("options", "recipe"):
            if not isinstance(full[key], dict):
                raise ConfigError(f"{where} {key} must be a table, got {full[key]!r}")
        _check_recipe(full, where)
        models[name] = full
    raw["models"] = models

    pairs = {}
    for name, spec in raw["pairs"].items():
        where = f"[pairs.{name}]"
        _check_keys(spec, _PAIR, where)
        fronts = spec.get("front")
        if not (isinstance(fronts, str) or isinstance(fronts, list) and fronts):
            raise ConfigError(f"{where} front must be a model name or a list of them, got "
                              f"{fronts!r}")  # fmt: skip
        fronts = [fronts] if isinstance(fronts, str) else list(fronts)
        _no_repeats(fronts, f"{where} front")
        for m in [*fronts, spec.get("back")]:
            if m not in models:
                raise ConfigError(f"{where} refers to model {m!r}, which [models] does not define")
        marker = spec.get("marker")
        if marker is not None:
            _one_of(marker, markers, f"{where} marker")
        pairs[name] = {"front": fronts, "back": spec["back"], "marker": marker}
    raw["pairs"] = pairs

    stitch = {
        "points": "all", "objectives": list(OBJECTIVES), "protocols": ["standard"],
        "n_stitch": 1000, "n_init": 500, "training": {}, "seeds": [0],
        "iris_branches": "both", "excess": False, "eval_batch_size": 256, "cka": False,
        "attack": None,
    }  # fmt: skip
    stitch.update(raw.get("stitch", {}))
    _check_keys(stitch, _STITCH, "[stitch]")
    for key in ("n_stitch", "n_init", "eval_batch_size"):
        _positive_int(stitch[key], f"[stitch] {key}")
    if "n_stitch" in raw.get("stitch", {}) and stitch["n_stitch"] > data["n_train"]:
        raise ConfigError(
            f"[stitch] n_stitch is {stitch['n_stitch']}, more than the {data['n_train']} "
            "training images ([data] n_train) it is drawn from; set n_stitch <= n_train "
            "(left out, it defaults to min(1000, n_train))."
        )
    if not isinstance(stitch["seeds"], list) or not stitch["seeds"]:
        raise ConfigError(f"[stitch] seeds must be a list of integers, got {stitch['seeds']!r}")
    for seed in stitch["seeds"]:
        _int(seed, "[stitch] seeds entry")
    for key in ("objectives", "protocols"):
        if not isinstance(stitch[key], list) or not stitch[key]:
            raise ConfigError(f"[stitch] {key} must be a non-empty list, got {stitch[key]!r}")
    for key in ("seeds", "objectives", "protocols"):
        _no_repeats(stitch[key], f"[stitch] {key}")
    if stitch["points"] != "all" and not isinstance(stitch["points"], list):
        raise ConfigError(f"[stitch] points must be \"all\" or a list of point names, got "
                          f"{stitch['points']!r} (a single point is [\"name\"])")  # fmt: skip
    if isinstance(stitch["points"], list):
        _no_repeats(stitch["points"], "[stitch] points")
    for o in stitch["objectives"]:
        _one_of(o, OBJECTIVES, "[stitch] objectives entry")
    for p in stitch["protocols"]:
        _one_of(p, PROTOCOLS, "[stitch] protocols entry")
    _one_of(stitch["iris_branches"], ("both", "front", "back"), "[stitch] iris_branches")
    for key in ("cka", "excess"):
        if not isinstance(stitch[key], bool):
            raise ConfigError(f"[stitch] {key} must be true or false, got {stitch[key]!r}")
    from ..fit import TrainingConfig

    try:
        TrainingConfig.from_kwargs(**stitch["training"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[stitch] training: {exc}") from exc
    if stitch["attack"] is not None:
        from ..fit import check_attack

        try:
            check_attack(stitch["attack"], "[stitch] attack", samples=True)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    raw["stitch"] = stitch

    from ..iris import IRIRecipe

    iris = dict(raw.get("iris", {}))
    try:
        IRIRecipe.from_kwargs(**{k: v for k, v in iris.items() if k not in IRIS_SET_KEYS})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[iris]: {exc}") from exc
    preset = iris.get("preset", "default")
    if isinstance(preset, str) and preset.startswith("audio") and not speech:
        raise ConfigError(
            f"[iris] preset {preset!r} is for waveforms (box -1..1, STFT steps) but [data] "
            f"kind {data['kind']!r} is images; leave preset out (stitchlab's image default) "
            "or choose an image preset"
        )
    if "seed" in iris and _int(iris["seed"], "[iris] seed") < 0:  # the IRIs' random start
        raise ConfigError(f"[iris] seed must be >= 0, got {iris['seed']!r}")
    if not isinstance(iris.get("per_stitch_seed", False), bool):
        raise ConfigError(
            f"[iris] per_stitch_seed must be true or false, got {iris['per_stitch_seed']!r}"
        )
    if iris.get("per_stitch_seed") and any(s < 0 for s in stitch["seeds"]):
        raise ConfigError(
            "[iris] per_stitch_seed gives stitch seed s IRIs of random start seed + s, so "
            f"[stitch] seeds must be >= 0; got {stitch['seeds']!r}"
        )
    for key in ("threshold", "min_null_ratio"):
        if key in iris and (isinstance(iris[key], bool) or not isinstance(iris[key], (int, float))
                            or not (math.isfinite(iris[key]) and iris[key] > 0)):  # fmt: skip
            raise ConfigError(f"[iris] {key} must be a positive number, got {iris[key]!r}")
    raw["iris"] = iris
    run = {"threads": 2, "device": "cpu"}
    run.update(raw.get("run", {}))
    _check_keys(run, _RUN, "[run]")
    _positive_int(run["threads"], "[run] threads")
    _check_device(run["device"])
    if "gpus_per_job" in run:  # what a job asks Ray for (executors.gpus_for)
        from ..runs.executors import gpus_for

        value = run["gpus_per_job"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"[run] gpus_per_job must be a number, got {value!r}")
        try:
            gpus_for(run["device"], value)
        except ValueError as exc:
            raise ConfigError(f"[run] {exc}") from None
    raw["run"] = run

    exp = Experiment(
        name=str(raw["name"]),
        raw=raw,
        description=str(raw.get("description", "")),
        reductions=list(raw.get("reductions", [])),
    )
    exp.points = _check_points(exp)
    return exp


def _no_repeats(values: list, where: str) -> None:
    """Refuse a list that names an entry twice (each would write its rows twice)."""
    seen = [v for i, v in enumerate(values) if v in values[:i]]
    if seen:
        raise ConfigError(f"{where} names {seen[0]!r} twice; list each entry once")


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    return value


def _positive_int(value: Any, where: str) -> int:
    if _int(value, where) < 1:
        raise ConfigError(f"{where} must be a positive integer, got {value!r}")
    return value


def _check_device(device: Any) -> None:
    """The form of a device name (whether it is present is checked before a run)."""
    if (
        not isinstance(device, str)
        or device.split(":")[0] not in DEVICE_KINDS
        or (":" in device and not device.split(":", 1)[1].isdigit())
    ):
        raise ConfigError(
            f"[run] device is {device!r}; use one of {', '.join(DEVICE_KINDS)} (or cuda:N)"
        )


def _check_classes(data: dict, where: str) -> None:
    """The class count of a data table: ``num_classes`` must be the data's (the words of
    ``spoken_words`` data, one per class; the fixed count of a known kind; generated
    images' ``options.num_classes``)."""
    if data.get("kind") == "spoken_words":
        words = data.get("options", {}).get("words")
        if not isinstance(words, list) or len(words) < 2:
            raise ConfigError(f"{where} kind 'spoken_words' needs options.words, a list of at "
                              f"least 2 words (one per class); got {words!r}")  # fmt: skip
        if len(words) != data["num_classes"]:
            raise ConfigError(f"{where} num_classes is {data['num_classes']} but options.words "
                              f"has {len(words)} words (one class per word)")  # fmt: skip
    elif data.get("kind") == "spoken_digits" and data["num_classes"] != 10:
        raise ConfigError(f"{where} spoken_digits has 10 classes; num_classes is "
                          f"{data['num_classes']}")  # fmt: skip
    classes = _KIND_CLASSES.get(str(data.get("kind")))
    if data.get("kind") in ("shapes", "cues"):
        classes = (data.get("options") or {}).get("num_classes", 10)
    if classes is not None and data["num_classes"] != classes:
        raise ConfigError(
            f"{where} {data['kind']} data has {classes} classes but num_classes is "
            f"{data['num_classes']}: the models' outputs and the chance level (100/K in "
            f"agreement_normalized) follow num_classes; set num_classes = {classes}"
            + (" (or options.num_classes for generated data)"
               if data.get("kind") in ("shapes", "cues") else "")
            + "."
        )


#: The class count of data kinds with a fixed one (generated images: options.num_classes).
#: (ImageNet-B100 takes its classes from its folder or options, so it is not listed.)
_KIND_CLASSES = {"cifar10": 10, "mnist": 10, "coloured_mnist": 10, "ls_imagenet10": 10,
                 "imagenet100": 100}  # fmt: skip


def model_recipe(model: dict[str, Any]):
    """The training :class:`~stitchlab.train.Recipe` of a model table: its ``base``
    recipe (``fast`` or the paper's for its ``arch``) with its ``method`` and ``recipe``
    fields."""
    from ..train import fast_recipe, paper_recipe

    opts = {"method": model["method"], **model["recipe"]}
    return fast_recipe(**opts) if model["base"] == "fast" else paper_recipe(model["arch"], **opts)


def _check_recipe(model: dict, where: str) -> None:
    """Build the model's training recipe now, so a bad field fails before any training."""
    if model["method"] == "random":  # never trained: no recipe to check
        return
    try:
        model_recipe(model)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{where} recipe: {exc.args[0] if exc.args else exc}") from None


def _check_tracing(tracing: dict, where: str) -> dict:
    """``leaf_modules`` (class names), ``output`` (index or key) and ``layouts`` (point ->
    layout) of a model: how it is traced and stitched."""
    from ..splitting import LAYOUTS, resolve_leaf_modules

    leaves = tracing.get("leaf_modules", [])
    if not isinstance(leaves, list) or not all(isinstance(c, str) for c in leaves):
        raise ConfigError(f"{where} leaf_modules must be a list of class names, got {leaves!r}")
    try:
        resolve_leaf_modules(leaves)
    except ValueError as exc:
        raise ConfigError(f"{where} {exc}") from None
    out = tracing.get("output")
    if out is not None and (isinstance(out, bool) or not isinstance(out, (int, str))):
        raise ConfigError(f"{where} output must be an index or a key, got {out!r}")
    layouts = tracing.get("layouts", {})
    if not isinstance(layouts, dict) or any(v not in LAYOUTS for v in layouts.values()):
        raise ConfigError(
            f"{where} layouts must map points to one of {', '.join(LAYOUTS)}, got {layouts!r}"
        )
    return {k: v for k, v in tracing.items() if v not in (None, [], {})}


def _model_points(exp: Experiment, name: str, spec: dict) -> list[str]:
    """The stitch points of a model of the config, built with its options and traced
    with its ``output``, ``leaf_modules`` and ``layouts``: options that build empty layers
    (``width = 0``), an ``output`` its forward does not have and layouts of points it
    does not have are refused here, before any training."""
    import torch

    from .. import models as model_registry
    from ..splitting import SplitError, TracedModel

    where = f"[models.{name}]"
    with torch.random.fork_rng(devices=[]):  # checking a config draws no numbers
        try:
            model = model_registry.create(
                spec["arch"], num_classes=exp.data["num_classes"], **spec["options"]
            )
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"{where} options {spec['options']}: {exc}") from None
        empty = [n for n, p in model.named_parameters() if p.numel() == 0]
        if empty:
            raise ConfigError(
                f"{where} options {spec['options']} build a {spec['arch']} with empty layers "
                f"({empty[0]} has no weights); give sizes >= 1"
            )
        tracing = spec.get("tracing", {})
        try:
            tm = TracedModel(model, leaf_modules=tracing.get("leaf_modules", ()),
                             output=tracing.get("output"), verify=False)  # fmt: skip
            known = (set(tm.all_points()) if tm.sequential
                     else set(tm._eval.points) | set(tm._eval.rejected))  # every name
        except SplitError as exc:
            raise ConfigError(f"{where} {exc}") from None
    for p in tracing.get("layouts", {}):
        if p not in known:
            raise ConfigError(f"{where} layouts names {p!r}, which is no point of "
                              f"{spec['arch']}")  # fmt: skip
    return tm.points()


def _check_points(exp: Experiment) -> dict[str, list[str]]:
    """The points of every pair, checked against the back model's stitch points."""
    cache: dict[str, list[str]] = {}
    for name, spec in exp.models.items():  # every model is built and traced once
        key = stable_hash([spec["arch"], spec["options"], spec.get("tracing", {})])
        if key not in cache:
            cache[key] = _model_points(exp, name, spec)
    out = {}
    for pair, spec in exp.pairs.items():
        back = exp.models[spec["back"]]
        key = stable_hash([back["arch"], back["options"], back.get("tracing", {})])
        valid = cache[key]
        wanted = exp.stitch["points"]
        if wanted == "all":
            out[pair] = list(valid)
            continue
        for p in wanted:
            if p not in valid:
                close = difflib.get_close_matches(p, valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"[stitch] point {p!r} is not a stitch point of {back['arch']}{hint}; "
                    f"valid: {', '.join(valid)}"
                )
        out[pair] = list(wanted)
    return out
