"""The public API: the top-level names, what lives in submodules, stitch()'s protocol
object, one spelling, and the README's quickstart."""

import ast
import importlib
import pkgutil
import re
import types
from pathlib import Path

import pytest
import torch

import stitchlab as sl
from stitchlab import data

README = Path(__file__).resolve().parents[1] / "README.md"

API = [
    "split",
    "stitch_points",
    "TracedModel",
    "Stitcher",
    "stitch",
    "Standard",
    "InvarianceAware",
    "generate_iris",
    "generate_iris_set",
    "IRIRecipe",
    "IRIResult",
    "IRIQuality",
    "evaluate",
    "compare",
]


def test_the_top_level_names_are_pinned():
    assert sl.__all__ == API
    public = {
        name
        for name, value in vars(sl).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(API)  # nothing else leaks to the top level


def test_the_rest_lives_in_submodules():
    from stitchlab import errors, fit, metrics, objectives, stitched

    assert callable(metrics.agreement) and callable(metrics.cka)
    assert {"HLM", "SLM", "DM", "FuLA"} <= set(objectives.__all__)
    assert fit.TrainingConfig(epochs=1).epochs == 1
    assert stitched.StitchedModel and stitched.StitchRecord
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), Exception), name
    assert issubclass(errors.DataError, ValueError) and issubclass(errors.IRIError, RuntimeError)


def _public_names():
    """Every name in a stitchlab module's __all__."""
    names = set(sl.__all__)
    for info in pkgutil.walk_packages(sl.__path__, "stitchlab."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        names |= set(getattr(module, "__all__", ()))
    return names


def test_one_spelling_initialise_and_normalised():
    american = [n for n in _public_names() if re.search(r"(?i)(initializ|normaliz)", n)]
    assert american == []


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    from stitchlab import models

    return models.create("small_cnn", width=4), models.create("small_cnn", width=4)


@pytest.mark.parametrize(
    "keyword, replacement",
    [
        ("iris", "iris -> iris"),
        ("iris_branches", "iris_branches -> branches"),
        ("iris_cache", "iris_cache -> cache"),
        ("iris_options", "iris_options -> recipe=IRIRecipe"),
        ("iris_recipe", "iris_recipe -> recipe"),
        ("allow_flagged_iris", "allow_flagged_iris -> allow_flagged"),
    ],
)
def test_stitch_refuses_the_iris_keywords_naming_invariance_aware(pair, keyword, replacement):
    front, back = pair
    with pytest.raises(TypeError, match=r"protocol=InvarianceAware\(\.\.\.\)") as info:
        sl.stitch(front, back, "blocks.1", data.shapes(8), **{keyword: None})
    assert replacement in str(info.value)


def test_stitch_takes_the_protocol_as_an_object(pair):
    front, back = pair
    x, y = data.shapes(32, seed=0)
    run = {"epochs": 1, "init": "identity", "seed": 0}
    by_object = sl.stitch(front, back, "blocks.1", (x, y), protocol=sl.Standard(), **run)
    by_name = sl.stitch(front, back, "blocks.1", (x, y), protocol="standard", **run)
    assert by_object.protocol == by_name.protocol == "standard"
    assert by_object.history == by_name.history
    with pytest.raises(ValueError, match=r"protocol must be Standard\(\), InvarianceAware"):
        sl.stitch(front, back, "blocks.1", (x, y), protocol="invariant", **run)


def _readme_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    first = _readme_blocks("bash")[0].splitlines()
    assert first == [
        'python3 -m venv .venv && .venv/bin/pip install -r requirements/torch.txt -e ".[dev,ray]"'
        " && .venv/bin/stitchlab demo --out demo-out",
        ".venv/bin/python -m pytest",
    ]


def test_readme_quickstart_uses_the_public_api():
    code = _readme_blocks("python")[0]
    assert len(code.strip().splitlines()) <= 12
    used = {
        node.attr
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "sl"
    }
    assert used and used <= set(sl.__all__)


@pytest.mark.slow  # trains two small CNNs and makes 200 IRIs: about 45 s of CPU
def test_readme_quickstart_runs(capsys):
    exec(compile(_readme_blocks("python")[0], "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("['blocks.0'")
    scores = {line.split()[0]: float(line.split()[1]) for line in out[1:]}
    assert set(scores) == {"standard", "iris"}
    assert all(0.0 <= s <= 100.0 for s in scores.values())
