"""Import, build facts, and the torch-mismatch check."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import segment_ops
from segment_ops import _compat

HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
BUILT_214_CU130 = {
    "torch": "2.14.1+cu130",
    "variant": "cuda",
    "cuda": "13.0",
    "hip": None,
    "cxx11_abi": True,
}
RUNNING_213_CPU = {"torch": "2.13.0+cpu", "cuda": None, "hip": None, "cxx11_abi": True}
STABLE_211_CU130 = {**BUILT_214_CU130, "torch": "2.11.0+cu130", "stable_abi": "2.11"}


def run_python(code, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )


def release(version):
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2])


def test_build_info_matches_running_torch():
    info = segment_ops.build_info()
    assert info["variant"] in {"cpu", "cuda", "rocm"}
    for key in ("cuda", "hip", "arch_list", "compiler", "nvcc", "version", "python_abi"):
        assert key in info
    if info.get("stable_abi"):
        # Targets the oldest torch it serves, built by that torch or a later one; this
        # one may be any release from the target on.
        assert release(info["stable_abi"]) <= release(info["torch"])
        assert release(info["stable_abi"]) <= release(torch.__version__)
        assert info["label"] == info["label"].lstrip("pt0123456789")  # the flavor alone
    else:
        assert release(info["torch"]) == release(torch.__version__)
        assert info["cxx11_abi"] == bool(torch._C._GLIBCXX_USE_CXX11_ABI)
        assert info["torch_git"] == torch.version.git_version
    if info["variant"] == "cuda":
        assert info["cuda"].split(".")[0] == torch.version.cuda.split(".")[0]
        assert info["arch_list"] and info["nvcc"]
    assert hasattr(torch.ops.segment_ops, "segment_sum")


def test_import_with_no_visible_gpu():
    result = run_python(
        "import torch, segment_ops;"
        "print(segment_ops.segment_sum(torch.ones(3, 2), torch.tensor([0, 1, 3])).tolist())",
        HIDE_GPUS,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[1.0, 1.0], [2.0, 2.0]]"


def test_triton_module_imports_without_gpu():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    # Importing must not touch the driver: no CUDA init, no triton driver query.
    result = run_python(
        "import torch, segment_ops._triton;"
        "assert not torch.cuda.is_initialized(), 'importing _triton initialised CUDA';"
        "print(torch.ops.segment_ops.segment_sum_triton)",
        HIDE_GPUS,
    )
    assert result.returncode == 0, result.stderr


def test_mismatch_message_is_one_line_naming_both_sides():
    with pytest.raises(ImportError) as caught:
        _compat.check_torch_compat(BUILT_214_CU130, RUNNING_213_CPU)
    assert str(caught.value) == (
        "segment_ops: built for torch 2.14.1+cu130 (CUDA 13.0); running torch 2.13.0+cpu"
        " — install the wheel built for your torch"
    )


@pytest.mark.parametrize(
    "built, running, bad",
    [
        (BUILT_214_CU130, RUNNING_213_CPU, True),  # other minor
        (
            BUILT_214_CU130,
            {**RUNNING_213_CPU, "torch": "2.14.0+cpu"},
            True,
        ),  # CUDA kernels, CPU torch
        (
            BUILT_214_CU130,
            {**RUNNING_213_CPU, "torch": "2.14.0", "cuda": "12.8"},
            True,
        ),  # CUDA major
        (
            BUILT_214_CU130,
            {**RUNNING_213_CPU, "torch": "2.14.0", "cuda": "13.2"},
            False,
        ),  # CUDA minor is fine
        (
            BUILT_214_CU130,
            {**RUNNING_213_CPU, "torch": "2.14.1", "cuda": "13.0", "cxx11_abi": False},
            True,
        ),
        (
            {**BUILT_214_CU130, "variant": "cpu", "cuda": None},
            {**RUNNING_213_CPU, "torch": "2.14.1"},
            False,
        ),
        (
            {**BUILT_214_CU130, "variant": "cpu", "cuda": None},
            {**RUNNING_213_CPU, "torch": "2.15.0"},
            True,
        ),
        (
            {**BUILT_214_CU130, "variant": "rocm", "cuda": None, "hip": "6.4.1"},
            {**RUNNING_213_CPU, "torch": "2.14.1+rocm6.4", "hip": "6.4.43"},
            False,
        ),
        (
            {**BUILT_214_CU130, "variant": "rocm", "cuda": None, "hip": "6.4.1"},
            {**RUNNING_213_CPU, "torch": "2.14.1+rocm7.0", "hip": "7.0.1"},
            True,
        ),
        ({}, RUNNING_213_CPU, False),  # never built: nothing to compare
        # Stable ABI: any torch from its target on, whatever the C++ ABI; GPU runtime as before.
        (STABLE_211_CU130, {**RUNNING_213_CPU, "torch": "2.15.0", "cuda": "13.2"}, False),
        (STABLE_211_CU130, {**RUNNING_213_CPU, "torch": "2.11.0", "cuda": "13.0",
                            "cxx11_abi": False}, False),
        (STABLE_211_CU130, {**RUNNING_213_CPU, "torch": "2.10.0", "cuda": "13.0"}, True),
        (STABLE_211_CU130, {**RUNNING_213_CPU, "torch": "2.14.1", "cuda": "12.8"}, True),
        (STABLE_211_CU130, {**RUNNING_213_CPU, "torch": "2.14.1+cpu"}, True),
        ({**STABLE_211_CU130, "variant": "cpu", "cuda": None}, RUNNING_213_CPU, False),
    ],
)
def test_incompatible(built, running, bad):
    assert _compat.incompatible(built, running) is bad


def test_stable_mismatch_names_the_range():
    with pytest.raises(ImportError) as caught:
        _compat.check_torch_compat(STABLE_211_CU130, {**RUNNING_213_CPU, "torch": "2.10.0"})
    assert str(caught.value) == (
        "segment_ops: built for torch>=2.11 (CUDA 13.0, stable ABI); running torch 2.10.0"
        " — install the wheel built for your torch"
    )


def test_check_uses_recorded_build_facts(monkeypatch):
    real = segment_ops.build_info()
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    newer = f"{major}.{minor + 1}"
    if real.get("stable_abi"):  # a stable build names the oldest torch it serves
        fake, shown = {**real, "stable_abi": newer}, f">={newer}"
    else:
        fake, shown = {**real, "torch": f"{newer}.0"}, f" {newer}.0"
    monkeypatch.setattr(_compat, "build_info", lambda: fake)
    with pytest.raises(ImportError, match=rf"built for torch{re.escape(shown)} .*; running torch "):
        _compat.check_torch_compat()
    monkeypatch.setattr(_compat, "build_info", lambda: real)
    _compat.check_torch_compat()


def test_loader_errors_become_one_clear_line(monkeypatch):
    def broken_import(name):
        raise OSError(f"{name}: undefined symbol:\n _ZN3c104impl3FooEv")

    monkeypatch.setattr(_compat.importlib, "import_module", broken_import)
    with pytest.raises(ImportError) as caught:
        _compat.load_library()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "segment_ops: cannot load the compiled library (segment_ops._C: undefined symbol:"
    )
    assert f"running torch {torch.__version__}" in message and message.endswith(
        "install the wheel built for your torch"
    )


def test_wrong_build_fails_at_import(tmp_path):
    """End to end: a copy of the installed package whose facts name another torch."""
    package = Path(segment_ops.__file__).parent
    copy = tmp_path / "segment_ops"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    facts = json.loads((copy / "_build_info.json").read_text())
    facts.update(torch="1.99.0+cu999", variant="cuda", cuda="99.0", stable_abi=None)
    (copy / "_build_info.json").write_text(json.dumps(facts))
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = run_python("import segment_ops", {"PYTHONPATH": path})
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(
        "ImportError: segment_ops: built for torch 1.99.0+cu999 (CUDA 99.0); running torch "
    )
    assert last_line.endswith(" — install the wheel built for your torch")
