"""Import ``streaming`` (streaming-community) on machines without torchvision.

streaming 0.14 imports ``torchvision`` at import time, only for its vision datasets. llmfoundry never uses those,
and a CPU machine must not carry a torchvision wheel that breaks ``import transformers``. When torchvision is not
importable, ``import_streaming()`` installs small stand-in modules under the torchvision names while importing
streaming (and removes them afterwards); using a vision dataset then fails with a message that says why. Always import streaming through here.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from llmfoundry.data.streaming_stores import route_store_downloads

_STANDIN_MARK = "__llmfoundry_standin__"
_MESSAGE = (
    "torchvision is not installed: streaming's vision datasets are unavailable in llmfoundry "
    "(install a torchvision build that matches your torch to use them)"
)


class _MissingVisionDataset:
    """Takes the place of ``torchvision.datasets.VisionDataset``; building one explains what is missing."""

    def __init__(self, *args, **kwargs):
        raise ImportError(_MESSAGE)


def _missing_function(*args, **kwargs):
    raise ImportError(_MESSAGE)


def _install_standins() -> None:
    modules = {
        "torchvision": {},
        "torchvision.datasets": {"VisionDataset": _MissingVisionDataset, "CIFAR10": _MissingVisionDataset},
        "torchvision.transforms": {},
        "torchvision.transforms.functional": {"to_tensor": _missing_function},
    }
    for name, attrs in modules.items():
        if name in sys.modules:
            continue
        module = types.ModuleType(name, "llmfoundry stand-in: torchvision is not installed")
        setattr(module, _STANDIN_MARK, True)
        module.__path__ = []  # a package, so that submodule imports resolve through sys.modules
        for key, value in attrs.items():
            setattr(module, key, value)
        sys.modules[name] = module
    sys.modules["torchvision"].datasets = sys.modules["torchvision.datasets"]
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
    sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]


def _torchvision_importable() -> bool:
    if "torchvision" in sys.modules:
        return True
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        importlib.import_module("torchvision")
        return True
    except Exception:  # a broken wheel (e.g. built for another torch) is as good as absent
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        return False


def import_streaming() -> types.ModuleType:
    """``import streaming``, working whether or not torchvision is importable, its gs:// and Azure downloads routed through
    our storage layer (data/streaming_stores.py); returns the module."""
    if "streaming" in sys.modules and hasattr(sys.modules["streaming"], "StreamingDataset"):
        return sys.modules["streaming"]
    if _torchvision_importable():
        module = importlib.import_module("streaming")
        route_store_downloads(module)
        return module
    # streaming imports transformers, whose torchvision probe (find_spec) must not see the stand-ins.
    importlib.import_module("transformers")
    _install_standins()
    try:
        module = importlib.import_module("streaming")
        route_store_downloads(module)
        return module
    finally:
        # streaming has bound the names it needs; removing the stand-ins keeps every later
        # "is torchvision installed?" check truthful.
        _remove_standins()


def _remove_standins() -> None:
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        if getattr(sys.modules[name], _STANDIN_MARK, False):
            del sys.modules[name]
