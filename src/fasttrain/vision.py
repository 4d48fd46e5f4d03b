"""torchvision, imported without torch._dynamo: `from fasttrain.vision import torchvision`.

`import torchvision` imports its ops, and torchvision/ops/roi_align.py imports
`torch._dynamo.utils.is_compile_supported` at module level, which loads all of torch._dynamo: 1.3 s
of a 2-core CPU's and 4.8 s of an H200 host's start-up, in every stage, though only a train stage
with train.compile ever compiles (scripts/time_to_answer.py measures it). While torchvision is
imported, that one name comes from a stand-in that imports the real function on its first call
(roi_align calls it only for a model with RoI pooling, which a classification model has not); the
real module is imported as usual by whatever needs it later. A torchvision that imports anything
else from there is imported the plain way.
"""

from __future__ import annotations

import sys
import types

_DYNAMO_UTILS = "torch._dynamo.utils"


def is_compile_supported(device_type):
    from torch._dynamo.utils import is_compile_supported as real

    return real(device_type)


def _stand_in() -> types.ModuleType:
    module = types.ModuleType(_DYNAMO_UTILS, "fasttrain.vision's stand-in while torchvision is imported")
    module.is_compile_supported = is_compile_supported  # importing any other name fails: the plain way then
    return module


def _import_torchvision():
    if "torchvision" in sys.modules or _DYNAMO_UTILS in sys.modules:
        import torchvision
        return torchvision
    stand_in = sys.modules[_DYNAMO_UTILS] = _stand_in()
    try:
        import torchvision
    except ImportError:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        del sys.modules[_DYNAMO_UTILS]
        import torchvision
    finally:
        if sys.modules.get(_DYNAMO_UTILS) is stand_in:
            del sys.modules[_DYNAMO_UTILS]
    return torchvision


torchvision = _import_torchvision()
