"""CI only: let PyPI's torchvision import beside the CPU-only torch 2.13.0 build.

Used by ``.ci/run`` when the machine has too little disk for the pinned CUDA pair of
``requirements/torch.txt`` (about 6.5 GB). PyPI's torchvision wheels are CUDA builds: beside
a CPU torch their C++ ops library cannot load, which torchvision tolerates (its ops then
raise "Couldn't load custom C++ ops" when called), except that two import-time fake-tensor
registrations (``torchvision::nms`` and ``torchvision::qnms``) need the op schemas to
exist. This hook defines those two schemas, with no kernel, just before torchvision is
first imported; everything stitchlab uses (models, transforms) is pure Python. Calling
``torchvision.ops.nms`` still fails loudly. Installed as a ``.pth`` file into the CI
virtual environment only; never part of the package.
"""

import importlib.abc
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARY = None  # kept alive: the schemas vanish with it


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        global _LIBRARY
        if torch.version.cuda is None:  # a CPU torch: PyPI's (CUDA) torchvision ops can't load
            _LIBRARY = torch.library.Library("torchvision", "DEF")
            for schema in _SCHEMAS:
                _LIBRARY.define(schema)
        return None  # the regular finders import torchvision


sys.meta_path.insert(0, _BeforeTorchvision())
