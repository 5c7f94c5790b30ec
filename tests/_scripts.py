"""Load a validation script as a module, as the tests of its functions need."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

VALIDATION = Path(__file__).parents[1] / "validation"


def validation_script(name: str) -> ModuleType:
    """``validation/<name>.py`` as a module (its folder on sys.path, since the scripts
    import their shared helpers from ``_common``)."""
    if str(VALIDATION) not in sys.path:
        sys.path.insert(0, str(VALIDATION))
    spec = importlib.util.spec_from_file_location(name, VALIDATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
