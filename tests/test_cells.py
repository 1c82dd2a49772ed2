"""Cell expansion: ids, pins, per-cell settings, rules and selection."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from extmatrix.cells import plan_file
from extmatrix.cli import main
from extmatrix.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "matrix.yaml"


def write(tmp_path: Path, text: str) -> Path:
    """matrix.yaml in tmp_path, beside the smallest project its default `path: ext` takes."""
    (tmp_path / "ext" / "tests").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


SMALL = textwrap.dedent("""
    extension: {name: demo, import: demo, abi3: ABI3}
    axes:
      torch: ["2.11", "2.14.0"]
      flavor: [cpu, cu130, rocm7.2]
      python: ["3.10", "3.12"]
    defaults:
      cuda: {index: "https://idx/{flavor}", runtime_deps: [triton], base_image: "img:{toolkit}"}
    flavors:
      cpu: {}
      cu130: {archs: ["8.0", "9.0"], ptx: ["9.0"]}
      rocm7.2: {archs: [gfx942, gfx90a], runtime_deps: [pytorch-triton-rocm]}
""")


def small(tmp_path: Path, abi3: bool = True, extra: str = "") -> list:
    text = SMALL.replace("ABI3", str(abi3).lower()) + textwrap.dedent(extra)
    return plan_file(write(tmp_path, text)).cells


def test_abi3_cells_multiply_only_tests(tmp_path):
    cells = small(tmp_path)
    assert [c.id for c in cells] == [
        "torch2.11-cpu", "torch2.11-cu130", "torch2.11-rocm7.2",
        "torch2.14-cpu", "torch2.14-cu130",  # 2.14 ships ROCm 7.2 and 7.14 ...
        "torch2.14-rocm7.2",
    ]
    cell = cells[1]
    assert cell.torch == "2.11.0" and cell.test_pythons == ("3.10", "3.12")
    assert cell.python == "3.10"  # the oldest Python builds the abi3 wheel


def test_non_abi3_cells_carry_python(tmp_path):
    ids = [c.id for c in small(tmp_path, abi3=False)]
    assert ids[:2] == ["py3.10-torch2.11-cpu", "py3.12-torch2.11-cpu"]
    assert len(ids) == 12


def test_cell_fields(tmp_path):
    cpu, cuda, rocm = small(tmp_path)[3:6]
    assert cpu.torch_spec == "torch==2.14.0+cpu" and cpu.runtime_deps == ()
    assert cpu.arch_list == "" and cpu.toolkit is None
    assert cuda.torch == "2.14.0"  # an exact pin is kept, not bumped to the newest patch
    assert cuda.arch_list == "8.0;9.0+PTX"
    assert cuda.index == "https://idx/cu130" and cuda.base_image == "img:13.0"
    assert cuda.local_version == "pt214cu130" and cuda.requires_torch == "torch==2.14.*"
    assert cuda.runtime_deps == ("triton",) and cuda.cxx == 20
    assert rocm.arch_list == "gfx942;gfx90a" and rocm.runtime_deps == ("pytorch-triton-rocm",)
    assert rocm.image == "extmatrix-rocm:7.2" and rocm.toolkit == "7.2"


def test_exclude_and_include(tmp_path):
    plan = plan_file(write(tmp_path, SMALL.replace("ABI3", "true") + textwrap.dedent("""
        exclude:
          - {torch: "2.11", flavor: "rocm*", reason: too old}
        include:
          - {torch: "2.9", flavor: cu130, python: "3.12"}
    """)))
    ids = [c.id for c in plan.cells]
    assert "torch2.11-rocm7.2" not in ids
    assert ids[-1] == "torch2.9-cu130"
    assert plan.cells[-1].test_pythons == ("3.12",)
    (drop,) = [d for d in plan.dropped if "rocm7.2" in d.combo and "2.11" in d.combo]
    assert drop.reason.startswith("excluded by exclude[0] (") and drop.reason.endswith(": too old")


def test_python_exclude_on_abi3_needs_every_python(tmp_path):
    cells = small(tmp_path, extra="""
        exclude:
          - {torch: "2.11", python: "3.1*"}
    """)
    assert not [c for c in cells if c.torch_series == "2.11"]
    # A rule naming only some of an abi3 cell's Pythons drops nothing: it is an error.
    with pytest.raises(UserError, match="abi3"):
        small(tmp_path, extra="""
            exclude:
              - {torch: "2.11", python: "3.12"}
        """)


def test_dropped_reasons_explain_missing_combinations(tmp_path):
    path = write(tmp_path, SMALL.replace("ABI3", "true").replace('"2.14.0"]', '"2.14.0", "2.5"]'))
    plan = plan_file(path)
    reasons = {d.combo: d.reason for d in plan.dropped}
    assert reasons["torch 2.5.1 × cu130 × x86_64"] == (
        "torch 2.5 has no CUDA 13.0 build (it ships CUDA 11.8, 12.1, 12.4)")


def test_shipped_matrix_local_subset_is_the_three_local_cells(capsys):
    assert main(["plan", "--matrix", str(SHIPPED), "--subset", "local", "--json"]) == 0
    cells = json.loads(capsys.readouterr().out)["include"]
    assert [c["cell"] for c in cells] == ["torch2.11-cu130", "torch2.13-cpu", "torch2.14-cu130"]


def test_every_shipped_cell_carries_what_a_backend_needs():
    plan = plan_file(SHIPPED)
    assert len(plan.cells) > 20
    for cell in plan.cells:
        data = cell.to_json()
        assert data["torch"].count(".") == 2
        assert data["index"] and data["base_image"] and data["image"]
        if cell.stable:  # one wheel for many torch releases: labelled by flavor only
            assert data["local_version"] == cell.flavor
            assert data["requires_torch"] == f"torch>={cell.stable}"
            assert cell.torch in cell.serves and len(cell.serves) >= 3
        else:
            assert data["local_version"].startswith("pt")
            assert data["requires_torch"].startswith("torch==")
        if cell.family != "cpu":
            assert cell.arch_list and cell.toolkit
            assert cell.runtime_deps


@pytest.mark.parametrize(
    ("kwargs", "ids"),
    [
        ({"patterns": ["torch2.1[34]-cu13*"]},
         ["torch2.13-cu130", "torch2.13-cu132", "torch2.14-cu130", "torch2.14-cu132"]),
        ({"subset": "pr", "patterns": ["*cpu"]}, ["torch2.13-cpu"]),
        ({"cell_ids": ["torch2.11-cu130"]}, ["torch2.11-cu130"]),
    ],
)
def test_selection(kwargs, ids):
    assert [c.id for c in plan_file(SHIPPED).select(**kwargs)] == ids


def test_selection_that_matches_nothing_is_an_error():
    with pytest.raises(UserError, match="no cell matches"):
        plan_file(SHIPPED).select(subset="pr", patterns=["*rocm*"])


def project(folder: Path) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    return folder


def tiny(matrix: Path, extension: str) -> Path:
    matrix.parent.mkdir(parents=True, exist_ok=True)
    matrix.write_text(textwrap.dedent(f"""\
        extension: {{name: demo, import: demo, {extension}}}
        axes: {{torch: ["2.14"], flavor: [cpu], python: ["3.12"]}}
        flavors: {{cpu: {{}}}}
    """))
    return matrix


def test_the_repository_is_found_above_the_matrix_file(tmp_path):
    (tmp_path / ".git").mkdir()
    project(tmp_path / "ext")
    assert plan_file(tiny(tmp_path / "ci" / "matrix.yaml", "path: ../ext")).cells


@pytest.mark.parametrize("link", [False, True])
def test_an_extension_outside_the_repository_needs_allow_outside(tmp_path, link):
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    beside = project(tmp_path / "beside")
    path = "../beside"
    if link:  # a symlink in the repository counts where it leads
        (tmp_path / "repo" / "ext").symlink_to(beside)
        path = "ext"
    matrix = tiny(tmp_path / "repo" / "matrix.yaml", f"path: {path}")
    with pytest.raises(UserError, match=f"1:45: extension folder '{path}' lies outside the "
                       "repository; move it inside, or set 'allow_outside: true'"):
        plan_file(matrix)
    tiny(matrix, f"path: {path}, allow_outside: true")
    assert plan_file(matrix).cells


def test_a_matrix_outside_any_repository_keeps_its_extension_beside_it(tmp_path):
    project(tmp_path / "ext")
    matrix = tiny(tmp_path / "sub" / "matrix.yaml", "path: ../ext")
    with pytest.raises(UserError, match="lies outside the repository"):
        plan_file(matrix)


def test_a_tests_folder_that_links_out_of_the_extension_is_refused(tmp_path):
    ext = tmp_path / "ext"
    (ext / "src").mkdir(parents=True)
    (ext / "setup.py").write_text("")
    (ext / "tests").symlink_to(tmp_path)
    with pytest.raises(UserError, match="1:12: tests folder 'tests' leads outside 'ext'"):
        plan_file(tiny(tmp_path / "matrix.yaml", "path: ext"))


@pytest.mark.parametrize(("settings", "message"), [
    # Release numbers, not text prefixes: 7.14 is not a 7.1 release.
    ('rocm7.1: {archs: [gfx942], toolkit: "7.14"}',
     "toolkit 7.14 does not match flavor rocm7.1; use a ROCm 7.1.x version"),
    ('cu130: {archs: ["9.0af"]}', "CUDA 13.0 cannot target arch '9.0af'"),
])
def test_versions_and_archs_compare_exactly(tmp_path, settings, message):
    text = SMALL.replace("ABI3", "true").replace("rocm7.2: {", f"{settings}\n  rocm7.2: {{")
    if "rocm7.1" in settings:
        text = text.replace("[cpu, cu130, rocm7.2]", "[cpu, cu130, rocm7.1, rocm7.2]")
    else:
        text = text.replace('  cu130: {archs: ["8.0", "9.0"], ptx: ["9.0"]}\n', "")
    with pytest.raises(UserError, match=re.escape(message)):
        plan_file(write(tmp_path, text))


def test_a_rocm_patch_release_is_a_release_of_its_flavor(tmp_path):
    text = SMALL.replace("ABI3", "true").replace("rocm7.2: {", 'rocm7.2: {toolkit: "7.2.1", ')
    (rocm,) = [c for c in plan_file(write(tmp_path, text)).cells if c.id == "torch2.14-rocm7.2"]
    assert rocm.toolkit == "7.2.1"


def test_init_names_the_git_commit_this_engine_came_from(monkeypatch):
    import json as json_module

    from extmatrix import init

    class Installed:
        def __init__(self, record):
            self.record = record

        def read_text(self, name):
            assert name == "direct_url.json"
            return json_module.dumps(self.record) if self.record else None

    def installed(record):
        monkeypatch.setattr(init.metadata, "distribution", lambda name: Installed(record))
        return init.installed_engine_spec()

    assert installed({"url": "https://github.com/o/extmatrix.git",
                      "vcs_info": {"vcs": "git", "commit_id": "abc123"}}) == \
        "extmatrix @ git+https://github.com/o/extmatrix.git@abc123"
    assert installed({"url": "file:///home/me/extmatrix", "dir_info": {"editable": True}}) is None
    assert installed(None) is None


@pytest.mark.parametrize("name, full_history", [("scm-version", True), ("triton-kernels", False)])
def test_init_checks_out_the_tags_an_extension_takes_its_version_from(tmp_path, name,
                                                                      full_history):
    import shutil

    import yaml

    from extmatrix import init

    ext = tmp_path / name
    shutil.copytree(Path(__file__).parent / "extensions" / name, ext)
    init.write(ext, tmp_path / "matrix.yaml", torch="2.14", pythons=None,
               engine_spec="extmatrix @ git+https://example.org/extmatrix@v1",
               with_workflow=True, force=False)
    jobs = yaml.safe_load((tmp_path / init.WORKFLOW).read_text())["jobs"]
    checkout = jobs["cell"]["steps"][0]["with"]
    assert ("fetch-depth" in checkout) is full_history
    if full_history:
        assert checkout["fetch-depth"] == 0  # a shallow clone has no tags: version 0.1.devN


def test_init_reads_the_name_setup_passes_not_an_extension_module_name(tmp_path):
    from extmatrix import init

    ext = tmp_path / "ext"
    (ext / "tests").mkdir(parents=True)
    (ext / "segment_ops").mkdir()
    (ext / "segment_ops" / "__init__.py").write_text("")
    (ext / "setup.py").write_text(
        "from setuptools import setup\n"
        "from torch.utils.cpp_extension import CUDAExtension\n"
        'modules = [CUDAExtension(name="segment_ops._C", sources=["csrc/ops.cu"])]\n'
        'setup(name="segment-ops", version="0.1", ext_modules=modules)\n')
    # A tool section setup.cfg's reader refuses: the name still comes from setup.py.
    (ext / "setup.cfg").write_text("[flake8]\nmax-line-length = 99\nmax-line-length = 100\n")
    project = init.describe(ext)
    assert (project.name, project.import_name) == ("segment-ops", "segment_ops")


def test_init_without_a_stated_name_says_where_to_state_it(tmp_path):
    from extmatrix import init

    ext = tmp_path / "ext"
    (ext / "tests").mkdir(parents=True)
    (ext / "setup.py").write_text("from setuptools import setup\nsetup(name=NAME)\n")
    with pytest.raises(UserError,
                       match=r"no distribution name found .* under \[metadata\] in setup.cfg"):
        init.describe(ext)


def test_the_plan_table_lists_free_threaded_pythons(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line a row
    text = SMALL.replace("ABI3", "true").replace('python: ["3.10", "3.12"]',
                                                 'python: ["3.14t", "3.12", "3.13", "3.14"]')
    assert main(["plan", "--matrix", str(write(tmp_path, text))]) == 0
    rows = [[field.strip() for field in line.split("│")[1:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    pythons = {row[0]: row[4] for row in rows}
    assert pythons["py3.14t-torch2.11-cpu"] == "3.14t"
    assert pythons["torch2.11-cpu"] == "3.12–3.14"


@pytest.mark.parametrize("axes, message", [
    ('python: ["3.9", "3.10", "3.12"]',
     r":\d+:\d+: python '3.9' yields no cell: no torch on the axes supports it \(torch 2.11: "
     r"3.10–3.14; torch 2.14: 3.10–3.14\)"),
    ('python: ["3.10", "3.12", "3.10"]', r":\d+:\d+: python '3.10' is listed twice; list each"),
    ('flavor: [cpu, cu130, rocm7.2, cpu]', r"flavor 'cpu' is listed twice"),
])
def test_a_python_that_yields_nothing_or_a_value_listed_twice_is_an_error(tmp_path, axes,
                                                                           message):
    text = SMALL.replace("ABI3", "true")
    key = axes.split(":")[0]
    text = re.sub(rf"{key}: \[.*\]", axes, text)
    with pytest.raises(UserError, match=message):
        plan_file(write(tmp_path, text))


def test_abi3_exclude_of_pythons_torch_never_served_is_accepted(tmp_path):
    """torch 2.14 stops at 3.14: a rule leaving 3.15 out of its cell agrees with torch and
    takes nothing from the one wheel, which serves 3.11-3.14."""
    plan = plan_file(write(tmp_path, textwrap.dedent("""
        extension: {name: demo, import: demo, abi3: true}
        axes:
          torch: ["2.14", "2.15"]
          flavor: [cpu]
          python: ["3.11", "3.12", "3.13", "3.14", "3.15"]
        flavors:
          cpu: {}
        exclude:
          - {torch: "2.14", python: "3.15*"}
    """)))
    assert [(c.id, c.test_pythons) for c in plan.cells] == [
        ("torch2.14-cpu", ("3.11", "3.12", "3.13", "3.14")),
        ("torch2.15-cpu", ("3.11", "3.12", "3.13", "3.14", "3.15")),
    ]


def test_a_gpu_runner_tests_only_x86_64_cells(tmp_path, capsys):
    """Like `runner`, a flavor's gpu_runner is an x86_64 machine: an aarch64 wheel could
    not be installed there."""
    path = write(tmp_path, textwrap.dedent("""
        extension: {name: demo, import: demo}
        axes: {torch: ["2.14"], flavor: [cu130], python: ["3.12"], platform: [x86_64, aarch64]}
        flavors:
          cu130: {archs: ["9.0"], runner: big-x86, gpu_runner: gpu-x86}
        platforms: {x86_64: {runner: ubuntu-24.04}, aarch64: {runner: ubuntu-24.04-arm}}
    """))
    assert [(c.id, c.runner, c.gpu_runner) for c in plan_file(path).cells] == [
        ("torch2.14-cu130", "big-x86", "gpu-x86"),
        ("torch2.14-cu130-aarch64", "ubuntu-24.04-arm", None)]
    assert main(["plan", "--matrix", str(path), "--json", "--for", "gpu"]) == 0
    cells = json.loads(capsys.readouterr().out)["include"]
    assert [c["cell"] for c in cells] == ["torch2.14-cu130"]


def test_a_free_threaded_python_is_named_against_torchs_free_threaded_builds(tmp_path):
    """torch 2.14 covers 3.10-3.14, but its only free-threaded build is 3.14t: that list,
    not the range, says why 3.13t is missing."""
    text = textwrap.dedent("""
        extension: {name: demo, import: demo}
        axes: {torch: ["2.11", "2.14"], flavor: [cpu], python: ["3.12", "3.13t"]}
        flavors: {cpu: {}}
    """)
    plan = plan_file(write(tmp_path, text))
    assert "py3.13t-torch2.11-cpu" in [c.id for c in plan.cells]
    reasons = {d.combo: d.reason for d in plan.dropped}
    assert reasons["py3.13t × torch 2.14.1 × cpu × x86_64"] == (
        "torch 2.14 supports free-threaded Python 3.14t, not 3.13t")
    include = 'include:\n  - {torch: "2.14", flavor: cpu, python: "3.13t"}\n'
    with pytest.raises(UserError, match=re.escape(
            "torch 2.14 supports free-threaded Python 3.14t, not 3.13t; pick a supported")):
        plan_file(write(tmp_path, text + include))


def test_a_named_cell_outside_the_named_subset_says_so(capsys):
    assert main(["plan", "--matrix", str(SHIPPED), "--subset", "local", "--cell",
                 "torch2.11-cpu"]) == 2
    assert capsys.readouterr().err == ("extmatrix: cell 'torch2.11-cpu' is not in subset "
                                       "'local'; drop --subset local, or name a cell of it\n")
