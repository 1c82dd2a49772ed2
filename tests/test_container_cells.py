"""Real container cells, end to end, through each engine: the cell's image (docker buildx
bake, or podman), cibuildwheel inside it, the wheel tested outside.

Slow (minutes; the first run also bootstraps the Debian base image without a
registry). An engine that is not usable here is skipped, unless it is listed in
EXTMATRIX_CONTAINER_ENGINES (CI lists the engines it installed: one that went
missing must fail the run, not skip it).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from extmatrix import engines, envs, images, toolchain
from extmatrix.cli import main
from extmatrix.errors import NotBuildable
from extmatrix.report import CellReport

ROOT = Path(__file__).resolve().parent.parent
MATRIX = str(ROOT / "matrix.yaml")
CPU = "torch2.13-cpu"
REQUIRED = os.environ.get("EXTMATRIX_CONTAINER_ENGINES", "").split()

pytestmark = [pytest.mark.cells, pytest.mark.container]


@pytest.fixture(scope="module", params=["podman", "docker"])
def engine(request) -> engines.Engine:
    name = request.param
    try:
        found = engines.detect(name, ROOT, toolchain.cache_root())
    except NotBuildable as exc:
        if name in REQUIRED:
            pytest.fail(f"container tests with {name} are required here: {exc}")
        pytest.skip(str(exc))
    saved = os.environ.get("EXTMATRIX_ENGINE")
    os.environ["EXTMATRIX_ENGINE"] = name
    yield found
    if saved is None:
        os.environ.pop("EXTMATRIX_ENGINE", None)
    else:
        os.environ["EXTMATRIX_ENGINE"] = saved


@pytest.fixture(scope="module")
def dist(engine, tmp_path_factory) -> Path:
    assert main(["images", "--matrix", MATRIX, "--cell", CPU, "--engine", engine.name]) == 0
    out = tmp_path_factory.mktemp(f"container-dist-{engine.name}")
    status = main(["build", "--matrix", MATRIX, "--backend", "container", "--cell", CPU,
                   "--dist", str(out)])
    log = out / CPU / "build.log"
    assert status == 0 and log.is_file(), log.read_text()[-3000:] if log.is_file() else status
    return out


def test_the_wheel_is_repaired_and_leaves_torch_to_torch(engine, dist):
    report = CellReport.read(dist / CPU / "report.json")
    assert report is not None and report.build == "built", report and report.reason
    assert report.backend == "container" and f"({engine.name}, from" in report.toolkit
    assert report.wheel.startswith("segment_ops-0.1.0+pt213cpu-cp310-abi3-manylinux_2_")
    assert "torch==2.13.*" in report.requires
    repair = report.repair
    assert repair["tag"].split("-")[-1].startswith("manylinux_2_")
    assert {"libc10.so", "libtorch_cpu.so"} <= set(repair["excluded"])
    assert not [lib for lib in repair["vendored"] if lib.startswith(("libtorch", "libc10"))]
    assert repair["problems"] == []
    assert report.timings["compile"] > 0 and report.timings["in_image_tests"] > 0
    log = (dist / CPU / "build.log").read_text()
    assert f"# engine: {engine.name}" in log


def test_the_wheel_passes_the_matrix_tests(dist, capsys):
    # Not strict: a machine with fewer Pythons than the abi3 wheel serves would fail it on
    # that alone (test_faults tests that rule).
    status = main(["test-matrix", "--matrix", MATRIX, "--cell", CPU, "--dist", str(dist),
                   "--no-strict"])
    assert status == 0, capsys.readouterr().err
    report = CellReport.read(dist / CPU / "report.json")
    assert report.test == "passed" and report.junit["failures"] == 0
    assert report.junit["passed"] > 20


def test_no_image_layer_holds_the_ca_bundle(engine, dist, tmp_path):
    """pip inside the build needs the host's CA bundle (a TLS-inspecting proxy); it gets it
    as a build secret. Build the pip stage afresh with a bundle carrying a marker, then look
    for the marker in every layer of the saved image."""
    ca = engines.ca_bundle()
    if ca is None:
        pytest.skip("no CA bundle on this machine")
    marker = f"extmatrix-ca-marker-{uuid.uuid4().hex}"
    bundle = tmp_path / "ca.pem"
    bundle.write_text(ca.read_text() + f"\n# {marker}\n")
    tag = f"localhost/extmatrix-ca-probe:{marker[-8:]}"
    base = images.local_base("extmatrix")
    common = ["--no-cache", "--target", "tools", "--build-arg", f"BASE_IMAGE={base}",
              "--secret", images.ca_secret(bundle), "-t", tag, str(ROOT / "docker")]
    build = (engine.cmd("buildx", "build", "--load", *common) if engine.name == "docker"
             else engine.cmd("build", "--format", "docker", *common))
    env = {**os.environ, **engine.env}
    done = subprocess.run(build, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = tmp_path / "image.tar"
    try:
        subprocess.run(engine.cmd("save", "-o", str(saved), tag), env=env, check=True)
    finally:
        subprocess.run(engine.cmd("rmi", "-f", tag), env=env, capture_output=True)
    found = []
    with tarfile.open(saved) as image:
        for member in image:
            if not member.isfile():
                continue
            data = image.extractfile(member).read()
            if marker.encode() in data:
                found.append(member.name)
                continue
            found += [f"{member.name}:{name}" for name in _files_holding(data, marker)]
    assert found == []


def _files_holding(layer: bytes, marker: str) -> list[str]:
    """Files of a layer (a plain or gzipped tar) whose content holds `marker`."""
    try:
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            return [m.name for m in tar
                    if m.isfile() and marker.encode() in tar.extractfile(m).read()]
    except tarfile.ReadError:
        return []  # not a layer: a manifest or config


def test_hipify_turns_the_cuda_kernels_into_hip(dist, tmp_path):
    """The ROCm build's first step, on CPU: torch's own hipify over the .cu sources.

    Compiling the result needs a ROCm torch and a matching hipcc, neither of which a
    CPU-only builder without PyTorch's index has; that part runs in real CI only.
    """
    venv = Path(os.environ.get("EXTMATRIX_WORK") or ROOT / ".extmatrix") / CPU / "test-env"
    assert envs.python_of(venv).exists()  # left by test-matrix
    script = (
        "import shutil, sys\n"
        "from torch.utils.hipify import hipify_python\n"
        "root = sys.argv[1]\n"
        "shutil.copytree(sys.argv[2], root + '/csrc')\n"
        "done = hipify_python.hipify(project_directory=root, output_directory=root,\n"
        "    includes=[root + '/csrc/cuda/*'], is_pytorch_extension=True,\n"
        "    show_detailed=False, show_progress=False)\n"
        "print('\\n'.join(str(v.hipified_path) for v in done.values() if v.hipified_path))\n")
    result = subprocess.run([str(envs.python_of(venv)), "-c", script, str(tmp_path / "hip"),
                             str(ROOT / "ext" / "csrc")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    # The binding (.cu -> .hip) and the kernels header it includes, both hipified.
    produced = [Path(p) for p in result.stdout.split() if "/hip/" in p]
    assert any(p.suffix == ".hip" for p in produced), result.stdout
    text = "".join(p.read_text() for p in produced)
    assert "hip/hip_runtime.h" in text and "hipcub/hipcub.hpp" in text
    assert "<cub/" not in text and "cub::" not in text.replace("hipcub::", "")
    assert '#include "../hip/segment_kernels.cuh"' in text
    assert "hipLaunchKernelGGL" in text and "<<<" not in text
    assert "hipStream_t" in text and "cudaStream_t" not in text
    assert "__hip_bfloat16" in text and "__nv_bfloat16" not in text
    assert "c10/hip/HIPGuard.h" in text and "c10/cuda/" not in text
