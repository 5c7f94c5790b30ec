"""validation/iri_options.py's option sets: parsed into recipe options, bad ones refused."""

import pytest

from _scripts import validation_script

options = validation_script("iri_options")


def test_parse_options_literals_and_bare_words():
    assert options.parse_options("steps=360, start='image'") == {"steps": 360, "start": "image"}
    assert options.parse_options("relu_grad=exact,final_step_size=None") == {
        "relu_grad": "exact", "final_step_size": None,
    }  # fmt: skip
    assert options.parse_options("") == {}
    assert options.parse_options("preset=paper, steps=50") == {"preset": "paper", "steps": 50}


@pytest.mark.parametrize("text", ["steps", "stepz=3", "steps=-1", "start=sideways"])
def test_parse_options_refuses_bad_sets(text):
    with pytest.raises(SystemExit):
        options.parse_options(text)
