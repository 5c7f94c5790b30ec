"""The named IRI recipes: each preset is the fields it changes from :class:`IRIRecipe`'s
defaults (docs/recipes.md)."""

from __future__ import annotations

#: ``preset=`` name -> the fields it sets; the other fields keep the recipe's defaults.
PRESETS: dict[str, dict] = {
    # stitchlab's recipe (the defaults of IRIRecipe)
    "default": {},
    # the released loop (docs/method.md section 3): 200 signed steps of 1/255 from uniform noise,
    # the exact gradient, no early stop, float32 on every device
    "paper": {
        "steps": 200, "step_size": 1 / 255, "final_step_size": None, "optimizer": "sign",
        "start": "noise", "tolerance": None, "relu_grad": "exact", "precondition": "none",
        "amp": "off", "float32_steps": 0, "float32_below": None, "keep_converged": False,
        "polyak": None,
    },
    # waveforms in [-1, 1]: a quiet Gaussian start (uniform noise over the box never
    # converges), 300 Adam steps of 0.003 decaying to 0.0001, int16 storage (uint8 levels
    # are 1/127 of full scale), in STFT coordinates with the smooth inner-ReLU gradient to
    # the last step (docs/validation/audio.md, "IRIs in STFT coordinates"); bfloat16 on
    # CUDA only, to the last step; a converged sample also takes that iteration's step
    "audio": {
        "steps": 300, "step_size": 0.003, "final_step_size": 0.0001, "start": "scaled_noise",
        "start_scale": 0.003, "box": (-1.0, 1.0), "precision": "int16", "stft_window": 256,
        "precondition": "none", "exact_relu_steps": 0, "exact_relu_mismatch": None,
        "amp": "auto", "float32_steps": 0, "float32_below": None, "keep_converged": False,
        "polyak": None,
    },
}  # fmt: skip
