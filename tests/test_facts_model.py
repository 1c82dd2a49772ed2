"""Facts that used to be wrong, each pinned: published flavors, arch variants per CUDA
version (and read back from binaries), free-threaded Pythons."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import pytest

from extmatrix import wheels
from extmatrix.cells import plan_file
from extmatrix.cli import main


def matrix(tmp_path: Path, torch: str, flavor: str, settings: str, python: str = '"3.12"',
           abi3: str = "true") -> Path:
    (tmp_path / "ext" / "tests").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(f"""\
        extension: {{name: demo, import: demo, abi3: {abi3}}}
        axes:
          torch: ["{torch}"]
          flavor: [{flavor}]
          python: [{python}]
        flavors:
          {flavor}: {settings}
        """))
    return path


def test_torch_2_10_has_a_cu129_cell(tmp_path):
    plan = plan_file(matrix(tmp_path, "2.10", "cu129", "{archs: ['9.0']}"))
    assert [c.id for c in plan.cells] == ["torch2.10-cu129"]


@pytest.mark.parametrize("torch, flavor, arch, message", [
    ("2.6", "cu118", "9.0a",
     "CUDA 11.8 cannot target arch '9.0a'; its 'a' targets are none"),
    ("2.8", "cu128", "12.0f",
     "CUDA 12.8 cannot target arch '12.0f'; its 'f' targets are none"),
    ("2.14", "cu130", "8.6a",
     "CUDA 13.0 cannot target arch '8.6a'; its 'a' targets are 9.0a, 10.0a, 10.3a, 11.0a, "
     "12.0a, 12.1a"),
])
def test_arch_variants_nvcc_refuses_are_refused_in_one_line(tmp_path, capsys, torch, flavor,
                                                            arch, message):
    path = matrix(tmp_path, torch, flavor, f"{{archs: ['{arch}']}}")
    assert main(["plan", "--matrix", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"{path}:7:19: {message}"  # at the arch itself


def test_arch_variants_the_toolkit_has_plan(tmp_path):
    plan = plan_file(matrix(tmp_path, "2.14", "cu130", "{archs: ['9.0a', '10.0f', '12.0']}"))
    assert plan.cells[0].arch_list == "9.0a;10.0f;12.0"


def test_a_9_0a_cell_passes_when_the_binary_holds_sm_90a(tmp_path):
    cell = plan_file(matrix(tmp_path, "2.14", "cu130", "{archs: ['9.0a'], ptx: ['9.0a']}")
                     ).cells[0]
    wheel = tmp_path / "demo-1.0+pt214cu130-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo-1.0+pt214cu130.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: demo\nVersion: 1.0+pt214cu130\n"
                    "Requires-Dist: torch==2.14.*\n")
        zf.writestr("demo/_C.abi3.so", b"\x7fELF")
    cuobjdump = tmp_path / "cuobjdump"  # lists what a real one prints for such a binary
    cuobjdump.write_text("#!/bin/sh\necho 'ELF file    1: _C.abi3.1.sm_90a.cubin'\n"
                         "echo 'PTX file    1: _C.abi3.1.sm_90a.ptx'\n")
    cuobjdump.chmod(0o755)
    facts = wheels.inspect(wheel, cell, cuobjdump)
    assert (facts.sass, facts.ptx, facts.problems) == (["9.0a"], ["9.0a"], [])


def test_free_threaded_pythons_are_cells_of_their_own(tmp_path):
    plan = plan_file(matrix(tmp_path, "2.11", "cpu", "{}", python='"3.12", "3.13", "3.13t"'))
    assert [(c.id, c.abi3, c.test_pythons) for c in plan.cells] == [
        ("torch2.11-cpu", True, ("3.12", "3.13")),
        ("py3.13t-torch2.11-cpu", False, ("3.13t",)),
    ]
    dropped = plan_file(matrix(tmp_path, "2.14", "cpu", "{}", python='"3.12", "3.13t"'))
    assert [c.id for c in dropped.cells] == ["torch2.14-cpu"]  # 2.14 ships cp314t only
    assert any("3.13t" in d.combo for d in dropped.dropped)


def test_outdated_proposes_the_new_torch_with_its_flavors_and_pythons(tmp_path, capsys):
    import datetime

    from extmatrix import outdated

    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent("""\
        extension: {name: demo, import: demo}
        axes:
          torch: ["2.13", "2.14"]   # the two newest we support
          flavor: [cpu, cu126, cu130]
          python: ["3.10", "3.12"]
        flavors:
          cpu: {}
          cu126: {archs: ["8.0"]}
          cu130: {archs: ["8.0"]}
        exclude:
          - {torch: "2.1[3-4]", flavor: cu126}
        """))
    plan = plan_file(path)
    found = [str(c) for c in outdated.changes(plan, datetime.date(2026, 11, 22))]
    assert found == [
        "add torch 2.15: torch 2.15.0 was released 2026-10-28, with cpu, cu130, cu132, "
        "rocm7.2, rocm7.14 and Python 3.11–3.15",
        "add flavor cu132: torch 2.15 publishes it",
        "add flavor rocm7.2: torch 2.15 publishes it",
        "add flavor rocm7.14: torch 2.15 publishes it",
        "add python 3.11: a torch of the matrix supports it",
        "add python 3.13: a torch of the matrix supports it",
        "add python 3.14: a torch of the matrix supports it",
        "add python 3.15: a torch of the matrix supports it",
        "drop python 3.10: past its end of life (2026-10-31)",
    ]
    diff = outdated.patch(plan, outdated.changes(plan, datetime.date(2026, 11, 22)))
    assert '+  torch: ["2.13", "2.14", "2.15"]   # the two newest we support' in diff
    assert "+  flavor: [cpu, cu126, cu130, cu132, rocm7.2, rocm7.14]" in diff
    assert '+  python: ["3.11", "3.12", "3.13", "3.14", "3.15"]' in diff
    assert main(["plan", "--matrix", str(path), "--outdated", "--check"]) == 1
    assert "# add torch 2.15" in capsys.readouterr().out


def test_facts_that_hold_for_one_patch_or_one_rocm_index_only(tmp_path, capsys):
    exact = matrix(tmp_path, "2.12.0", "cu129", "{archs: ['9.0']}")
    assert main(["plan", "--matrix", str(exact)]) == 2
    assert "torch 2.12.0 has no CUDA 12.9 build (only 2.12.1)" in capsys.readouterr().err
    newest = plan_file(matrix(tmp_path, "2.12", "cu129", "{archs: ['9.0']}"))
    assert [c.torch for c in newest.cells] == ["2.12.1"]  # X.Y pins the patch that has it
    rocm = matrix(tmp_path, "2.5", "rocm6.2.4", "{archs: [gfx90a]}")
    assert main(["plan", "--matrix", str(rocm)]) == 2
    assert "torch 2.5 has no ROCm 6.2.4 build (it ships ROCm 6.1, 6.2)" in capsys.readouterr().err


def test_aarch64_cuda_flavors_are_those_published_for_aarch64(tmp_path, capsys):
    def arm(torch: str, flavor: str) -> Path:
        path = matrix(tmp_path, torch, flavor, "{archs: ['9.0']}")
        path.write_text(path.read_text().replace("python:", "platform: [aarch64]\n  python:")
                        + "platforms: {aarch64: {runner: ubuntu-24.04-arm}}\n")
        return path

    assert [c.id for c in plan_file(arm("2.7", "cu128")).cells] == ["torch2.7-cu128-aarch64"]
    assert [c.id for c in plan_file(arm("2.8", "cu129")).cells] == ["torch2.8-cu129-aarch64"]
    assert main(["plan", "--matrix", str(arm("2.7", "cu126"))]) == 2
    assert ("torch 2.7 has no CUDA 12.6 build for aarch64 (it ships CUDA 12.8 there)"
            in capsys.readouterr().err)
