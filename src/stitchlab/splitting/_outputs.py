"""The error of a cut that cannot be made, and which element of what a model's forward
returns is the logits (a tensor, tuple, list, named tuple or dict)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

#: Which element of a forward's result is the logits: an index, a key, or None (default).
OutputSelector = int | str | None


class SplitError(ValueError):
    """A model cannot be split at the requested point."""


def _select_output(out, output: OutputSelector, model_name: str):
    """The element of a (traced or real) output structure that holds the logits."""
    if isinstance(out, Mapping) or hasattr(out, "keys") and hasattr(out, "__getitem__"):
        keys = list(out.keys())
        key = "logits" if output is None else output
        if key not in keys:
            raise SplitError(
                f"{model_name}.forward returns a dict with keys {keys}; say which one is the "
                f"logits with output='<key>'"
                + (" (no 'logits' key to default to)." if output is None else ".")
            )
        return out[key]
    if isinstance(out, (tuple, list)):
        if isinstance(output, str) and hasattr(out, "_fields"):  # namedtuple
            if output not in out._fields:
                raise SplitError(
                    f"{model_name}.forward returns {type(out).__name__} with fields "
                    f"{list(out._fields)}; {output!r} is not one of them."
                )
            return getattr(out, output)
        if output is None and hasattr(out, "_fields") and "logits" in out._fields:
            return out.logits  # torchvision's GoogLeNet/Inception outputs in train mode
        if output is None and len(out) == 1:
            output = 0
        if output is None:
            raise SplitError(
                f"{model_name}.forward returns a {type(out).__name__} of {len(out)} elements; "
                "stitchlab does not guess which one is the logits (a (features, logits) "
                "pair would be scored on its features): pass output=<index> (for a model "
                "given as a reference, wrap it: stitchlab.splitting.LogitsOnly(model, "
                "output=<index>))."
            )
        if not isinstance(output, int) or not -len(out) <= output < len(out):
            raise SplitError(
                f"{model_name}.forward returns a {type(out).__name__} of {len(out)} elements; "
                f"output must be an index in 0..{len(out) - 1}, got {output!r}."
            )
        return out[output]
    if output not in (None, 0):
        raise SplitError(
            f"{model_name}.forward returns a single value; output={output!r} selects nothing "
            "(leave output unset)."
        )
    return out


def select_logits(out, output: OutputSelector = None, model_name: str = "the model") -> Tensor:
    """The logits tensor in what a model returned (a tensor, tuple, list or dict).

    ``output`` names the element (an index or a key); by default the ``"logits"`` entry of
    a dict, Hugging Face output or named tuple, and the only element of a 1-tuple; a tuple
    of several elements without ``output`` is an error (it is not guessed).
    """
    sel = _select_output(out, output, model_name)
    if not isinstance(sel, Tensor):
        raise SplitError(
            f"{model_name} returned {type(sel).__name__} where the logits tensor was expected; "
            "pass output=<index or key> to select the logits."
        )
    return sel


class LogitsOnly(nn.Module):
    """``model`` returning only its logits (for models whose forward returns more)."""

    def __init__(self, model: nn.Module, output: OutputSelector = None) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return select_logits(self.model(x), self.output, type(self.model).__name__)
