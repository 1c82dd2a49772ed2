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
from extmatrix.errors import UserError


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
    # Lists what a real one prints for such a binary, each kind only when asked for it.
    cuobjdump = tmp_path / "cuobjdump"
    cuobjdump.write_text("#!/bin/sh\nfor a in \"$@\"; do case $a in\n"
                         "--list-elf) echo 'ELF file    1: _C.abi3.1.sm_90a.cubin';;\n"
                         "--list-ptx) echo 'PTX file    1: _C.abi3.1.sm_90a.ptx';;\n"
                         "esac; done\n")
    cuobjdump.chmod(0o755)
    facts = wheels.inspect(wheel, cell, cuobjdump)
    assert (facts.sass, facts.ptx, facts.problems) == (["9.0a"], ["9.0a"], [])


def test_free_threaded_pythons_are_cells_of_their_own(tmp_path):
    plan = plan_file(matrix(tmp_path, "2.11", "cpu", "{}", python='"3.12", "3.13", "3.13t"'))
    assert [(c.id, c.abi3, c.test_pythons) for c in plan.cells] == [
        ("torch2.11-cpu", True, ("3.12", "3.13")),
        ("py3.13t-torch2.11-cpu", False, ("3.13t",)),
    ]
    both = plan_file(matrix(tmp_path, '2.11", "2.14', "cpu", "{}", python='"3.12", "3.13t"'))
    assert [c.id for c in both.cells] == ["torch2.11-cpu", "py3.13t-torch2.11-cpu",
                                          "torch2.14-cpu"]  # 2.14 ships cp314t only
    assert any("3.13t" in d.combo for d in both.dropped)
    # A Python no torch on the axes ships is a mistake, as a torch or flavor would be.
    with pytest.raises(UserError, match=r"python '3.13t' yields no cell: no torch on the axes"):
        plan_file(matrix(tmp_path, "2.14", "cpu", "{}", python='"3.12", "3.13t"'))


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
        "rocm7.14, rocm10.0 and Python 3.11–3.15",
        "add flavor cu132: torch 2.15 publishes it",  # not ROCm: the matrix builds none
        "add python 3.11: a torch of the matrix supports it",
        "add python 3.13: a torch of the matrix supports it",
        "add python 3.14: a torch of the matrix supports it",
        "add python 3.15: a torch of the matrix supports it",
        "drop python 3.10: past its end of life (2026-10-31)",
    ]
    diff = outdated.patch(plan, outdated.changes(plan, datetime.date(2026, 11, 22)))
    assert '+  torch: ["2.13", "2.14", "2.15"]   # the two newest we support' in diff
    assert "+  flavor: [cpu, cu126, cu130, cu132]" in diff
    assert '+  python: ["3.11", "3.12", "3.13", "3.14", "3.15"]' in diff
    assert main(["plan", "--matrix", str(path), "--outdated", "--check"]) == 1
    assert "# add torch 2.15" in capsys.readouterr().out


def test_outdated_keeps_to_the_pythons_the_project_accepts(tmp_path, capsys):
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text(
        "[project]\nname = 'demo'\nrequires-python = '>=3.13'\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent("""\
        extension: {name: demo, import: demo}
        axes:
          torch: ["2.15"]
          flavor: [cpu, cu130, cu132, rocm7.14, rocm10.0]
          python: ["3.12", "3.13", "3.14", "3.15"]
        flavors:
          cpu: {}
          cu130: {archs: ["8.0"]}
          cu132: {archs: ["8.0"]}
          rocm7.14: {archs: [gfx942]}
          rocm10.0: {archs: [gfx942]}
        """))
    assert main(["plan", "--matrix", str(path), "--outdated", "--check"]) == 1
    out = capsys.readouterr().out
    assert "# drop python 3.12: the project requires Python >=3.13\n" in out
    assert "add python" not in out  # 3.11 is supported by torch 2.15, refused by the project


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


# ------------------------------------------------- ROCm arch lists per torch release


def rocm_matrix(tmp_path: Path, torches: list[str], flavor: str, archs: list[str],
                extra: str = "") -> Path:
    (tmp_path / "ext" / "tests").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(f"""\
        extension: {{name: demo, import: demo, abi3: true}}
        axes:
          torch: [{", ".join(f'"{t}"' for t in torches)}]
          flavor: [{flavor}]
          python: ["3.12"]
        flavors:
          {flavor}: {{archs: [{", ".join(archs)}]}}
        """) + extra)
    return path


@pytest.mark.parametrize("torch, flavor, arch, built", [
    ("2.5", "rocm6.1", "gfx1101", False),  # pytorch/pytorch#141667 landed after the 2.5 cut
    ("2.6", "rocm6.1", "gfx1101", True),
    ("2.6", "rocm6.2.4", "gfx1102", False),  # #147761: 2025-02-24, after the 2.6 cut
    ("2.7", "rocm6.2.4", "gfx1102", True),
    ("2.6", "rocm6.2.4", "gfx1201", False),  # #148562: gfx12 from 2.7 on
    ("2.7", "rocm6.3", "gfx1201", True),
    ("2.10", "rocm7.0", "gfx950", True),  # gated on ROCm >= 7.0 until #167299 (see below)
    ("2.12", "rocm7.1", "gfx1103", False),  # #179653 landed after the 2.12 cut
    ("2.12", "rocm7.2", "gfx1103", False),
    ("2.13", "rocm7.1", "gfx1103", True),
    ("2.13", "rocm7.2", "gfx1103", True),
    ("2.14", "rocm7.2", "gfx906", True),  # the legacy OS-package build keeps gfx900/gfx906
    ("2.14", "rocm7.14", "gfx1250", False),  # #196610: after the 2.14 cut
    ("2.15", "rocm7.14", "gfx1250", True),
])
def test_rocm_archs_are_those_of_the_torch_release(tmp_path, torch, flavor, arch, built):
    plan = plan_file(rocm_matrix(tmp_path, [torch], flavor, ["gfx90a", arch]))
    (cell,) = plan.cells
    assert cell.archs == (("gfx90a", arch) if built else ("gfx90a",))
    assert cell.arch_list == ";".join(cell.archs)
    narrowed = [d for d in plan.dropped if d.combo.endswith(f"× {arch}")]
    assert [d.reason for d in narrowed] == ([] if built else [
        f"torch {torch} {flavor} wheels are not built for {arch}"])


def test_one_rocm_flavor_spans_releases_with_different_lists(tmp_path, capsys):
    plan = plan_file(rocm_matrix(tmp_path, ["2.12", "2.13"], "rocm7.2", ["gfx942", "gfx1103"]))
    assert [(c.id, c.arch_list) for c in plan.cells] == [
        ("torch2.12-rocm7.2", "gfx942"), ("torch2.13-rocm7.2", "gfx942;gfx1103")]
    assert [(d.combo, d.reason) for d in plan.dropped] == [
        ("torch 2.12.1 × rocm7.2 × x86_64 × gfx1103",
         "torch 2.12 rocm7.2 wheels are not built for gfx1103")]
    # A release left with none of the flavor's archs has no cell; as an axis value, that is
    # reported like any other combination that cannot exist.
    path = rocm_matrix(tmp_path, ["2.12", "2.13"], "rocm7.2", ["gfx1103"])
    assert main(["plan", "--matrix", str(path)]) == 2
    assert "torch '2.12' yields no cell: torch 2.12 rocm7.2 wheels are built for none of " \
           "gfx1103" in capsys.readouterr().err


def test_rocm_7_14_builds_start_at_gfx908(tmp_path, capsys):
    from extmatrix.compat import Compat

    compat = Compat.load()
    assert compat.toolkit("rocm", "7.14").archs[0] == "gfx908"
    assert compat.rocm_archs("2.14", "7.14")[0] == "gfx908"
    assert compat.rocm_archs("2.14", "7.2")[:3] == ["gfx900", "gfx906", "gfx908"]
    assert not {"gfx900", "gfx906"} & set(compat.toolkit_archs("rocm", "7.14"))
    path = rocm_matrix(tmp_path, ["2.14"], "rocm7.14", ["gfx906"])
    assert main(["plan", "--matrix", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"{path}:7:22: ROCm 7.14 cannot target arch 'gfx906'; it targets "
                           "gfx908, gfx90a, ")
    # No release built gfx950 against ROCm 6.4 (2.8, 2.9): refused like a typo.
    path = rocm_matrix(tmp_path, ["2.9"], "rocm6.4", ["gfx950"])
    assert main(["plan", "--matrix", str(path)]) == 2
    assert "ROCm 6.4 cannot target arch 'gfx950'" in capsys.readouterr().err


def test_torch_2_15_ships_rocm_7_14_and_10_0(tmp_path, capsys):
    plan = plan_file(rocm_matrix(tmp_path, ["2.15"], "rocm10.0", ["gfx942", "gfx1250"]))
    assert [(c.id, c.arch_list) for c in plan.cells] == [("torch2.15-rocm10.0", "gfx942;gfx1250")]
    assert main(["plan", "--matrix", str(rocm_matrix(tmp_path, ["2.15"], "rocm7.2",
                                                     ["gfx942"]))]) == 2
    assert "torch 2.15 has no ROCm 7.2 build (it ships ROCm 7.14, 10.0)" in capsys.readouterr().err


def test_a_stable_rocm_wheel_keeps_an_arch_a_torch_it_serves_has(tmp_path):
    path = rocm_matrix(tmp_path, ["2.12", "2.13"], "rocm7.2", ["gfx942", "gfx1103"],
                       extra='stable:\n  - {from: "2.12", flavors: [rocm7.2]}\n')
    plan = plan_file(path)
    assert [(c.id, c.arch_list, c.serves) for c in plan.cells] == [
        ("stable2.12-rocm7.2", "gfx942;gfx1103", ("2.12.1", "2.13.0"))]


def test_rocm_archs_must_name_a_flavor_the_release_ships(tmp_path):
    import yaml

    from extmatrix.compat import BUILTIN, Compat
    from extmatrix.errors import UserError

    data = yaml.safe_load(BUILTIN.read_text())
    data["torch"]["2.13"]["rocm_archs"] = {"7.14": ["gfx942"]}
    path = tmp_path / "compat.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=r"rocm_archs names ROCm 7\.14, which is not in rocm "
                                        r"\(7\.1, 7\.2\)"):
        Compat.load(path)


@pytest.mark.parametrize("torch, flavor, published", [
    ("2.8", "cu126", False),  # 2.8 had cu129 sbsa wheels only
    ("2.8", "cu129", True),
    ("2.9", "cu126", True),  # pytorch/pytorch#162364 brought 12.6 and 12.8 back to sbsa
    ("2.9", "cu130", True),
    ("2.10", "cu129", True),
])
def test_aarch64_cuda_flavors_per_release(tmp_path, torch, flavor, published):
    from extmatrix.compat import Compat

    assert (Compat.load().why_not(torch, "cuda", flavor_toolkit(flavor), "aarch64")
            is None) == published


def flavor_toolkit(flavor: str) -> str:
    from extmatrix.config import flavor_toolkit as implied

    return implied(flavor) or ""


def test_outdated_never_proposes_a_matrix_without_a_python(tmp_path, capsys):
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text(
        "[project]\nname = 'demo'\nrequires-python = '<3.11'\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent("""\
        extension: {name: demo, import: demo}
        axes:
          torch: ["2.14"]
          flavor: [cpu]
          python: ["3.10"]
        flavors:
          cpu: {}
        """))
    assert main(["plan", "--matrix", str(path), "--outdated", "--check"]) == 1
    out = capsys.readouterr().out
    # torch 2.15 ships no Python the project takes: not proposed.
    assert "add torch" not in out
    assert "# drop python 3.10: past its end of life (2026-10-31)\n" in out
    assert "# axes.python stays as it is: the changes would leave it empty" in out
    assert "python:" not in "".join(line for line in out.splitlines(keepends=True)
                                    if line.startswith(("+", "-")))


def test_outdated_says_when_its_patch_leaves_a_rule_matching_nothing(tmp_path, capsys):
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent("""\
        extension: {name: demo, import: demo, abi3: false}
        axes:
          torch: ["2.14", "2.15"]
          flavor: [cpu]
          python: ["3.10", "3.12"]
        flavors:
          cpu: {}
        exclude:
          - {python: "3.10", torch: "2.14"}
        """))
    assert main(["plan", "--matrix", str(path), "--outdated"]) == 0
    out = capsys.readouterr().out
    assert "# applied as it is, the patch makes a matrix that is refused: matrix.yaml:9:5: " \
           "exclude[0] matches no combination of the axes" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext", "matrix.yaml"]  # no copy left


def test_a_toolkit_written_with_a_leading_zero_is_the_same_release(tmp_path):
    (cell,) = plan_file(matrix(tmp_path, "2.14", "cu130", '{toolkit: "13.00", archs: ["9.0"]}')
                        ).cells
    assert cell.toolkit == "13.0"
