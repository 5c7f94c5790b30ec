"""The names stitchlab uses everywhere, defined once (torch-free).

Objectives, protocols, markers, training methods, data kinds, devices, the results
schema and their display labels: the config checker, the CLI, the runner and the report
all read them from here.
"""

from __future__ import annotations

__all__ = [
    "describe_iri_recipe",
    "OBJECTIVES",
    "PROTOCOLS",
    "MARKERS",
    "IMAGE_MARKERS",
    "AUDIO_MARKERS",
    "METHODS",
    "DATA_KINDS",
    "DISK_KINDS",
    "GENERATED_KINDS",
    "SPEECH_KINDS",
    "DEVICE_KINDS",
    "RESULT_COLUMNS",
    "OBJECTIVE_LABELS",
    "PROTOCOL_LABELS",
    "MARKER_LABELS",
]

OBJECTIVES: tuple[str, ...] = ("hlm", "slm", "dm", "fula")
PROTOCOLS: tuple[str, ...] = ("standard", "iris")
IMAGE_MARKERS: tuple[str, ...] = ("pixel+loc", "pixel", "rand")
AUDIO_MARKERS: tuple[str, ...] = ("beep", "beep-rand")  # class-coded / random-class tone
# (stitchlab.data.Beeped): "beep-rand" says nothing about the class, like "rand" for images
MARKERS: tuple[str, ...] = IMAGE_MARKERS + AUDIO_MARKERS
METHODS: tuple[str, ...] = ("standard", "adversarial", "simclr")
DATA_KINDS: tuple[str, ...] = (
    "cues", "shapes", "cifar10", "mnist", "coloured_mnist",
    "ls_imagenet10", "imagenet100", "imagenet_b100", "spoken_digits", "spoken_words",
)  # fmt: skip
#: Data generated from the config alone (no folder): images, and speech from espeak-ng.
GENERATED_KINDS: tuple[str, ...] = ("cues", "shapes", "spoken_digits", "spoken_words")
#: Waveform data (items ``(float32 (1, T) in [-1, 1], label)``), marked with AUDIO_MARKERS.
SPEECH_KINDS: tuple[str, ...] = ("spoken_digits", "spoken_words")
DISK_KINDS: tuple[str, ...] = tuple(k for k in DATA_KINDS if k not in GENERATED_KINDS)
DEVICE_KINDS: tuple[str, ...] = ("cpu", "cuda", "mps")  # "cuda:1" etc. also accepted

OBJECTIVE_LABELS = {"hlm": "HLM", "slm": "SLM", "dm": "DM", "fula": "FuLA"}
PROTOCOL_LABELS = {"standard": "standard", "iris": "IRIs"}
MARKER_LABELS = {"pixel+loc": "Pixel+Loc", "pixel": "Pixel", "rand": "Rand", "beep": "Beep",
                 "beep-rand": "Beep (random class)"}

# The stitch-free IRI transfer of an IRI-protocol row (evaluation.iri_transfer_columns).
IRI_TRANSFER_COLUMNS: tuple[str, ...] = (
    "iri_front_agreement", "iri_back_agreement", "iri_back_hard_agreement",
    "iri_back_null_agreement",
)  # fmt: skip

# One row per stitch run of an experiment (results.csv / results.parquet).
RESULT_COLUMNS: list[str] = [
    "experiment", "pair", "front", "back", "point", "point_index", "objective", "protocol",
    "seed", "stitch_seed", "iri_seed", "marker", "agreement", "agreement_ci_low",
    "agreement_ci_high", "agreement_normalized", "accuracy",
    "hard_agreement", "error_consistency", "reference_accuracy", "agreement_rolled",
    "excess_agreement", "init_residual", "iri_median_error", "iri_p90_error",
    "iri_pixel_rms", "iri_null_median", "iri_null_ratio", "iri_flagged", "iri_amp",
    *IRI_TRANSFER_COLUMNS,
    "adversarial",
    "robust_agreement", "robust_accuracy", "robust_samples", "cache_used", "seconds",
]  # fmt: skip


#: The paper's adversarial-training attack: PGD-10, L-inf, eps 8/255, step 2/255.
PGD_TRAIN: dict[str, float] = {"eps": 8 / 255, "step": 2 / 255, "steps": 10}
#: The default evaluation attack: stronger (20 steps) at the same budget.
PGD_EVAL: dict[str, float] = {"eps": 8 / 255, "step": 2 / 255, "steps": 20}


def _step_text(v: float) -> str:
    """A step size as ``:g`` writes it, or as the paper does (``1/255``) when that text
    would not read back exactly and the size is a whole number of 255ths."""
    k = round(v * 255)
    if float(f"{v:g}") != v and k >= 1 and abs(v * 255 - k) < 1e-6:
        return f"{k}/255"
    return f"{v:g}"


def describe_iri_recipe(recipe: dict) -> str:
    """One line describing an IRI recipe given as ``IRIRecipe.as_dict()`` (torch-free, for
    the report); a KeyError names a missing field."""
    size = _step_text(recipe["step_size"])
    if recipe["final_step_size"] is not None:
        size += f" -> {_step_text(recipe['final_step_size'])}"
    start = {
        "noise": "uniform noise over the box",
        "image": "another source of the batch",
        "scaled_noise": f"Gaussian noise (sd {recipe['start_scale']:g}) around the box centre",
    }[recipe["start"]]
    grad = {
        "exact": "exact ReLU gradient",
        "straight_through": "ReLU gradient straight through at the output",
        "surrogate": f"ReLU gradient surrogate (slope {recipe.get('relu_slope', 0.1):g}) inside, "
        "straight through at the output",
        "smooth": "ReLU gradient smooth inside (sigmoid of width "
        f"{recipe.get('relu_width', 0.3):g} x the source's sd, at least "
        f"{recipe.get('relu_floor', 0.0):g}"
        + (f"; exact in the last {recipe['exact_relu_steps']} steps"
           if recipe.get("exact_relu_steps") else "")  # absent: smooth to the last step
        + (f"; exact once at most {recipe['exact_relu_mismatch']:.0%} of every inner ReLU's "
           "units differ in state from the source's"
           if recipe.get("exact_relu_mismatch") is not None else "")  # absent: never
        + "), straight through at the output",
    }[recipe["relu_grad"]]
    tol = recipe["tolerance"]
    stop = f"per-sample tolerance {tol:g}" if tol is not None else "no early stop"
    lo, hi = recipe["box"]
    steps = f"{recipe['steps']} {recipe['optimizer']} steps {size}"
    extra = []
    if recipe["optimizer"] == "adam":  # a recipe without these fields: Adam's fixed ones
        if recipe.get("adam_beta2", 0.95) != 0.999:
            extra.append(f"beta2 {recipe.get('adam_beta2', 0.95):g}")
        if recipe.get("drop_outward_momentum", True):
            extra.append("no momentum out of the box")
        if recipe.get("colour_basis", "rgb") != "rgb":
            extra.append(f"in the {recipe['colour_basis']} colour basis")
        if recipe.get("stft_window", 0):
            extra.append(f"in STFT coordinates (sqrt-Hann window of {recipe['stft_window']})")
        if recipe.get("precondition", "none") == "first_layer":
            extra.append("whitened by the first convolution")
        elif recipe.get("precondition") == "auto":
            extra.append("whitened by the first convolution where the front starts with one")
    if recipe.get("polyak") is not None and recipe["optimizer"] != "lbfgs":
        where = {"affine": " on fronts affine up to the final ReLU", "all": ""}.get(
            recipe.get("polyak_fronts", "affine"), ""
        )
        extra.append(f"each at most {recipe['polyak']:g} x its Polyak step{where}")
    if extra:
        steps += f" ({', '.join(extra)})"
    if recipe["optimizer"] == "lbfgs":  # per-sample L-BFGS: the sizes cap each step's RMS
        steps = (f"{recipe['steps']} per-sample L-BFGS steps (history {recipe['history']}, "
                 f"RMS step at most {size})")  # fmt: skip
    last, below = recipe.get("float32_steps", 0), recipe.get("float32_below")
    tail = f", the last {last} in float32" if last else ""
    if below is not None:
        tail += f"{' and' if last else ','} all once the batch's median is below {below:g}"
    arithmetic = {  # "fast": a recipe recorded by an earlier stitchlab (run.json)
        "auto": f"bfloat16 on CUDA{tail}, float32 elsewhere",
        "fast": f"bfloat16 where the hardware has bf16 matrix units (CUDA, AMX){tail}",
        "bf16": f"bfloat16{tail}",
        "off": "float32",
    }.get(recipe.get("amp", "auto"))
    return (
        f"{steps} from {start}, {grad}, {stop}, "
        f"box ({lo:g}, {hi:g}), stored as {recipe['precision']}"
        + (f", in {arithmetic}" if arithmetic else "")
    )
