"""cibuildwheel's configuration per cell, the repaired-wheel check, and the container backend's
refusals; nothing here starts a container."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from cibuildwheel.environment import parse_environment
from cibuildwheel.util.helpers import prepare_command

from extmatrix import cibw, engines, workspace
from extmatrix import steps as steps_module
from extmatrix.backends import Context, container, local
from extmatrix.cells import plan_file
from extmatrix.config import Extension
from extmatrix.engines import Engine
from extmatrix.envs import Sources
from extmatrix.errors import StepFailed
from extmatrix.report import CellReport
from extmatrix.toolchain import NotBuildable

ROOT = Path(__file__).resolve().parent.parent
PLAN = plan_file(ROOT / "matrix.yaml")
EXT = PLAN.matrix.extension
# Fixed, so host paths never reach the golden files.
BUILD_REQUIRES = ["setuptools>=64", "wheel", "ninja", "pip"]
# Where the model extension's tests take their pytest settings from, in the extension.
PYTEST_SETTINGS = workspace.pytest_settings(ROOT / EXT.path, EXT.tests).name


def ci_host(cell) -> cibw.Host:
    """A GitHub-hosted runner: docker, the flavor's torch index, nothing local."""
    return cibw.Host("docker", Sources(None, (cell.index,), ()), "/cache/ccache", "/cache/pip",
                     None, 4)


def offline_host() -> cibw.Host:
    """A builder with local wheel folders and a TLS-inspecting proxy, running podman."""
    sources = Sources(None, ("file:///srv/pypi/simple",), ("/srv/wheels",))
    return cibw.Host("podman", sources, "/var/cache/x/ccache", "/var/cache/x/pip",
                     "/etc/ssl/certs/ca-certificates.crt", 2)


@pytest.mark.parametrize("cell_id", ["torch2.13-cpu", "torch2.14-cu130", "torch2.14-rocm7.2"])
def test_cibuildwheel_environment_in_ci(cell_id, golden):
    cell = PLAN.cell(cell_id)
    env = cibw.environment(cell, EXT, ci_host(cell), cell.python, BUILD_REQUIRES, None,
                           PYTEST_SETTINGS)
    golden(f"cibw-{cell_id}.json", json.dumps(env, indent=2) + "\n")


def test_cibuildwheel_environment_offline_on_the_local_base(golden):
    cell = PLAN.cell("torch2.13-cpu")
    python = cibw.build_python(cell, ["cp311-cp311"])
    env = cibw.environment(cell, EXT, offline_host(), python, BUILD_REQUIRES, None,
                           PYTEST_SETTINGS)
    assert env["CIBW_BUILD"] == "cp311-manylinux_x86_64"
    golden("cibw-torch2.13-cpu-offline.json", json.dumps(env, indent=2) + "\n")


@pytest.mark.parametrize("cell_id", ["torch2.13-cpu", "torch2.14-cu130", "torch2.14-rocm7.2"])
def test_cibuildwheel_reads_back_exactly_our_environment(cell_id):
    cell = PLAN.cell(cell_id)
    host = offline_host()
    env = cibw.environment(cell, EXT, host, "3.11", BUILD_REQUIRES)
    parsed = parse_environment(env["CIBW_ENVIRONMENT"]).as_dictionary({})
    assert parsed == cibw.container_env(cell, host, "3.11")
    # What extensions in the wild read; the cell's identity is stamped into the wheel after.
    assert not any(key.startswith("EXTMATRIX_") for key in parsed)
    forced = {"cpu": "FORCE_ONLY_CPU", "cuda": "FORCE_CUDA", "rocm": "FORCE_CUDA"}[cell.family]
    assert parsed[forced] == "1"


def test_the_build_inside_the_container_gets_the_version_git_gave():
    cell, host = PLAN.cell("torch2.13-cpu"), offline_host()
    version = {"SETUPTOOLS_SCM_PRETEND_VERSION": "0.4.1.dev1"}
    env = cibw.environment(cell, EXT, host, "3.11", BUILD_REQUIRES, version)
    parsed = parse_environment(env["CIBW_ENVIRONMENT"]).as_dictionary({})
    assert parsed == {**cibw.container_env(cell, host, "3.11"), **version}


@pytest.mark.parametrize("cell_id", ["torch2.13-cpu", "torch2.14-cu130", "torch2.14-rocm7.2"])
def test_cibuildwheel_selects_exactly_the_cells_build(cell_id):
    cell = PLAN.cell(cell_id)
    env = cibw.environment(cell, EXT, ci_host(cell), cell.python, BUILD_REQUIRES)
    result = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers",
                             "--platform", "linux", EXT.path], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cp310-manylinux_x86_64"]


def test_environment_carries_the_cells_promises():
    cpu, cuda, rocm = (PLAN.cell(c) for c in ("torch2.13-cpu", "torch2.14-cu130",
                                               "torch2.14-rocm7.2"))
    host = offline_host()
    env = cibw.container_env(cuda, host, "3.11")
    assert env["TORCH_CUDA_ARCH_LIST"] == "7.5;8.0;9.0;10.0;12.0+PTX"
    assert env["CPATH"].endswith("/site-packages/nvidia/cu13/include")
    assert env["PIP_FIND_LINKS"] == "/host/srv/wheels"
    assert env["PIP_EXTRA_INDEX_URL"] == "file:///host/srv/pypi/simple"
    assert env["PIP_CERT"] == "/host/etc/ssl/certs/ca-certificates.crt"
    assert cibw.container_env(rocm, host, "3.11")["PYTORCH_ROCM_ARCH"] == rocm.arch_list
    assert cibw.container_env(cpu, host, "3.11")["FORCE_ONLY_CPU"] == "1"
    repair = cibw.environment(rocm, EXT, host, "3.11", [])["CIBW_REPAIR_WHEEL_COMMAND"]
    assert "--exclude 'libamdhip64.so.*'" in repair and "libcudart" not in repair
    test = cibw.environment(cpu, EXT, host, "3.11", [])["CIBW_TEST_COMMAND"]
    assert test.endswith("-m 'not build'") and "{package}/tests" in test


def test_build_python_follows_the_image():
    cell = PLAN.cell("torch2.13-cpu")
    assert cibw.build_python(cell, None) == "3.10"  # manylinux images carry every CPython
    assert cibw.build_python(cell, ["cp311-cp311"]) == "3.11"  # abi3: any tested Python
    with pytest.raises(NotBuildable, match="builds with Python 3.10 or"):
        cibw.build_python(cell, ["cp39-cp39"])
    per_python = replace(cell, abi3=False)
    with pytest.raises(NotBuildable, match="builds with Python 3.10$"):
        cibw.build_python(per_python, ["cp311-cp311"])


def test_host_locations_as_the_container_sees_them():
    assert cibw.inside("/opt/wheels") == "/host/opt/wheels"
    assert cibw.inside("file:///opt/pypi/simple") == "file:///host/opt/pypi/simple"
    assert cibw.inside("https://download.pytorch.org/whl/cpu") == (
        "https://download.pytorch.org/whl/cpu")


# ---------------------------------------------------------------------- repaired wheels


def _shared_lib(tmp: Path, name: str, needed: list[str]) -> Path:
    """A real ELF library whose DT_NEEDED lists `needed` (stubs of those are built first)."""
    for lib in needed:
        if not (tmp / lib).exists():
            subprocess.run(["cc", "-shared", "-o", str(tmp / lib), "-x", "c", "-",
                            f"-Wl,-soname,{lib}"], input="int stub;", text=True, check=True)
    out = tmp / name
    subprocess.run(["cc", "-shared", "-o", str(out), "-x", "c", "-", "-x", "none",
                    "-Wl,--no-as-needed", *(str(tmp / lib) for lib in needed)],
                   input="int ext;", text=True, check=True)
    return out


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to make an ELF")
def test_repaired_wheel_facts_come_from_the_binary(tmp_path):
    cell = PLAN.cell("torch2.14-cu130")
    ext = _shared_lib(tmp_path, "_C.abi3.so",
                      ["libc10.so", "libtorch_cpu.so", "libcudart.so.13", "libgomp.so.1"])
    good = tmp_path / "segment_ops-0.1.0+pt214cu130-cp310-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(good, "w") as zf:
        zf.write(ext, "segment_ops/_C.abi3.so")
        zf.writestr("segment_ops.libs/libgomp-1a2b3c4d.so.1", b"")
    facts = cibw.repaired(good, cell)
    assert facts.tag == "cp310-abi3-manylinux_2_28_x86_64"
    assert facts.excluded == ["libc10.so", "libcudart.so.13", "libtorch_cpu.so"]
    assert facts.vendored == ["libgomp-1a2b3c4d.so.1"] and facts.problems == []

    bad = tmp_path / "segment_ops-0.1.0+pt214cu130-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.write(ext, "segment_ops/_C.abi3.so")
        zf.writestr("segment_ops.libs/libtorch_cpu-0badc0de.so", b"")
    problems = cibw.repaired(bad, cell).problems
    assert problems == [
        "the wheel is tagged cp310-abi3-linux_x86_64, not a repaired manylinux_* wheel",
        "the wheel carries its own libtorch_cpu.so; torch's must be used"]


def test_cibuildwheel_step_timings_are_read_from_its_log():
    log = "\n".join([
        "Running before_build...", "pip install ...", " " * 60 + "\x1b[32m✓ \x1b[0m18.18s",
        "Building wheel...", "ninja ...", " " * 60 + "done 15.23s",
        "Repairing wheel...", " " * 60 + "✓ 0.57s", "Testing wheel...", "77 passed",
        " " * 60 + "✓ 70.56s"])
    assert container.cibw_timings(log) == {"before_build": 18.18, "compile": 15.23,
                                           "repair": 0.57, "in_image_tests": 70.56}


# ------------------------------------------------------------------ the backend refuses


class NoImages(Engine):
    def labels(self, image: str) -> dict[str, str] | None:
        return None


def ctx_for(tmp_path: Path) -> Context:
    return Context(PLAN.matrix, ROOT, tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 2)


def test_a_cell_without_its_image_is_not_buildable_here(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "detect", lambda *a: NoImages("podman", "podman"))
    report = container.build(PLAN.cell("torch2.13-cpu"), ctx_for(tmp_path))
    assert report.build == "not-buildable" and not report.failed
    assert report.reason == ("not buildable here: podman has no image extmatrix-cpu:latest; "
                             "build it with 'extmatrix images --cell torch2.13-cpu'")
    saved = CellReport.read(tmp_path / "dist" / "torch2.13-cpu" / "report.json")
    assert saved is not None and saved.backend == "container"


class WithImages(Engine):
    def labels(self, image: str) -> dict[str, str] | None:
        return {}


def test_cibuildwheel_builds_the_cell_whatever_the_extension_or_shell_says(tmp_path,
                                                                           monkeypatch):
    """An extension's own [tool.cibuildwheel] and CIBW_*_LINUX variables left in the shell
    beat the engine's CIBW_* ones in cibuildwheel: the build must see neither."""
    monkeypatch.setattr("extmatrix.toolchain.host_platform", lambda: "x86_64")
    monkeypatch.setattr(engines, "detect", lambda *a: WithImages("podman", "podman"))
    monkeypatch.setenv("CIBW_BUILD_LINUX", "cp311-*")
    monkeypatch.setenv("CIBW_TEST_SKIP", "*")
    seen = {}

    def run(self, step, cmd, *, env=None, cwd=None, check=True, drop=()):
        if step != "cibuildwheel":
            return subprocess.CompletedProcess(cmd, 0, stdout="")
        package = Path(cwd) / cmd[-1]
        with (package / "pyproject.toml").open("a") as fh:  # the extension's own settings
            fh.write('\n[tool.cibuildwheel]\nskip = "cp310-*"\ntest-skip = "*"\n')
        asked = [a for a in cmd if a not in ("--output-dir", cmd[cmd.index("--output-dir") + 1])]
        full = {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **env}
        seen["ids"] = subprocess.run([*asked[:-1], "--print-build-identifiers", asked[-1]],
                                     capture_output=True, text=True, cwd=cwd, env=full).stdout
        raise StepFailed(step, "stop here")

    monkeypatch.setattr(steps_module.Steps, "run", run)
    container.build(PLAN.cell("torch2.13-cpu"), ctx_for(tmp_path))
    assert seen["ids"].split() == ["cp310-manylinux_x86_64"]
    log = (tmp_path / "dist" / "torch2.13-cpu" / "build.log").read_text()
    assert "not passed on to cibuildwheel: CIBW_BUILD_LINUX, CIBW_TEST_SKIP" in log
    # An image whose base the engine cannot read (not the cell's) is said to be so.
    assert "extmatrix-cpu:latest was built from unknown base, not the cell's base " in log


def test_a_foreign_platform_cell_is_not_buildable_here(tmp_path, monkeypatch):
    monkeypatch.setattr("extmatrix.toolchain.host_platform", lambda: "x86_64")
    report = container.build(PLAN.cell("torch2.14-cpu-aarch64"), ctx_for(tmp_path))
    assert report.build == "not-buildable"
    assert "needs a aarch64 builder" in report.reason


def test_free_threaded_cells_in_the_container():
    assert cibw.abi("3.14t") == "cp314-cp314t" and cibw.abi("3.12") == "cp312-cp312"
    cell = replace(PLAN.cell("torch2.14-cu130"), abi3=False, python="3.14t",
                   test_pythons=("3.14t",))
    site = "/opt/python/cp314-cp314t/lib/python3.14t/site-packages"  # cibuildwheel's own path
    assert cibw.container_env(cell, offline_host(), "3.14t")["CPATH"] == (
        f"{site}/nvidia/cu13/include")
    env = cibw.environment(cell, EXT, ci_host(cell), "3.14t", BUILD_REQUIRES)
    result = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers",
                             "--platform", "linux", EXT.path], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cp314t-manylinux_x86_64"]
    older = replace(cell, python="3.13t", test_pythons=("3.13t",))
    with pytest.raises(NotBuildable, match="cibuildwheel 4 builds no Python 3.13t wheel"):
        cibw.build_python(older, None)


# ------------------------------------------------------------------- the in-image tests


def with_extension(**settings) -> Extension:
    return Extension.model_validate({**EXT.model_dump(by_alias=True), **settings})


def in_image_argv(command: str, tmp_path: Path) -> list[str]:
    """The arguments the test command's program gets: cibuildwheel fills its placeholders
    (its own function), then sh runs the line in a scratch folder, where `python` is the
    test venv's."""
    package = tmp_path / "project" / "ext"
    (package / "tests").mkdir(parents=True)
    line = prepare_command(command, project=str(package.parent), package=str(package),
                           wheel="/repaired/segment_ops.whl")
    venv_bin = tmp_path / "bin"
    venv_bin.mkdir()
    (venv_bin / "python").symlink_to(sys.executable)
    path = f"{venv_bin}{os.pathsep}{os.environ['PATH']}"
    (tmp_path / "test_cwd").mkdir()
    result = subprocess.run(["sh", "-c", line], capture_output=True, text=True,
                            cwd=tmp_path / "test_cwd", env={**os.environ, "PATH": path},
                            check=True)
    return json.loads(result.stdout)


def test_the_in_image_tests_run_the_matrixs_test_command(tmp_path):
    show_argv = "import json, sys; print(json.dumps(sys.argv[1:]))"
    ext = with_extension(test_sources=[], test_command=[
        "{python}", "-c", show_argv, "{tests}", "--junitxml={junit}", "a b", "it's", "$HOME",
        "", "{{project}}", "#{{package}}", "{{wheel}}{{tests}}", "x{tests}"])
    cell = PLAN.cell("torch2.13-cpu")
    env = cibw.environment(cell, ext, ci_host(cell), cell.python, BUILD_REQUIRES)
    assert env["CIBW_TEST_REQUIRES"] == ""  # pytest only where the engine runs pytest
    # The copy of the tests, in a folder of the scratch folder the test command runs in.
    suite = tmp_path.resolve() / "test_cwd" / "suite"
    argv = in_image_argv(env["CIBW_TEST_COMMAND"], tmp_path)
    assert argv == [f"{suite}/tests", f"--junitxml={suite}/junit.xml", "a b", "it's", "$HOME",
                    "", "{project}", "#{package}", "{wheel}{tests}", f"x{suite}/tests"]
    # The local backend fills the same command the same way, with its own paths: its copy
    # of the tests lies beside the test environment.
    ctx = Context(PLAN.matrix.model_copy(update={"extension": ext}), Path("/project"),
                  tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 2)
    assert local.test_cmd(ctx, suite.parent / "test-env", tmp_path,
                          suite / "junit.xml")[0][3:] == argv


def test_the_default_in_image_tests_keep_literal_braces_of_test_args(tmp_path):
    ext = with_extension(test_args=["-k", "{project} or {wheel}"])
    cell = PLAN.cell("torch2.13-cpu")
    command = cibw.environment(cell, ext, ci_host(cell), cell.python, [])["CIBW_TEST_COMMAND"]
    assert " && python -m pytest tests " in command
    assert command.endswith(" -k '#{project} or #{wheel}'")
    assert prepare_command(command, project="/p", package="/p", wheel="/w").endswith(
        " -k '{project} or {wheel}'")


@pytest.mark.parametrize(("settings", "wanted"), [
    ({}, ["pytest"]),
    ({"test_requires": ["pytest>=8", "numpy"]}, ["pytest>=8", "numpy"]),
    ({"test_requires": ["numpy"], "test_command": ["{python}", "{tests}/run.py"]}, ["numpy"]),
])
def test_both_backends_install_the_same_test_requirements(settings, wanted, tmp_path):
    ext = with_extension(**settings)
    cell = PLAN.cell("torch2.13-cpu")
    env = cibw.environment(cell, ext, ci_host(cell), cell.python, [])
    assert shlex.split(env["CIBW_TEST_REQUIRES"]) == wanted
    ctx = Context(PLAN.matrix.model_copy(update={"extension": ext}), ROOT, tmp_path / "dist",
                  tmp_path / "work", tmp_path / "cache", 2)
    wheel = tmp_path / "segment_ops-0.1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("segment_ops-0.1.0.dist-info/METADATA", "Name: segment-ops\n")
    assert local.test_requirements(ctx, wheel, cell)[2:] == wanted


def test_cache_folders_with_a_space_stay_one_mount_each():
    # cibuildwheel splits create_args as a shell would: a space must not split a mount.
    from cibuildwheel.oci_container import OCIContainerEngineConfig

    cell = PLAN.cell("torch2.13-cpu")
    host = replace(ci_host(cell), ccache_dir="/home/me/my cache/ccache",
                   pip_cache_dir="/home/me/my cache/pip")
    env = cibw.environment(cell, EXT, host, "3.11", BUILD_REQUIRES)
    config = OCIContainerEngineConfig.from_config_string(env["CIBW_CONTAINER_ENGINE"])
    assert config.create_args == (f"--volume=/home/me/my cache/ccache:{cibw.CCACHE_MOUNT}",
                                  f"--volume=/home/me/my cache/pip:{cibw.PIP_CACHE_MOUNT}")


def test_the_container_shell_shows_no_index_credentials(tmp_path, monkeypatch, capsys):
    cell = PLAN.cell("torch2.13-cpu")
    secret = Sources(None, ("https://bob:s3cret@mirror.example/simple",), ())
    host = cibw.Host("podman", secret, str(tmp_path / "ccache"), str(tmp_path / "pip"), None, 2)
    monkeypatch.setattr(container, "_prepare", lambda c, ctx, r: (Engine("podman", "podman"),
                                                                  "3.11", c.base_image))
    monkeypatch.setattr(container, "_host", lambda c, ctx, e: host)
    ran = []
    monkeypatch.setattr(container.subprocess, "call", lambda cmd, env: ran.append(cmd) or 0)
    ctx = Context(PLAN.matrix, ROOT, tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 1)
    assert container.shell(cell, ctx) == 0
    shown = capsys.readouterr().err
    assert "s3cret" not in shown and "https://***@mirror.example/simple" in shown
    assert any("s3cret" in arg for arg in ran[0])  # the container itself gets the index


@pytest.mark.parametrize(("cell_id", "cuda", "hip", "problem"), [
    ("torch2.14-cu130", "13.0", None, None),
    ("torch2.14-cu130", "12.8", None, "torch 2.14.1 installed for this cell is a build with "
     "CUDA 12.8, not CUDA 13.0"),
    ("torch2.14-rocm7.2", None, "7.2.53211-e11e9b9", None),
    ("torch2.14-rocm7.2", None, None, "torch 2.14.1 installed for this cell is a build with "
     "ROCm none, not ROCm 7.2"),
])
def test_the_container_build_refuses_a_torch_of_another_toolkit(tmp_path, cell_id, cuda, hip,
                                                                 problem):
    # PyPI's torch of the same version when the PyTorch index did not answer.
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("from . import version\n__version__ = '2.14.1'\n")
    (fake / "version.py").write_text(f"cuda = {cuda!r}\nhip = {hip!r}\n")
    line = cibw.environment(PLAN.cell(cell_id), EXT, ci_host(PLAN.cell(cell_id)), "3.11",
                            BUILD_REQUIRES)["CIBW_BEFORE_BUILD"].split(" && ")[-1]
    done = subprocess.run(["sh", "-c", line.replace("python ", f"{sys.executable} ", 1)],
                          capture_output=True, text=True, env={**os.environ,
                                                               "PYTHONPATH": str(tmp_path)})
    assert (done.returncode, done.stderr.strip() or None) == (1 if problem else 0, problem)
