"""The container backend: cibuildwheel builds each cell in its flavor's image.

Build: the cell's image (from `extmatrix images`) → cibuildwheel with the cell's
CIBW_* environment (torch installed first, compile, auditwheel repair, the
extension's tests against the installed wheel) → abi3audit on the host (a py3-none
wheel has no abi3 tag to audit: the wheel check looks for Python in its binaries) → the
same wheel check as the local backend, plus what the repair left out. Results
land in dist/<cell>/ exactly as the local backend's do; testing the wheel
afterwards (test-matrix) is the local backend's, in a plain environment.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from .. import cibw, engines, envs, project, toolchain, workspace
from ..cells import Cell
from ..engines import Engine
from ..errors import NotBuildable, UserError
from ..project import build_requirements
from ..report import CellReport
from ..steps import redact
from ..workspace import single_wheel
from . import Context, audit_abi3, building, check_wheel, copy_sources, local, stamp_wheel

PROJECT = "/project"  # where cibuildwheel copies the extension, and where --shell mounts it
# cibuildwheel's step titles, as timing names in the report.
CIBW_STEPS = {"Running before_build...": "before_build", "Building wheel...": "compile",
              "Repairing wheel...": "repair", "Testing wheel...": "in_image_tests"}


def build(cell: Cell, ctx: Context) -> CellReport:
    with building(ctx, cell, "container") as (report, staging, steps):
        engine, python, base = _prepare(cell, ctx, report)
        steps.note(f"engine: {engine.why}")
        if cell.base_image and base != cell.base_image:
            # One tag for both bases: a local-base image builds where CI's cannot, but its
            # wheel may carry another manylinux tag than CI's.
            steps.note(f"{cell.image} was built from {base}, not the cell's base "
                       f"{cell.base_image}: the wheel may differ from CI's (rebuild the image "
                       "with 'extmatrix images' where the registry is reachable)")
        host = _host(cell, ctx, engine)
        report.sources = list(host.sources.notes)
        # A clean copy: cibuildwheel copies its whole working folder into the container,
        # and the source tree may hold build products of other builds.
        top = ctx.work / cell.id / "container-src"
        src, inside = project.build_tree(top, ctx.ext_dir)
        copy_sources(ctx, src)
        tracked = project.mirror_tracked_files(ctx.ext_dir, src, steps.note)  # .git goes too
        # The engine's own setuptools-scm: the container's comes too late to ask the tree.
        from_git = project.git_version_env(ctx.ext_dir, Path(sys.executable), {},
                                           bool(tracked), steps.note, builds_here=False)
        env = {**engine.env, **cibw.environment(cell, ctx.matrix.extension, host, python,
                                                build_requirements(ctx.ext_dir), from_git,
                                                _pytest_settings(ctx), _conftests(ctx))}
        out = ctx.work / cell.id / "wheelhouse-container"
        shutil.rmtree(out, ignore_errors=True)  # the last good wheel is safe in dist/<cell>/
        stats = _ccache_env(ctx, host, cell)
        if stats:  # this build's counts alone; ccache makes no folder for its log
            statslog = Path(stats["CCACHE_STATSLOG"])
            statslog.parent.mkdir(parents=True, exist_ok=True)
            statslog.unlink(missing_ok=True)
        # The cell's options alone: not the extension's [tool.cibuildwheel] (its skip or
        # test-skip would drop the cell's build or tests), nor CIBW_*_LINUX variables left
        # in the shell, which beat the engine's CIBW_* ones.
        config = ctx.work / cell.id / "cibuildwheel.toml"
        config.write_text("# extmatrix passes every option as a CIBW_* variable.\n"
                          "[tool.cibuildwheel]\n")
        if ignored := sorted(k for k in os.environ if k.startswith("CIBW_")):
            steps.note(f"not passed on to cibuildwheel: {', '.join(ignored)} (the cell sets "
                       "its options)")
        with steps.timed("cibuildwheel"):
            done = steps.run("cibuildwheel", [
                sys.executable, "-m", "cibuildwheel", "--platform", "linux", "--config-file",
                str(config), "--output-dir", str(out), inside.as_posix()],
                env=env, cwd=top, drop=("CIBW_",))
        report.timings.update(cibw_timings(done.stdout))
        report.ccache = toolchain.ccache_counts(stats)
        built = single_wheel(out)
        project.check_version_taken(built, from_git, ctx.ext_dir, top)
        wheel = stamp_wheel(cell, built, report, steps)
        audit_abi3(cell, wheel, steps)
        repair = cibw.repaired(wheel, cell)
        steps.note(f"wheel tag {repair.tag}; left to torch's install: "
                   f"{', '.join(repair.excluded) or 'nothing'}; grafted: "
                   f"{', '.join(repair.vendored) or 'nothing'}")
        report.repair = asdict(repair)
        check_wheel(cell, ctx, wheel, report, staging, None, repair.problems)
    return report


def _prepare(cell: Cell, ctx: Context, report: CellReport) -> tuple[Engine, str, str]:
    """The engine, the build Python of the cell's image and the base the image was built
    from; NotBuildable if the engine or the image is missing."""
    if cell.platform != toolchain.host_platform():
        raise NotBuildable(f"a {cell.platform} cell needs a {cell.platform} builder "
                           f"(this machine is {toolchain.host_platform()})")
    engine = engines.detect(None, ctx.root, ctx.cache)
    labels = engine.labels(cell.image)
    if labels is None:
        matrix = ("" if ctx.matrix_file in (None, Path.cwd() / "matrix.yaml")
                  else f" --matrix {shlex.quote(str(ctx.matrix_file))}")
        raise NotBuildable(f"{engine.name} has no image {cell.image}; build it with "
                           f"'extmatrix images{matrix} --cell {cell.id}'")
    abis = labels.get("io.extmatrix.python-abis")
    python = cibw.build_python(cell, abis.split() if abis else None)
    base = labels.get("io.extmatrix.base-image", "unknown base")
    report.toolkit = f"image {cell.image} ({engine.name}, from {base}), Python {python}"
    return engine, python, base


def _pytest_settings(ctx: Context) -> str | None:
    """Where the tests' pytest settings lie in the extension, for the in-image tests' copy."""
    found = workspace.pytest_settings(ctx.ext_dir, ctx.matrix.extension.tests)
    return found.relative_to(ctx.ext_dir.resolve()).as_posix() if found else None


def _conftests(ctx: Context) -> list[str]:
    """The conftest.py files above the tests folder, for the in-image tests' copy."""
    top = ctx.ext_dir.resolve()
    return [found.relative_to(top).as_posix()
            for found in workspace.conftests_above(ctx.ext_dir, ctx.matrix.extension.tests)]


def _host(cell: Cell, ctx: Context, engine: Engine) -> cibw.Host:
    root = ctx.cache / "container"
    for sub in ("ccache", "pip"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ca = engines.ca_bundle()
    return cibw.Host(engine.name, envs.sources_for(cell), str(root / "ccache"), str(root / "pip"),
                     str(ca) if ca else None, local.compile_jobs(ctx))


def _ccache_env(ctx: Context, host: cibw.Host, cell: Cell) -> dict[str, str]:
    """The host's ccache, pointed at the containers' cache and the cell's stats log there,
    to count the build's hits."""
    found = toolchain.compiler_cache(ctx.cache).get("EXTMATRIX_CCACHE")
    if not found:
        return {}
    return {"EXTMATRIX_CCACHE": found, "CCACHE_DIR": host.ccache_dir,
            "CCACHE_STATSLOG": str(Path(host.ccache_dir) / cibw.ccache_statslog(cell))}


def cibw_timings(log: str) -> dict[str, float]:
    """Seconds per cibuildwheel step, from the '✓ 12.34s' line that closes each."""
    timings: dict[str, float] = {}
    current = None
    for line in log.splitlines():
        text = line.strip()
        if text in CIBW_STEPS:
            current = CIBW_STEPS[text]
            continue
        done = re.fullmatch(r"(?:\x1b\[[0-9;]*m)*(?:✓|done)\s*(?:\x1b\[[0-9;]*m)*\s*([\d.]+)s",
                            text)
        if done and current:
            timings[current] = round(float(done[1]), 2)
            current = None
    return timings


def shell(cell: Cell, ctx: Context) -> int:
    """The cell's image, the extension mounted at /project, the build's environment."""
    try:
        engine, python, _ = _prepare(cell, ctx, CellReport(cell=cell.id, backend="container"))
    except NotBuildable as exc:
        raise UserError(None, f"cannot open a shell for {cell.id}: {exc}") from None
    host = _host(cell, ctx, engine)
    inner = cibw.container_env(cell, host, python)
    config = cibw.environment(cell, ctx.matrix.extension, host, python,
                              build_requirements(ctx.ext_dir))
    # The image's PATH (gcc-toolset, CUDA, ccache) stays; the build Python goes first.
    # PS1 is set here: a non-interactive bash drops the one it inherits. The cell's torch
    # and its built wheel are installed first, as for the in-image tests, so that both
    # import in the shell; the image has no startup files of the user's to undo that.
    wheels = sorted((ctx.dist / cell.id).glob("*.whl"))
    mounts = [f"--volume={wheels[0]}:/dist/{wheels[0].name}:ro"] if wheels else []
    install = shlex.join(["python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          cell.torch_spec, *(f"/dist/{w.name}" for w in wheels[:1])])
    what = f"{cell.torch_spec}{' and ' + wheels[0].name if wheels else ''}"
    prompt = shlex.quote(f"({cell.id}) \\w # ")
    enter = (f'export PATH=/opt/python/{cibw.abi(python)}/bin:"$PATH" PS1={prompt}; '
             f"echo {shlex.quote(f'# installing {what} into Python {python} of the image')} >&2; "
             f"{install} || echo '# that install failed: see above' >&2; "
             "exec bash --norc -i")
    tty = ["-it"] if sys.stdin.isatty() else ["-i"]
    cmd = engine.cmd("run", "--rm", *tty, f"--volume={ctx.ext_dir}:{PROJECT}",
                     f"--workdir={PROJECT}", *shell_mounts(host), *mounts,
                     *(f"--env={k}={v}" for k, v in inner.items()), cell.image,
                     "bash", "-c", enter)
    repair = config["CIBW_REPAIR_WHEEL_COMMAND"].format(dest_dir="/tmp/repaired",
                                                        wheel="/tmp/wheel/*.whl")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in engine.env.items())
    # Index URLs from pip's settings reach the container's environment: never shown as given.
    print(redact(f"# {cell.id} in {cell.image}, the extension mounted read-write at {PROJECT}; "
                 f"pip's local sources and CA bundle read-only under {cibw.HOST_MOUNT}.\n"
                 "# cibuildwheel runs there:\n"
                 f"#   {config['CIBW_BEFORE_BUILD']}\n"
                 "#   python -m pip wheel . --no-build-isolation --no-deps -w /tmp/wheel\n"
                 f"#   {repair}\n"
                 f"$ {exports + ' ' if exports else ''}{shlex.join(cmd)}"),
          file=sys.stderr, flush=True)
    return subprocess.call(cmd, env={**os.environ, **engine.env})


def shell_mounts(host: cibw.Host) -> list[str]:
    """What an interactive shell sees of the host: the caches, and read-only, only the
    files the build's environment names under /host (local wheel folders, the CA bundle).
    Never the host's whole file system: the shell is root in the container."""
    mounts = [f"--volume={host.ccache_dir}:{cibw.CCACHE_MOUNT}",
              f"--volume={host.pip_cache_dir}:{cibw.PIP_CACHE_MOUNT}"]
    for path in cibw.host_paths(host):
        if Path(path).exists():
            mounts.append(f"--volume={path}:{cibw.HOST_MOUNT}{path}:ro")
    return mounts
