"""cibuildwheel's configuration for one cell, as the CIBW_* environment it reads.

Everything cibuildwheel does for a cell follows from here: the image and the
Python that build the wheel; the cell's exact torch installed first (the build
is not isolated, so it compiles against that torch); the environment the
extension's setup.py reads; a repair that leaves torch and the GPU runtime out
of the wheel; and the extension's tests against the installed wheel. What the
repair really did is read back from the repaired wheel (`repaired`).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import string
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .cells import Cell
from .config import Extension
from .envs import Sources
from .errors import NotBuildable
from .toolchain import honoured_env
from .workspace import SUITE, extension_path, tests_path

# Libraries the wheel must load from torch's own install (or the driver's), never carry a
# copy of: two copies of libtorch in one process break the op registry and the allocator,
# a second cuBLAS or rocBLAS doubles the wheel for nothing, and libcuda is the driver's
# (no build image has it: auditwheel would refuse the wheel). auditwheel takes globs.
_TORCH = ("libtorch*.so", "libc10*.so")
_CUDA = ("libcuda.so.*", "libcudart.so.*", "libcublas*.so.*", "libcusparse*.so.*",
         "libcufft*.so.*", "libcurand.so.*", "libcusolver*.so.*", "libnvrtc*.so.*",
         "libnvJitLink.so.*", "libcudnn*.so.*", "libnccl.so.*", "libnvToolsExt.so.*",
         "libcupti.so.*")
_ROCM = ("libamdhip64.so.*", "libhsa-runtime64.so.*", "librocblas.so.*", "libhipblas*.so.*",
         "libMIOpen.so.*", "librccl.so.*", "libhipsparse*.so.*", "libhipfft.so.*",
         "libhiprand.so.*", "librocrand.so.*", "librocsolver.so.*", "libhipsolver.so.*",
         "libroctx64.so.*", "librocprofiler-sdk*.so.*")
REPAIR_EXCLUDES = {"cpu": _TORCH, "cuda": (*_TORCH, *_CUDA), "rocm": (*_TORCH, *_ROCM)}
# What cibuildwheel fills in a test command itself; '#{project}' is its escape for a literal.
CIBW_PLACEHOLDERS = re.compile(r"\{(?:project|package|wheel)\}")
HOST_MOUNT = "/host"  # cibuildwheel mounts the host's / there
CCACHE_MOUNT = "/ccache"  # the images' CCACHE_DIR
PIP_CACHE_MOUNT = "/pip-cache"


@dataclass(frozen=True)
class Host:
    """What the build machine lends the container, as paths on the host."""

    engine: str  # docker | podman
    sources: Sources  # pip sources for torch and the rest
    ccache_dir: str
    pip_cache_dir: str
    ca_bundle: str | None  # trusted inside too, for TLS-inspecting networks
    max_jobs: int


def abi(python: str) -> str:
    """3.11 -> cp311-cp311, the /opt/python folder of that CPython (3.14t -> cp314-cp314t)."""
    tag = "cp" + python.removesuffix("t").replace(".", "")
    return f"{tag}-{tag}{'t' if python.endswith('t') else ''}"


# Free-threaded CPythons the pinned cibuildwheel (4.x) no longer builds: it refuses their
# build selector (4.0 dropped 3.13t, whose ABI the 3.14t one replaced).
UNBUILT_FREE_THREADED = frozenset({"3.13t"})


def build_python(cell: Cell, image_abis: list[str] | None) -> str:
    """The Python that builds the cell's wheel in its image.

    An abi3 wheel is tagged by the extension's py_limited_api, not by the Python
    that built it, so any Python the cell supports will do; `image_abis` lists the
    /opt/python builds an image declares (None: a manylinux image, which has all).
    """
    if cell.python in UNBUILT_FREE_THREADED:
        raise NotBuildable(f"cell {cell.id}: cibuildwheel 4 builds no Python {cell.python} "
                           f"wheel; build it with the local backend, or drop {cell.python} "
                           "from the matrix's Pythons")
    if image_abis is None:
        return cell.python
    candidates = list(cell.test_pythons) if cell.abi3 else [cell.python]
    for python in candidates:
        if abi(python) in image_abis:
            return python
    raise NotBuildable(f"image {cell.image} has {', '.join(image_abis)}; cell {cell.id} builds "
                       f"with Python {' or '.join(candidates)}")


def identifier(cell: Cell, python: str) -> str:
    return f"cp{python.replace('.', '')}-manylinux_{cell.platform}"


def inside(location: str) -> str:
    """A host path or file:// URL as the container sees it (under /host); other URLs as is."""
    if location.startswith("file://"):
        return f"file://{HOST_MOUNT}{location[len('file://'):]}"
    if "://" in location:
        return location
    return f"{HOST_MOUNT}{location}"


def host_paths(host: Host) -> list[str]:
    """The host folders the container's environment refers to under /host. A local simple
    index links to files beside it (…/simple/x/ -> ../../files/x.whl): its parent goes."""
    src = host.sources
    paths = []
    for location in [src.index_url, *src.extra_index_urls, *src.find_links, host.ca_bundle]:
        if not location or ("://" in location and not location.startswith("file://")):
            continue
        path = Path(location[len("file://"):] if location.startswith("file://") else location)
        is_index = location in (src.index_url, *src.extra_index_urls)
        paths.append(str(path.parent if is_index else path))
    return list(dict.fromkeys(paths))


def ccache_statslog(cell: Cell) -> str:
    """Where, relative to the ccache folder, a container build logs its ccache counts."""
    return f"stats/{cell.id}.log"


def container_env(cell: Cell, host: Host, python: str) -> dict[str, str]:
    """The build's environment inside the container (the image's own ENV underneath,
    which sets CUDA_HOME/ROCM_HOME and routes compilers through ccache)."""
    env: dict[str, str] = {}
    src = host.sources
    if src.index_url:
        env["PIP_INDEX_URL"] = inside(src.index_url)
    if src.extra_index_urls:
        env["PIP_EXTRA_INDEX_URL"] = " ".join(inside(u) for u in src.extra_index_urls)
    if src.find_links:
        env["PIP_FIND_LINKS"] = " ".join(inside(u) for u in src.find_links)
    if host.ca_bundle:
        env["PIP_CERT"] = inside(host.ca_bundle)
    env.update(PIP_CACHE_DIR=PIP_CACHE_MOUNT, CCACHE_DIR=CCACHE_MOUNT,
               # The cell's own compiles, counted apart from other cells' in the one cache.
               CCACHE_STATSLOG=f"{CCACHE_MOUNT}/{ccache_statslog(cell)}",
               MAX_JOBS=str(host.max_jobs), **honoured_env(cell))
    major = int((cell.toolkit or "0").split(".")[0])
    if cell.family == "cuda" and major >= 13:
        # ATen's CUDA headers include cuBLAS/cuSPARSE headers, which a compiler-only
        # toolkit lacks: torch's own nvidia wheels bring them into site-packages.
        site = f"/opt/python/{abi(python)}/lib/python{python}/site-packages"
        env["CPATH"] = f"{site}/nvidia/cu{major}/include"
        # ... nor nvrtc, which CMake's find_package(Torch) links: torch's own copy.
        env["CMAKE_ARGS"] = f"-DCUDA_nvrtc_LIBRARY={site}/nvidia/cu{major}/lib/libnvrtc.so.{major}"
    return env


def environment(cell: Cell, extension: Extension, host: Host, python: str,
                build_requires: list[str], build_env: dict[str, str] | None = None,
                pytest_settings: str | None = None,
                conftests: Sequence[str] = ()) -> dict[str, str]:
    """The CIBW_* variables that make `cibuildwheel --platform linux` build this cell;
    `build_env`: more variables for the build inside the container; `pytest_settings`: the
    file, in the extension, pytest takes the tests' settings from (workspace.pytest_settings);
    `conftests`: those above the tests folder (workspace.conftests_above)."""
    plat = cell.platform.upper()
    # cibuildwheel splits create_args as a shell would: a cache folder with a space in it
    # must stay one argument.
    mounts = [shlex.quote(f"--volume={host.ccache_dir}:{CCACHE_MOUNT}"),
              shlex.quote(f"--volume={host.pip_cache_dir}:{PIP_CACHE_MOUNT}")]
    inner = {**container_env(cell, host, python), **(build_env or {})}
    excludes = " ".join(f"--exclude {shlex.quote(p)}" for p in REPAIR_EXCLUDES[cell.family])
    return {
        "CIBW_CONTAINER_ENGINE": f"{host.engine}; create_args: {' '.join(mounts)}",
        "CIBW_ARCHS_LINUX": cell.platform,
        "CIBW_BUILD": identifier(cell, python),
        f"CIBW_MANYLINUX_{plat}_IMAGE": cell.image,
        "CIBW_BUILD_FRONTEND": "pip; args: --no-build-isolation",
        "CIBW_BEFORE_BUILD": " && ".join(filter(None, [
            "pip install " + shlex.join([cell.torch_spec, *build_requires]),
            torch_build_check(cell)])),
        "CIBW_ENVIRONMENT": " ".join(f"{k}={shlex.quote(v)}" for k, v in inner.items()),
        "CIBW_REPAIR_WHEEL_COMMAND": f"auditwheel repair {excludes} -w {{dest_dir}} {{wheel}}",
        # cibuildwheel's own abi3 audit fetches virtualenv.pyz from GitHub; abi3audit
        # runs on the host after the build instead.
        "CIBW_AUDIT_COMMAND": "",
        # The test venv would otherwise take the newest torch of the series.
        "CIBW_BEFORE_TEST": "pip install " + shlex.quote(cell.torch_spec),
        "CIBW_TEST_EXTRAS": "test",
        "CIBW_TEST_REQUIRES": shlex.join(extension.test_requirements),
        "CIBW_TEST_COMMAND": test_command(extension, pytest_settings, conftests),
        "CIBW_BUILD_VERBOSITY": "1",
    }


def torch_build_check(cell: Cell) -> str | None:
    """A shell command that fails unless the torch installed is the cell's CUDA or ROCm
    build: an unreachable PyTorch index quietly yields PyPI's build of the same version,
    whose CUDA may be another one (the local backend's check_torch_build)."""
    if cell.family == "cpu" or not cell.toolkit:
        return None
    attr, label = ("cuda", "CUDA") if cell.family == "cuda" else ("hip", "ROCm")
    want = ".".join(cell.toolkit.split(".")[:2])
    code = (f'import sys, torch; v = torch.version.{attr} or ""; '
            f'sys.exit("torch " + torch.__version__ + " installed for this cell is a build with '
            f'{label} " + (v or "none") + ", not {label} {want}") '
            f'if ".".join(v.split(".")[:2]) != "{want}" else None')
    return "python -c " + literal(code)


def literal(text: str) -> str:
    """`text` as one shell word that cibuildwheel's placeholder filling leaves as it is."""
    return shlex.quote(CIBW_PLACEHOLDERS.sub(r"#\g<0>", text))


def test_command(extension: Extension, pytest_settings: str | None = None,
                 conftests: Sequence[str] = ()) -> str:
    """The shell line cibuildwheel runs the tests with, in its test venv (`python` is the
    venv's, first on PATH) and a scratch folder; every matrix value in it is quoted.

    The tests run from a copy in a folder of that one, with their pytest settings and test
    sources, as the local backend runs them (workspace.stage_tests): in place, the
    extension's sources would be imported instead of the wheel."""
    # {package}: the extension's folder, below {project} where it lies in a folder of its
    # git repository (project.build_tree).
    tests = PurePosixPath(SUITE, tests_path(extension.tests))
    name = literal(tests_path(extension.tests))
    root = PurePosixPath(SUITE, extension_path(extension.tests))
    # Each into its folder at the same place in the suite: `cp -R` then merges a test source
    # that holds the tests folder with their copy.
    into = [(rel, (root / rel).parent) for rel in
            [*extension.test_sources, *([pytest_settings] if pytest_settings else []),
             *conftests]]
    folders = dict.fromkeys([tests.parent, *(folder for _, folder in into)])
    stage = [f"mkdir -p {' '.join(literal(str(f)) for f in folders)}",
             f"cp -RL {{package}}/{literal(extension.tests)} {literal(str(tests))}",
             *(f"cp -RL {{package}}/{literal(rel)} {literal(f'{f}/')}" for rel, f in into),
             *([] if pytest_settings else [f": > {SUITE}/pytest.ini"]), f"cd {SUITE}"]
    if not PurePosixPath(extension.tests).name:  # the extension's folder: not its package
        stage.append(f"rm -rf {name}/{extension.import_name} {name}/{extension.import_name}.*")
    if extension.test_command is None:
        run = (f"python -m pytest {name} -p no:cacheprovider --rootdir {name} -q -rfEs "
               + " ".join(map(literal, extension.test_args))).strip()
    else:
        # Nobody reads the in-image tests' JUnit (test-matrix reports the cell's tests): it
        # goes to the scratch folder cibuildwheel runs the tests in, and deletes after.
        fill = {"python": "python", "tests": f'"$PWD"/{name}', "junit": '"$PWD"/junit.xml'}
        run = " ".join(shell_word(arg, fill) for arg in extension.test_command)
    return " && ".join([*stage, run])


def shell_word(arg: str, fill: dict[str, str]) -> str:
    """One test_command item as one shell word: its placeholders as `fill` writes them,
    the rest (with '{{' and '}}' unescaped) as literal text."""
    word = text = ""
    for literal_text, name, _, _ in string.Formatter().parse(arg):
        text += literal_text
        if name is not None:
            word += (literal(text) if text else "") + fill[name]
            text = ""
    return word + (literal(text) if text or not word else "")


@dataclass
class Repair:
    """What the repaired wheel links to and carries, read from its binaries."""

    tag: str  # e.g. cp310-abi3-manylinux_2_34_x86_64
    excluded: list[str] = field(default_factory=list)  # needed, left to torch's install
    vendored: list[str] = field(default_factory=list)  # grafted into <pkg>.libs/
    problems: list[str] = field(default_factory=list)


def repaired(wheel: Path, cell: Cell) -> Repair:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    tag = "-".join(wheel.name[: -len(".whl")].split("-")[-3:])
    facts = Repair(tag)
    needed: set[str] = set()
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            base = name.rsplit("/", 1)[-1]
            if not (base.endswith(".so") or ".so." in base):
                continue
            if ".libs/" in name:
                facts.vendored.append(base)
                continue
            with zf.open(name) as fh:
                try:
                    dynamic = ELFFile(fh).get_section_by_name(".dynamic")
                except ELFError:
                    continue
                if dynamic is not None:
                    needed |= {t.needed for t in dynamic.iter_tags("DT_NEEDED")}
    patterns = REPAIR_EXCLUDES[cell.family]
    facts.excluded = sorted(n for n in needed if any(fnmatch.fnmatch(n, p) for p in patterns))
    facts.vendored.sort()
    if not tag.split("-")[-1].startswith("manylinux_"):
        facts.problems.append(f"the wheel is tagged {tag}, not a repaired manylinux_* wheel")
    for lib in facts.vendored:
        # auditwheel renames what it grafts: libfoo.so.1 -> libfoo-1a2b3c4d.so.1
        original = re.sub(r"-[0-9a-f]{8}(?=\.so)", "", lib)
        if any(fnmatch.fnmatch(original, p) for p in patterns):
            facts.problems.append(f"the wheel carries its own {original}; torch's must be used")
    return facts
