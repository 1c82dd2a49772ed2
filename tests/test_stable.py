"""Stable-ABI cells: how a `stable` group expands, and the audit of the built library."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from extmatrix import symbols
from extmatrix.cells import plan_file
from extmatrix.errors import UserError
from extmatrix.index import page_names
from extmatrix.report import compile_counts
from extmatrix.toolchain import honoured_env

MATRIX = """\
extension: {{name: demo, import: demo, path: ext}}
axes:
  torch: ["2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]
  flavor: [cpu, cu128, cu130]
  python: ["3.11", "3.12"]
flavors:
  cpu: {{}}
  cu128: {{archs: ["9.0"]}}
  cu130: {{archs: ["9.0"]}}
stable:
{stable}
"""


def plan_text(tmp_path: Path, text: str):
    (tmp_path / "ext" / "tests").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ext" / "setup.py").write_text("")
    (tmp_path / "matrix.yaml").write_text(text)
    return plan_file(tmp_path / "matrix.yaml")


def plan(tmp_path: Path, stable: str):
    return plan_text(tmp_path, MATRIX.format(stable=stable))


def test_stable_group_replaces_the_per_torch_cells_it_serves(tmp_path):
    p = plan(tmp_path, '  - {from: "2.11", flavors: [cpu, cu130]}')
    ids = [c.id for c in p.cells]
    assert "stable2.11-cpu" in ids and "stable2.11-cu130" in ids
    # 2.10 is below the range; cu128 is not in the group: both keep per-torch cells.
    assert {"torch2.10-cpu", "torch2.10-cu130", "torch2.11-cu128"} <= set(ids)
    assert not any(i.startswith(("torch2.11-cpu", "torch2.13-cu130", "torch2.15-cpu"))
                   for i in ids)
    dropped = {d.combo: d.reason for d in p.dropped}
    assert dropped["torch 2.13.0 × cu130 × x86_64"] == (
        "served by the stable-ABI wheel of stable2.11-cu130")

    cell = p.cell("stable2.11-cu130")
    assert cell.torch == "2.11.0" and cell.stable == "2.11"
    assert cell.serves == ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
    assert cell.local_version == "cu130" and cell.requires_torch == "torch>=2.11"
    assert cell.torch_spec == "torch==2.11.0"
    assert cell.target_version == "0x020b000000000000"
    env = honoured_env(cell)
    assert env["TORCH_TARGET_VERSION"] == "0x020b000000000000"
    define = "-DTORCH_TARGET_VERSION=0x020b000000000000"
    assert env["NVCC_APPEND_FLAGS"] == env["CPPFLAGS"] == env["CXXFLAGS"] == define
    # A CPU build needs only headers and C shims: any build of the release will do.
    assert p.cell("stable2.11-cpu").torch_spec == "torch==2.11.0"
    assert "TORCH_TARGET_VERSION" not in honoured_env(p.cell("torch2.10-cpu"))


def test_upper_bound_and_toolkit_major(tmp_path):
    p = plan(tmp_path, '  - {from: "2.10", below: "2.14", flavors: [cu128], replace: false}')
    cell = p.cell("stable2.10-cu128")
    assert cell.requires_torch == "torch>=2.10,<2.14"
    # A CUDA 12.8 wheel serves the releases that still ship a CUDA 12 build.
    assert cell.serves == ("2.10.0", "2.11.0", "2.12.1", "2.13.0")
    assert "torch2.12-cu128" not in [c.id for c in p.cells]  # 2.12 has no cu128 at all
    assert "torch2.11-cu128" in [c.id for c in p.cells]  # replace: false keeps it


def test_index_pages_name_only_published_torch_builds(tmp_path):
    p = plan(tmp_path, '  - {from: "2.10", below: "2.14", flavors: [cu128], replace: false}')
    # 2.12 and 2.13 ship CUDA 12 only as 12.6 and 12.9: the wheel serves them, but no
    # torch 2.12.1+cu128 or 2.13.0+cu128 exists for a page to be named after.
    assert page_names(p.cell("stable2.10-cu128")) == ["torch-2.10.0+cu128", "torch-2.11.0+cu128"]
    assert page_names(p.cell("torch2.12-cu130")) == ["torch-2.12.1+cu130"]


NARROWING = """\
extension: {{name: demo, import: demo, abi3: {abi3}}}
axes:
  torch: {torch}
  flavor: [cpu]
  python: {python}
flavors:
  cpu: {{}}
stable:
  - {{from: "2.11", flavors: [cpu]}}
{extra}"""


def narrowing(tmp_path: Path, abi3: bool = True, extra: str = "",
              torch: str = '["2.11", "2.14", "2.15"]', python: str = '["3.10", "3.12"]'):
    return plan_text(tmp_path, NARROWING.format(abi3=str(abi3).lower(), extra=extra,
                                                torch=torch, python=python))


def test_per_torch_cells_keep_the_pythons_the_stable_wheel_cannot_serve(tmp_path):
    # torch 2.15 has no 3.10: the one wheel is tested on 3.12 only, and 2.11 and 2.14 keep
    # cells for 3.10, which they ship.
    p = narrowing(tmp_path)
    assert [(c.id, c.test_pythons) for c in p.cells] == [
        ("torch2.11-cpu", ("3.10",)), ("torch2.14-cpu", ("3.10",)),
        ("stable2.11-cpu", ("3.12",))]
    assert [(d.combo, d.cell) for d in p.dropped] == [
        ("py3.12 × torch 2.11.0 × cpu × x86_64", "torch2.11-cpu"),
        ("py3.12 × torch 2.14.1 × cpu × x86_64", "torch2.14-cpu"),
        ("torch 2.15.0 × cpu × x86_64", "torch2.15-cpu")]
    assert {d.reason for d in p.dropped} == {"served by the stable-ABI wheel of stable2.11-cpu"}
    with pytest.raises(UserError, match=r"^cell 'torch2.15-cpu' is replaced by stable2.11-cpu, "
                       r"the wheel of stable\[0\] \(.*matrix.yaml:\d+:\d+\); name "
                       r"'stable2.11-cpu' instead$"):
        p.cell("torch2.15-cpu")
    assert p.cell("torch2.11-cpu").test_pythons == ("3.10",)  # left for what it cannot serve
    # Without the group: a wheel for each of 2.11, 2.14, 2.15; the group stands in for one.
    assert compile_counts(p.cells, p.dropped) == (
        "3 compiles; 3 without the stable-ABI cells (1 stable wheels stand in for 1 per-torch "
        "wheels)")

    p = narrowing(tmp_path, abi3=False)
    assert [c.id for c in p.cells] == [
        "py3.10-torch2.11-cpu", "py3.10-torch2.14-cpu", "py3.12-stable2.11-cpu"]
    assert compile_counts(p.cells, p.dropped) == (
        "3 compiles; 5 without the stable-ABI cells (1 stable wheels stand in for 3 per-torch "
        "wheels)")

    # A rule may leave out what the stable wheel does not serve ...
    p = narrowing(tmp_path, extra='exclude:\n  - {torch: "2.11", python: "3.10"}\n')
    assert [c.id for c in p.cells] == ["torch2.14-cpu", "stable2.11-cpu"]
    # ... but not what it does.
    with pytest.raises(UserError, match=r"exclude\[0\] matches only cells that stable\[0\] "):
        narrowing(tmp_path, extra='exclude:\n  - {torch: "2.11", python: "3.12"}\n')


def test_a_free_threaded_python_keeps_its_per_torch_cells(tmp_path):
    # torch 2.14's only free-threaded build is 3.14t: the stable wheel, tested beside
    # 2.14 too, cannot serve 3.13t, which 2.11 ships.
    p = narrowing(tmp_path, torch='["2.11", "2.14"]', python='["3.12", "3.13t"]')
    assert [(c.id, c.test_pythons) for c in p.cells] == [
        ("py3.13t-torch2.11-cpu", ("3.13t",)), ("stable2.11-cpu", ("3.12",))]
    reasons = {d.combo: d.reason for d in p.dropped}
    assert reasons["torch 2.11.0 × cpu × x86_64"].startswith("served by the stable-ABI wheel")
    assert reasons["py3.13t × torch 2.14.1 × cpu × x86_64"] == (
        "torch 2.14 supports free-threaded Python 3.14t, not 3.13t")


MANGLED = {
    "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE":
        "c10",
    "_ZNK2at10TensorBase4sizeEl": "at",
    "_ZTVN5torch8autograd4NodeE": "torch",
    "_ZN6caffe28TypeMeta5_typeEv": "caffe2",
    "_ZNSt6vectorIlSaIlEE17_M_realloc_insertIJRKlEEEvN9__gnu_cxx17__normal_iteratorIPlS1_EEDpOT_":
        None,
    "_ZN8cutlass4gemmEv": None,
    "aoti_torch_get_dtype": None,
    "PyModule_Create2": None,
}


@pytest.mark.parametrize(("symbol", "namespace"), MANGLED.items())
def test_torch_namespace(symbol, namespace):
    assert symbols.torch_namespace(symbol) == namespace


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_audit_names_libtorch_cxx_symbols(tmp_path):
    """A library importing c10/at C++ symbols fails; shims and std:: are fine."""
    imports = ["aoti_torch_get_dtype", "torch_parallel_for",
               "_ZN3c106detail14torchCheckFailEPKcS2_jS2_", "_ZNK2at10TensorBase4sizeEl",
               "_ZNSt6chrono3_V212steady_clock3nowEv"]
    source = tmp_path / "lib.c"
    source.write_text("".join(f"extern void {s}(void);\n" for s in imports)
                      + "void use(void) {" + "".join(f" {s}();" for s in imports) + " }\n")
    library = tmp_path / "libdemo.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    result = symbols.audit(library)
    assert not result.ok
    assert result.torch_cxx == ("_ZN3c106detail14torchCheckFailEPKcS2_jS2_",
                                "_ZNK2at10TensorBase4sizeEl")
    assert result.shims == ("aoti_torch_get_dtype", "torch_parallel_for")
    message = symbols.problem(result)
    assert message.startswith("breaks the stable ABI: libdemo.so uses 2 libtorch C++ symbols "
                              "outside the stable C shims (")
    assert "at::TensorBase::size(long) const" in message or "_ZNK2at10TensorBase4sizeEl" in message

    clean = tmp_path / "libclean.so"
    source.write_text("extern void aoti_torch_get_dtype(void);\nvoid use(void) "
                      "{ aoti_torch_get_dtype(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(clean)], check=True)
    assert symbols.audit(clean).ok


def test_audit_refuses_what_is_not_elf(tmp_path):
    bogus = tmp_path / "libnot.so"
    bogus.write_text("not a library")
    with pytest.raises(ValueError, match="libnot.so is not an ELF shared library"):
        symbols.audit(bogus)



def test_compile_counts_with_groups_of_both_kinds_match_a_plan_without_them(tmp_path):
    mixed = plan(tmp_path, '  - {from: "2.11", flavors: [cpu]}\n'
                           '  - {from: "2.11", flavors: [cu130], replace: false}\n')
    without = len(plan(tmp_path, "  []\n").cells)
    assert compile_counts(mixed.cells, mixed.dropped) == (
        f"{len(mixed.cells)} compiles; 5 of them are per-torch wheels the stable-ABI wheels also "
        f"serve (replace: false): {len(mixed.cells) - 5} with replace: true, {without} without "
        "stable cells")


def test_a_stable_rocm_wheel_serves_only_torch_builds_of_its_rocm_minor(tmp_path):
    # torch 2.15 ships ROCm 7.14 and 10.0: a wheel built with ROCm 7.2 would be refused at
    # import there (HIP promises nothing across minors), though its major is 7.
    p = plan_text(tmp_path, MATRIX.format(stable='  - {from: "2.11", flavors: [rocm7.2]}')
                  .replace("flavor: [cpu, cu128, cu130]", "flavor: [cpu, rocm7.2]")
                  .replace('  cu128: {archs: ["9.0"]}\n', '  rocm7.2: {archs: [gfx942]}\n'))
    cell = p.cell("stable2.11-rocm7.2")
    assert cell.serves == ("2.11.0", "2.12.1", "2.13.0", "2.14.1")


def test_a_stable_gpu_wheel_is_tested_only_beside_a_build_of_its_toolkit_series(tmp_path):
    from extmatrix.backends.local import _foreign_build

    rocm = plan_text(tmp_path, MATRIX.format(stable='  - {from: "2.11", flavors: [rocm7.2]}')
                     .replace("flavor: [cpu, cu128, cu130]", "flavor: [cpu, rocm7.2]")
                     .replace('  cu128: {archs: ["9.0"]}\n', '  rocm7.2: {archs: [gfx942]}\n')
                     ).cell("stable2.11-rocm7.2")
    assert _foreign_build(rocm, {"cuda": None, "hip": "7.2.41134"}) is None
    assert _foreign_build(rocm, {"cuda": None, "hip": "7.14.0"}) == (
        "is a ROCm 7.14.0 build, not ROCm 7.2.x")
    cuda = plan(tmp_path, '  - {from: "2.11", flavors: [cu130]}').cell("stable2.11-cu130")
    assert _foreign_build(cuda, {"cuda": "13.2", "hip": None}) is None  # minor compatibility
    assert _foreign_build(cuda, {"cuda": "12.8", "hip": None}) == (
        "is a CUDA 12.8 build, not CUDA 13.x")
