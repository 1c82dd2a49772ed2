"""The local backend: each cell in its own virtual environment on this machine, no container.

Build: toolkit → environment with the cell's exact torch → compile the wheel with
ccache → check the wheel (version label, Requires-Dist, archs in the binary).
Test: a fresh environment with the cell's torch and the built wheel (never the
source tree) → the extension's tests, JUnit XML next to the wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

from .. import envs, project, toolchain, wheels, workspace
from ..cells import Cell, toolkit_series_depth
from ..compat import same_series
from ..errors import Interrupted, NotBuildable, StepFailed, UserError, describe_os_error
from ..project import build_requirements
from ..report import CROSS_NOT_MADE, NOT_INSTALLED, CellReport, ServedTorch
from ..steps import PYTEST_TALLY, Steps, first_cause
from ..workspace import recorded_wheel, single_wheel
from . import Context, audit_abi3, building, check_wheel, copy_sources, stamp_wheel

STAMP = "inputs.sha256"  # beside the last wheel: what it was built from



def build(cell: Cell, ctx: Context) -> CellReport:
    with building(ctx, cell, "local") as (report, staging, steps):
        with steps.timed("toolkit"):
            tools = toolchain.provision(cell, ctx.cache, log=steps.note)
            report.toolkit = tools.origin
        venv = ctx.work / cell.id / "build-env"
        with steps.timed("env"):
            sources = prepare_env(cell, venv, build_requirements(ctx.ext_dir), steps)
        report.sources = list(sources.notes)
        top = ctx.work / cell.id / "src"
        src, _ = project.build_tree(top, ctx.ext_dir)
        copy_sources(ctx, src)
        tracked = project.mirror_tracked_files(ctx.ext_dir, src, steps.note)
        env = compile_env(cell, tools, ctx, venv, src)
        with steps.timed("env"):
            add_dynamic_requirements(cell, venv, src, env, sources, steps)
        # The build environment's own setuptools-scm, with the project's plugins.
        from_git = project.git_version_env(ctx.ext_dir, envs.python_of(venv), env,
                                           bool(tracked), steps.note)
        env.update(from_git)
        out = ctx.work / cell.id / "wheelhouse"
        stamp = fingerprint(cell, env, venv, src, tracked)
        with steps.timed("compile"):
            if not ctx.rebuild and up_to_date(out, stamp):
                steps.note("sources, torch, toolkit and settings unchanged since the last "
                           "build: reusing its wheel (--rebuild to compile anyway)")
                report.reused = True
            else:
                compile_wheel(venv, src, out, env, stamp, report, steps)
        built = single_wheel(out)
        project.check_version_taken(built, from_git, ctx.ext_dir, top)
        with steps.timed("check"):
            wheel = stamp_wheel(cell, built, report, steps)
            audit_abi3(cell, wheel, steps)
            check_wheel(cell, ctx, wheel, report, staging, venv)
    return report



def compile_wheel(venv: Path, src: Path, out: Path, env: dict[str, str], stamp: str,
                  report: CellReport, steps: Steps) -> None:
    """Compile into a fresh folder; the last wheel and its stamp go only once this one is in."""
    fresh = out.with_name(out.name + ".partial")
    shutil.rmtree(fresh, ignore_errors=True)
    clear_wheel_staging(src)
    if env.get("EXTMATRIX_CCACHE"):
        # This build's own counts: the cache's totals also move with other cells' builds.
        statslog = out.with_name(out.name + ".ccache-stats")
        statslog.unlink(missing_ok=True)
        env = {**env, "CCACHE_STATSLOG": str(statslog)}
    steps.run("compile", [str(envs.python_of(venv)), "-m", "pip", "wheel",
                          "--no-build-isolation", "--no-deps", "--no-cache-dir",
                          "--disable-pip-version-check", "-w", str(fresh), str(src)],
              env=env, cwd=src)
    report.ccache = toolchain.ccache_counts(env)
    (fresh / STAMP).write_text(stamp)
    shutil.rmtree(out, ignore_errors=True)
    fresh.rename(out)


# What setuptools stages for a wheel under build/, and never prunes: a module the
# maintainer deleted stays in build/lib.* and ships in every later wheel, and a
# dist-info folder that an interrupted run left in build/bdist.* makes bdist_wheel
# refuse to start ("File exists"). build/temp.* (the objects) stays: it keeps
# incremental builds warm, and the staging is only copied and linked again.
WHEEL_STAGING = ("lib.*", "bdist.*", "scripts-*")


def clear_wheel_staging(src: Path) -> None:
    """Remove the wheel staging the last build left in the source copy's build/."""
    for pattern in WHEEL_STAGING:
        for staging in (src / "build").glob(pattern):
            shutil.rmtree(staging, ignore_errors=True)


def fingerprint(cell: Cell, env: dict[str, str], venv: Path, src: Path,
                tracked: bytes = b"") -> str:
    """Everything a build depends on: the cell, its environment, the source contents,
    and which of them git tracks (`tracked`: package data, for setuptools-scm)."""
    digest = hashlib.sha256(tracked)
    marker = envs.env_marker(venv)
    # MAX_JOBS shapes how fast the build runs, not what it makes.
    settings = {k: v for k, v in env.items()
                if not k.startswith("CCACHE") and k not in ("PATH", "MAX_JOBS")}
    for part in (json.dumps(cell.to_json(), sort_keys=True), json.dumps(settings, sort_keys=True),
                 marker.read_text() if marker.is_file() else ""):
        digest.update(part.encode())
    for path in sorted(p for p in src.rglob("*") if not workspace.skipped(p.relative_to(src))):
        digest.update(os.fsencode(path.relative_to(src)))  # any bytes a name may hold
        if path.is_symlink():
            digest.update(b"-> " + os.fsencode(os.readlink(path)))
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def up_to_date(out: Path, stamp: str) -> bool:
    try:
        return (out / STAMP).read_text() == stamp and len(list(out.glob("*.whl"))) == 1
    except OSError:
        return False



def prepare_env(cell: Cell, venv: Path, extra: list[str], steps: Steps) -> envs.Sources:
    """Reuse the cell's environment when it really holds the cell's torch and tools."""
    sources = envs.sources_for(cell)
    python = envs.find_python(cell)
    requirements = [cell.torch_spec, *extra]
    wanted = {"python": python, "requirements": requirements, "sources": sources.uv_args()}
    damage = envs.health(venv, requirements) if envs.matches(venv, wanted) else "settings changed"
    if damage is None:
        steps.note(f"reusing {venv}")
    else:
        if envs.python_of(venv).exists():
            steps.note(f"recreating {venv}: {damage}")
        envs.env_marker(venv).unlink(missing_ok=True)
        steps.run("env", envs.create_cmd(venv, python))
        try:
            steps.run("env", envs.install_cmd(venv, requirements, sources))
        except StepFailed as failed:
            # "No version of torch==X+cpu" means little until it says where torch was sought.
            cause, see, log = failed.detail.rpartition("; see ")
            if not see or not sources.notes:
                raise
            raise StepFailed(failed.step, f"{cause} ({'; '.join(sources.notes)}){see}{log}"
                             ) from None
        envs.write_marker(venv, wanted)
        (venv / "torch-build.json").unlink(missing_ok=True)
    check_torch_build(cell, venv, sources)
    return sources


def add_dynamic_requirements(cell: Cell, venv: Path, src: Path, env: dict[str, str],
                             sources: envs.Sources, steps: Steps) -> None:
    """Install what the build backend asks for on top of [build-system] requires."""
    try:
        asked = project.dynamic_build_requirements(src, envs.python_of(venv), env)
    except Exception as exc:  # noqa: BLE001 - the backend's own failure: the compile says more
        steps.note(f"the build backend did not say what else it needs: {exc}")
        return
    if asked and envs.health(venv, asked) is not None:
        steps.note(f"the build backend asks for {', '.join(asked)}")
        steps.run("env", envs.install_cmd(venv, asked, sources))


def check_torch_build(cell: Cell, venv: Path, sources: envs.Sources) -> None:
    """The torch that got installed must be the cell's flavor: an unreachable PyTorch index
    quietly yields PyPI's build of the same version, whose CUDA may be another one."""
    probe = venv / "torch-build.json"
    if not probe.is_file():
        probe.write_text(json.dumps(torch_build(venv)))
    built = json.loads(probe.read_text())
    found = (built["cuda"] if cell.family == "cuda" else built["hip"]) or ""
    if cell.family != "cpu" and not same_series(found, cell.toolkit):
        where = "; ".join(sources.notes) or "the host's pip sources"
        label = "CUDA" if cell.family == "cuda" else "ROCm"
        what = f"a {label} {found} build" if found else f"a build without {label}"
        raise NotBuildable(f"torch {built['version']} installed for this cell is {what}, "
                           f"not {label} {cell.toolkit} ({where})")


def compile_env(cell: Cell, tools: toolchain.Toolchain, ctx: Context, venv: Path,
                src: Path) -> dict[str, str]:
    env = dict(tools.env)
    path = [str(venv / "bin")]
    ccache = toolchain.compiler_cache(ctx.cache)
    if ccache:
        path.insert(0, ccache.pop("CCACHE_SHIMS"))
        env.update(ccache)
        # Paths under the cell's folder (its sources and its venv's torch headers) hash as
        # relative ones: the same cell in another checkout or work folder hits the cache.
        env["CCACHE_BASEDIR"] = os.path.commonpath([src, venv])
        if tools.home and cell.family == "cuda":
            env["PYTORCH_NVCC"] = f"{ccache['EXTMATRIX_CCACHE']} {tools.home / 'bin' / 'nvcc'}"
    env["PATH"] = os.pathsep.join([*path, env.get("PATH", os.environ.get("PATH", ""))])
    if cell.family == "cuda":
        # ATen's CUDA headers include cuBLAS/cuSPARSE headers: take them from torch's wheels.
        site = next(venv.glob("lib/python3*/site-packages"))
        includes = sorted({str(p) for p in site.glob("nvidia/*/include")})
        env["CPATH"] = os.pathsep.join(filter(None, [*includes, os.environ.get("CPATH")]))
        # CMake's find_package(Torch) links nvrtc, which a compiler-only toolkit lacks:
        # torch's own copy, through CMAKE_ARGS (read by scikit-build-core and most
        # setup.py-driven CMake builds).
        nvrtc = sorted(site.glob("nvidia/*/lib/libnvrtc.so.*"))
        if tools.home and nvrtc and not list((tools.home / "lib64").glob("libnvrtc.so*")):
            env["CMAKE_ARGS"] = " ".join(filter(None, [os.environ.get("CMAKE_ARGS"),
                                                       f"-DCUDA_nvrtc_LIBRARY={nvrtc[0]}"]))
    for name in toolchain.FLAG_VARIABLES:  # the user's own flags stay in front of ours
        if name in env and os.environ.get(name):
            env[name] = f"{os.environ[name]} {env[name]}"
    env["MAX_JOBS"] = str(compile_jobs(ctx))
    return env


def compile_jobs(ctx: Context) -> int:
    """Compile jobs per cell: MAX_JOBS where the user exported it (they know the machine:
    its memory for nvcc, what else runs there), else the engine's share of the cores."""
    given = os.environ.get("MAX_JOBS", "").strip()
    if not given:
        return ctx.max_jobs
    if not (given.isascii() and given.isdigit()) or int(given) < 1:  # not '²'
        raise UserError("$MAX_JOBS", f"'{given}' is not a number of compile jobs",
                        "export a whole number from 1, or unset it to let extmatrix choose")
    return int(given)



# ---------------------------------------------------------------------------- tests

PLUGIN_DIR = Path(__file__).resolve().parent.parent / "pytest_plugin"
PLUGIN = "extmatrix_cell"
CELL_FACTS = "test-facts.json"  # what the plugin counted
# Exit 0 only where torch sees a GPU (CUDA or ROCm): what --require-gpu asks of a cell's
# test environment when the extension's own test command runs instead of pytest.
_GPU_PROBE = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
NO_GPU = "--require-gpu, but torch sees no GPU on this machine"
# Not torch's "Failed to initialize NumPy: No module named 'numpy'" warning: a real import error.
_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")


def test(cell: Cell, ctx: Context, report: CellReport) -> CellReport:
    """Install the built wheel beside the cell's torch in a fresh env and run the tests;
    a stable-ABI wheel beside every torch release it serves, each in its own env."""
    cell_dist = ctx.dist / cell.id
    for stale in ("test.log", "junit.xml", CELL_FACTS, *(p.name for p in
                                                       cell_dist.glob("junit-*.xml"))):
        (cell_dist / stale).unlink(missing_ok=True)
    steps = Steps(cell_dist / "test.log", echo=ctx.echo)
    if report.build_commands is not None:  # an earlier test run's commands go
        del report.commands[report.build_commands:]
    report.junit, report.pythons, report.serves = {}, {}, []  # and its results
    try:
        wheel = recorded_wheel(cell_dist)
        sources = envs.sources_for(cell)
        if cell.stable:
            _test_stable(cell, ctx, wheel, sources, steps, report)
        else:
            _test_per_python(cell, ctx, wheel, sources, steps, report)
    except Interrupted:
        report.test, report.reason = "failed", "tests interrupted (Ctrl-C or SIGTERM)"
    except (NotBuildable, StepFailed, UserError) as exc:
        report.test, report.reason = "failed", getattr(exc, "detail", None) or str(exc)
    except OSError as exc:
        report.test, report.reason = "failed", describe_os_error(exc)
    finally:
        report.timings.update(steps.timings)
        report.commands += steps.commands
        steps.close()
    return report


def _test_per_python(cell: Cell, ctx: Context, wheel: Path, sources: envs.Sources,
                     steps: Steps, report: CellReport) -> None:
    """The wheel's tests under each Python it is tested under that is installed here (an
    abi3 wheel serves several): the first in test-env, which repro --shell and the cross
    check of other cells use, the others beside it."""
    cell_dist = ctx.dist / cell.id
    installed = envs.installed_pythons(cell)
    outcomes: dict[str, tuple[str, dict[str, int], str | None]] = {}
    for n, (version, python) in enumerate(installed):
        venv = ctx.work / cell.id / ("test-env" if n == 0 else f"test-env-py{version}")
        with steps.timed("test-env"):
            steps.run("test-env", envs.create_cmd(venv, python))
            steps.run("test-env", envs.install_cmd(
                venv, test_requirements(ctx, wheel, cell), sources))
        outcomes[version] = run_suite(ctx, venv, cell_dist, "" if n == 0 else f"-py{version}",
                                      steps)
    failed = [(version, reason) for version, (test, _, reason) in outcomes.items()
              if test == "failed"]
    report.junit = _junit_totals(junit for _, junit, _ in outcomes.values())
    report.test = "failed" if failed else "passed"
    if not failed:
        report.reason = None
    elif len(outcomes) == 1:
        report.reason = failed[0][1]
    else:
        report.reason = f"under Python {failed[0][0]}: {failed[0][1]}"
    if cell.abi3:
        report.pythons = {p: outcomes[p][0] if p in outcomes else NOT_INSTALLED
                          for p in cell.test_pythons}


def _junit_totals(runs: Iterable[dict[str, int]]) -> dict[str, int]:
    """The JUnit counts of several test runs of one wheel, added up."""
    totals: dict[str, int] = {}
    for junit in runs:
        for key, value in junit.items():
            totals[key] = totals.get(key, 0) + value
    return totals


def run_suite(ctx: Context, venv: Path, cell_dist: Path, suffix: str,
              steps: Steps) -> tuple[str, dict[str, int], str | None]:
    """The extension's tests in `venv`: (passed | failed, JUnit totals, why it failed)."""
    junit_path = cell_dist / f"junit{suffix}.xml"
    facts_path = cell_dist / CELL_FACTS
    for stale in (junit_path, facts_path):  # what this run writes, never an earlier run's
        stale.unlink(missing_ok=True)
    ext = ctx.matrix.extension
    suite = venv.parent / workspace.SUITE
    workspace.stage_tests(ctx.ext_dir, ext.tests, ext.import_name, suite,
                          workspace.engine_folders(ctx.ext_dir, ctx.work, ctx.dist),
                          ext.test_sources)
    cmd, env = test_cmd(ctx, venv, cell_dist, junit_path)
    with steps.timed("tests"):
        if ctx.require_gpu and ext.test_command is not None:
            # The extension's own command may run no pytest, and so no gate of ours: the
            # engine asks torch itself, in the test environment, before the tests run.
            probe = steps.run("tests", [str(envs.python_of(venv)), "-c", _GPU_PROBE],
                              cwd=suite, check=False)
            if probe.returncode == 3:
                return "failed", {}, f"{NO_GPU}; see {steps.shown}"
            if probe.returncode != 0:
                why = first_cause(probe.stdout) or f"exit {probe.returncode}"
                return "failed", {}, (f"torch does not import in the test environment: {why}; "
                                      f"see {steps.shown}")
        result = steps.run("tests", cmd, env=env, cwd=suite, check=False)
    # A test_command that writes no JUnit to {junit}: the counts its runner printed.
    junit = read_junit(junit_path) or tally_counts(result.stdout)
    facts = _read_facts(facts_path)
    if facts:
        junit["gpu_skipped"] = int(facts.get("gpu_skipped", 0))
    promised = ext.test_command is None or any("{junit}" in part for part in ext.test_command)
    if result.returncode == 0 and promised and not junit_path.is_file():
        # pytest writes its report at the session's end: a test that ended the process
        # (os._exit, a native crash handler exiting 0) leaves none, and ran what it ran.
        return "failed", junit, ("the tests exited 0 without writing their JUnit report: the "
                                 "process ended before the session did (the log's last lines "
                                 f"show where); see {steps.shown}")
    if result.returncode == 0:
        if wrong := _not_a_pass(junit, ctx.require_gpu):
            return "failed", junit, f"{wrong}; see {steps.shown}"
        return "passed", junit, None
    why = test_failure(result.returncode, result.stdout, facts,
                       ctx.matrix.extension.import_name)
    return "failed", junit, f"{why}; see {steps.shown}"


def _test_stable(cell: Cell, ctx: Context, wheel: Path, sources: envs.Sources, steps: Steps,
                 report: CellReport) -> None:
    report.serves = [_test_beside(cell, ctx, wheel, release, sources, steps)
                     for release in cell.serves]
    report.junit = _junit_totals(served.junit for served in report.serves)
    failed = [s for s in report.serves if s.test == "failed"]
    tested = [s for s in report.serves if s.test == "passed"]
    report.test = "passed" if tested and not failed else "failed"
    if failed:
        report.reason = f"beside torch {failed[0].torch}: {failed[0].reason}"
    elif not tested:
        report.reason = ("tested beside none of the torch releases it serves: "
                         f"{report.serves[0].reason if report.serves else 'none listed'}")
    else:
        report.reason = None


def _test_beside(cell: Cell, ctx: Context, wheel: Path, release: str, sources: envs.Sources,
                 steps: Steps) -> ServedTorch:
    """The wheel's tests beside one torch release, in a fresh environment of its own."""
    served = ServedTorch(torch=release)
    venv = ctx.work / cell.id / f"test-env-{release}"
    spec = f"torch=={release}"
    with steps.timed("test-env"):
        steps.run("test-env", envs.create_cmd(venv, envs.find_python(cell)))
        try:
            steps.run("test-env", envs.install_cmd(venv, [spec], sources))
        except StepFailed as exc:
            served.reason = f"torch {release} could not be installed here: {exc.detail}"
            return served
        # A failure here is this release's: the others keep their results.
        try:
            built = torch_build(venv)
        except StepFailed as exc:
            served.reason = exc.detail
            return served
        served.build = built.get("version")
        mismatch = _foreign_build(cell, built)
        if mismatch:
            served.reason = f"torch {served.build} installed here {mismatch}"
            return served
        try:
            steps.run("test-env", envs.install_cmd(
                venv, [spec, *test_requirements(ctx, wheel, cell)[1:]], sources))
        except StepFailed as exc:
            served.test = "failed"
            served.reason = f"the wheel could not be installed beside torch {release}: {exc.detail}"
            return served
    served.test, served.junit, served.reason = run_suite(
        ctx, venv, ctx.dist / cell.id, f"-{release}", steps)
    return served


def torch_build(venv: Path) -> dict:
    """torch's version and the CUDA / ROCm it was built with, as the environment reports."""
    code = ("import json, torch; print(json.dumps({'version': torch.__version__, "
            "'cuda': torch.version.cuda, 'hip': torch.version.hip}))")
    out = subprocess.run([str(envs.python_of(venv)), "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise StepFailed("env", f"torch does not import in {venv}: "
                                f"{(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _foreign_build(cell: Cell, built: dict) -> str | None:
    """Why a stable GPU wheel cannot be tested beside this build; a CPU wheel runs beside any."""
    if cell.family == "cpu":
        return None
    label = "CUDA" if cell.family == "cuda" else "ROCm"
    found = (built["cuda"] if cell.family == "cuda" else built["hip"]) or ""
    depth = toolkit_series_depth(cell.family)
    wanted = (cell.toolkit or "").split(".")[:depth]
    if not found:
        return f"has no {label}"
    if found.split(".")[:depth] != wanted:
        return f"is a {label} {found} build, not {label} {'.'.join(wanted)}.x"
    return None


def test_requirements(ctx: Context, wheel: Path, cell: Cell) -> list[str]:
    """The cell's torch, the wheel (with its `test` extra when it has one), the matrix's
    test_requires, and pytest when the engine runs the tests with pytest."""
    ext = ctx.matrix.extension
    extras = "[test]" if "test" in wheels.extras(wheel) else ""
    return [cell.torch_spec, f"{ext.name}{extras} @ {wheel.as_uri()}", *ext.test_requirements]


def test_cmd(ctx: Context, venv: Path, cell_dist: Path,
             junit: Path | None = None) -> tuple[list[str], dict[str, str]]:
    """The command that runs the copy of the tests run_suite stages beside `venv`."""
    ext = ctx.matrix.extension
    tests = venv.parent / workspace.SUITE / workspace.tests_path(ext.tests)
    junit = junit or cell_dist / "junit.xml"
    env = {"EXTMATRIX_CELL_REPORT": str(cell_dist / CELL_FACTS),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGIN_DIR),
                                                       os.environ.get("PYTHONPATH")]))}
    if ctx.require_gpu:
        env["EXTMATRIX_REQUIRE_GPU"] = "1"
    if ext.test_command is not None:
        # A command that runs pytest gets the plugin too (gate, GPU skips counted); -p
        # naming it as well is harmless, and any other program ignores the variable.
        env["PYTEST_PLUGINS"] = ",".join(filter(None, [os.environ.get("PYTEST_PLUGINS"),
                                                        PLUGIN]))
        fill = {"python": str(envs.python_of(venv)), "tests": str(tests), "junit": str(junit)}
        return [arg.format_map(fill) for arg in ext.test_command], env
    return [str(envs.python_of(venv)), "-m", "pytest", str(tests), "-p", PLUGIN,
            # -rfEs: pytest's own -rfE (the FAILED and ERROR lines the reason is taken
            # from) and the skipped tests' reasons.
            "-p", "no:cacheprovider", "--rootdir", str(tests), "-q", "-rfEs",
            f"--junitxml={junit}", *ext.test_args], env


def _not_a_pass(junit: dict[str, int], require_gpu: bool = False) -> str | None:
    """Why a run whose command exited 0 is no pass: its own counts say tests failed (a
    test_command piped through tee, say), or it verified nothing: every test skipped, some
    for another reason than a missing GPU (a test dependency missing, say). Skips for want
    of a GPU alone pass: those tests are the GPU job's (--require-gpu) to run; in that job,
    a test skipped for a GPU reason is one the job exists to run, and failing it is how
    CI says so."""
    skipped = junit.get("skipped", 0)
    failed = junit.get("failures", 0) + junit.get("errors", 0)
    if failed:
        return (f"the test command exited 0, yet {failed} of its tests failed or erred (the "
                "log lists them); make the command exit non-zero on a failure")
    if junit and junit.get("tests", 0) == 0:  # unittest's "Ran 0 tests ... OK" exits 0
        return "no test ran (the log shows what the runner found)"
    if require_gpu and junit.get("gpu_skipped", 0):
        return (f"--require-gpu, yet {junit['gpu_skipped']} test(s) skipped for a GPU reason "
                "on this GPU machine (the log lists why)")
    if not junit or junit.get("passed", 0) > 0 or not skipped:
        return None
    if require_gpu:
        return (f"--require-gpu, yet no test passed: all {skipped} skipped (the log lists "
                "why)")
    other = skipped - junit.get("gpu_skipped", 0)
    if other <= 0:
        return None
    return (f"no test passed: all {skipped} skipped, {other} not for want of a GPU (the "
            "log lists why)")


def test_failure(code: int, output: str, facts: dict, package: str | None = None) -> str:
    """Why the tests failed, as the fix would be stated. `package` is the extension's
    import name: a module of its own that is missing is the wheel's fault, not a test
    dependency's."""
    if facts.get("no_gpu"):
        return NO_GPU
    cause = failed_test_line(output)
    # A missing module counts where a test failed on it (a passing test may print one in
    # a warning); where no test ran at all (a conftest that failed to import), anywhere.
    some_test_failed = re.search(r"^(?:FAILED|ERROR) ", output, re.M) is not None
    missing = _MISSING_MODULE.search(cause if some_test_failed else output)
    if missing and package and (missing[1] == package or missing[1].startswith(f"{package}.")):
        return (f"the wheel has no module '{missing[1]}', which the tests import: the build "
                "left it out (the build log says what it compiled)")
    if missing:
        return (f"the tests need '{missing[1]}', which is not in the test environment: add it "
                "to extension.test_requires in the matrix, or to the extension's `test` extra")
    if code == 4:
        return f"the test command was refused (exit 4): {cause}"
    if code == 5:
        return "no tests were collected (exit 5): check extension.tests in the matrix"
    return f"tests failed (exit {code}): {cause}"


def failed_test_line(output: str) -> str:
    """pytest's first FAILED or ERROR line, its message completed where pytest cut it to
    the terminal's width (first_cause knows pytest's output by its closing tally)."""
    cause = first_cause(output)
    if cause and cause.startswith(("FAILED ", "ERROR ")):
        return cause
    failed = [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return failed[0] if failed else (cause or "no message")


def _read_facts(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_UNITTEST_RAN = re.compile(r"^Ran (?P<tests>\d+) tests? in ")
_UNITTEST_END = re.compile(r"^(?P<verdict>OK|FAILED)(?: \((?P<details>[^)]*)\))?$")
_PYTEST_COUNT = re.compile(r"(?P<n>\d+) (?P<what>passed|failed|errors?|skipped)\b")


def tally_counts(output: str) -> dict[str, int]:
    """JUnit-like counts from the closing tally of unittest ("Ran 3 tests", "OK (skipped=3)")
    or pytest ("3 skipped in 0.1s"), for a suite that wrote no JUnit; {} when neither."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for at in range(len(lines) - 1, -1, -1):
        if (ran := _UNITTEST_RAN.match(lines[at])) is not None:
            end = next((m for line in lines[at + 1:] if (m := _UNITTEST_END.match(line))), None)
            details = dict(part.strip().split("=", 1) for part in
                           (end["details"] or "").split(",") if "=" in part) if end else {}
            counts = {"tests": int(ran["tests"]),
                      "failures": int(details.get("failures", 0)),
                      "errors": int(details.get("errors", 0)),
                      "skipped": int(details.get("skipped", 0))}
            break
        if PYTEST_TALLY.match(lines[at]):
            found = {"error" if m["what"].startswith("error") else m["what"]: int(m["n"])
                     for m in _PYTEST_COUNT.finditer(lines[at])}
            counts = {"failures": found.get("failed", 0), "errors": found.get("error", 0),
                      "skipped": found.get("skipped", 0)}
            counts["tests"] = sum(counts.values()) + found.get("passed", 0)
            break
    else:
        return {}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def read_junit(path: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    totals["passed"] = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    return totals


def cross_check(cell: Cell, other: Cell, ctx: Context,
                commands: list[str] | None = None) -> str:
    """This cell's wheel imported beside another cell's torch; its commands go to the cell's
    test log (and to `commands`), as the tests' do, so that repro shows them.

    A clear ImportError is right ("ok"). A crash, an undefined symbol or any other
    error is wrong everywhere ("FAILED"). An import that works is news, not a failure
    ("loads"), unless the matrix says `cross_torch: refuse`."""
    log = Steps(ctx.dist / cell.id / "test.log", echo=ctx.echo)
    try:
        return _cross_check(cell, other, ctx, log)
    finally:
        log.close()
        if commands is not None:
            commands += log.commands


def _cross_check(cell: Cell, other: Cell, ctx: Context, log: Steps) -> str:
    venv = ctx.work / other.id / "test-env"
    wheel = recorded_wheel(ctx.dist / cell.id)
    target = ctx.work / cell.id / f"cross-{other.id}"
    shutil.rmtree(target, ignore_errors=True)
    installed = log.run("cross-check", [
        envs.uv(), "pip", "install", "--quiet", "--no-deps", "--target", str(target),
        "--python", str(envs.python_of(venv)), str(wheel)], check=False)
    if installed.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        why = (installed.stdout.strip().splitlines() or ["?"])[-1]
        return f"{CROSS_NOT_MADE} beside {other.id}'s torch: {why}"
    ext = ctx.matrix.extension
    # torch first, as its users import it: a binary linked against libtorch cannot even
    # find libc10 before torch is loaded, an ImportError that says nothing of its torch.
    result = log.run("cross-check", [str(envs.python_of(venv)), "-c",
                                     f"import torch\nimport {ext.import_name}"],
                     env={"PYTHONPATH": str(target)}, cwd=target, check=False)
    output = result.stdout
    shutil.rmtree(target, ignore_errors=True)
    last = (output.strip().splitlines() or [""])[-1]
    label = f"beside {other.id}'s torch ({other.torch})"
    fix = ("pin torch in the wheel's requirements and compare torch.__version__ at import, "
           "raising ImportError before the binary loads")
    if result.returncode < 0:
        return f"FAILED {label}: the import crashed ({_signal_name(-result.returncode)}); {fix}"
    if result.returncode == 0:
        if ext.cross_torch == "refuse":
            return f"FAILED {label}: imported without error; {fix}"
        return (f"loads {label}: the import works with torch {other.torch} too (the pin "
                f"{cell.requires_torch} may be tighter than needed)")
    if ("undefined symbol" in last or "cannot open shared object file" in last
            or not last.startswith("ImportError")) or (
            ext.mismatch_message and ext.mismatch_message not in last):
        return f"FAILED {label}: {last or f'exit {result.returncode}'}; {fix}"
    return f"ok {label}: {last}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
