"""Build facts and the import-time check against the running torch.

A compiled extension only works with the torch it was built against. Loaded
into another one it fails with an undefined symbol that names neither side, or
loads and misbehaves later. setup.py records the facts of the build in
``_build_info.json``; ``check_torch_compat`` compares them with the running
torch *before* the library is loaded and says, in one line, what was expected.
A stable-ABI build (``stable_abi``: the oldest torch it serves) loads in that
torch and every later one.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from pathlib import Path
from typing import Any

import torch

_FACTS_FILE = Path(__file__).with_name("_build_info.json")
_HINT = "install the wheel built for your torch"


@functools.cache
def build_info() -> dict[str, Any]:
    """Facts recorded when this copy was compiled; ``{}`` if it never was."""
    try:
        return json.loads(_FACTS_FILE.read_text())
    except FileNotFoundError:
        return {}


def running_info() -> dict[str, Any]:
    """The same facts for the torch in this process."""
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    }


def _release(version: str | None, parts: int) -> tuple[int, ...] | None:
    """Leading numeric parts of a version: ('2.14.1+cu130', 2) -> (2, 14)."""
    match = re.match(r"\d+(?:\.\d+)*", version or "")
    if not match:
        return None
    return tuple(int(p) for p in match.group().split(".")[:parts])


def _describe_built(info: dict[str, Any]) -> str:
    variant = info.get("variant")
    if variant == "cuda":
        kernels = f"CUDA {info.get('cuda')}"
    elif variant == "rocm":
        kernels = f"HIP {info.get('hip')}"
    else:
        kernels = "CPU"
    if info.get("stable_abi"):
        return f"torch>={info['stable_abi']} ({kernels}, stable ABI)"
    return f"torch {info.get('torch')} ({kernels})"


def _describe_running(info: dict[str, Any]) -> str:
    if info.get("hip"):
        return f"torch {info['torch']} (HIP {info['hip']})"
    if info.get("cuda"):
        return f"torch {info['torch']} (CUDA {info['cuda']})"
    return f"torch {info['torch']}"


def incompatible(built: dict[str, Any], running: dict[str, Any]) -> bool:
    """True when a library built with ``built`` must not load into ``running``.

    CPU kernels only need the same torch major.minor (torch keeps its C++ ABI
    within a minor series, not across). GPU kernels also need the runtime
    they were compiled for: the same CUDA major, or the same HIP major.minor.
    """
    if not built:
        return False  # a source checkout or a foreign build: nothing to compare
    if built.get("stable_abi"):
        # Only torch's C shims are called: any later torch serves, whatever its C++ ABI.
        if (_release(running["torch"], 2) or ()) < (_release(built["stable_abi"], 2) or ()):
            return True
    elif _release(built.get("torch"), 2) != _release(running["torch"], 2) or (
        built.get("cxx11_abi") is not None and built["cxx11_abi"] != running["cxx11_abi"]
    ):
        return True
    variant = built.get("variant")
    if variant == "cuda":
        return _release(running["cuda"], 1) != _release(built.get("cuda"), 1)
    if variant == "rocm":
        return _release(running["hip"], 2) != _release(built.get("hip"), 2)
    return False


def mismatch_message(built: dict[str, Any], running: dict[str, Any]) -> str:
    left, right = _describe_built(built), _describe_running(running)
    if (
        left.split(" (")[0] == right.split(" (")[0]
        and built.get("cxx11_abi") != running["cxx11_abi"]
    ):
        left += f" [C++11 ABI {int(bool(built.get('cxx11_abi')))}]"
        right += f" [C++11 ABI {int(running['cxx11_abi'])}]"
    return f"segment_ops: built for {left}; running {right} — {_HINT}"


def check_torch_compat(
    built: dict[str, Any] | None = None, running: dict[str, Any] | None = None
) -> None:
    """Raise ImportError (one line, both sides named) if the build cannot run here."""
    built = build_info() if built is None else built
    running = running_info() if running is None else running
    if incompatible(built, running):
        raise ImportError(mismatch_message(built, running))


def load_library() -> None:
    """Import ``segment_ops._C``, turning loader errors into one clear line.

    The module is empty; loading it runs the library's TORCH_LIBRARY
    registrations, after which the ops live under ``torch.ops.segment_ops``.
    """
    try:
        importlib.import_module("segment_ops._C")
    except (ImportError, OSError) as err:
        detail = " ".join(str(err).split())
        built, running = build_info(), running_info()
        raise ImportError(
            f"segment_ops: cannot load the compiled library ({detail}); "
            f"built for {_describe_built(built) if built else 'an unknown torch'}; "
            f"running {_describe_running(running)} — {_HINT}"
        ) from err
