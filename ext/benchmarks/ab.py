"""A/B test of kernel variants: builds the ops once per variant of the CUDA
kernel header, each under its own torch.ops namespace, then times them side by
side in one process on the same inputs, rounds interleaved, against a copy.

    # where the extension builds (a GPU is not needed; name the architectures)
    TORCH_CUDA_ARCH_LIST=9.0 python benchmarks/ab.py build --out /tmp/ab \\
        base=csrc/cuda/segment_kernels.cuh try=/tmp/try/segment_kernels.cuh
    # on the GPU (a copy of /tmp/ab)
    python benchmarks/ab.py run /tmp/ab --cases bfloat16:power:1,float32:short:4
    # one variant's op on one case, untimed, under a profiler
    ncu --profile-from-start off --kernel-name regex:tile_gather --launch-count 1 \\
        python benchmarks/ab.py profile /tmp/ab --case bfloat16:power:4 --op bwd

A variant is NAME=HEADER[:MACRO[=VALUE]...]: the sources of this folder's
parent with csrc/cuda/segment_kernels.cuh replaced by HEADER and each MACRO
defined, built with CMake (as CMakeLists.txt says) into DIR/NAME/ (the
library, its sources, CMake cache and build log: DIR copies to the GPU as it
is); e.g.
try=/tmp/try.cuh:NEW_SPLIT=1 is that header built with NEW_SPLIT defined to 1,
for a header that switches a change on with a macro. A variant whose file
ends in .py is a Triton one instead: that file in place of
src/segment_ops/_triton.py, its forward (`backend="triton"`) under its own
torch.ops namespace, nothing to build (it compiles on the GPU); Triton and
CUDA variants side by side time one against the other, e.g.
`cuda=csrc/cuda/segment_kernels.cuh tri=src/segment_ops/_triton.py
try=/tmp/try.py`; each case tunes a Triton variant's tile shapes on its own
segments, as the benchmark does. `run` prints, per case and op (fwd: the sum,
bwd: the gather; `--ops fwd` times only the sum), each variant's bandwidth as
a fraction of the copy's and its time relative to the first variant's that has
that op (> 1: faster), and the largest difference of its results from that
variant's. `run --kernels` also records a few calls of each op with
torch.profiler: each kernel's GPU time a call, and how long the device sat
idle between the op's first kernel start and last kernel end (kernels that
overlap, as those launched early do, count once): what an op loses outside
its main kernel (a gated kernel that exits, a fix-up, the gaps between
launches). It reports that idle time for a call recorded alone, which starts
on an idle device (a gap there may be the host still launching the next
kernel), and for a call among many queued back to back, as the timed loop
runs them. Built against a CPU torch, the libraries hold only the CPU kernels,
which the header does not touch: enough to try the tool with `run --device
cpu`, not to compare kernels. `profile` calls one variant's op (the first
built, unless --variant names another) --calls times on one case of the same
size, untimed, for a profiler to record, after --warmup calls (a Triton
variant's first call tunes its tile shapes, launching its kernel hundreds of
times) outside the profiler's range: `ncu --profile-from-start off` records
only the --calls (cudaProfilerStart and Stop around them). `resources` lists
each CUDA variant's kernels with their registers, shared memory, local and
stack (spill) bytes per architecture, read from the built libraries by
cuobjdump (no GPU needed; `--changed` keeps the
kernels where variants differ); for Triton variants, it compiles here (for
--arch, sm_90 unless named) each launch the variant would make on `--cases`,
one row per autotuner config kept after pruning, so a change that breaks the
compiler or adds registers shows before the GPU. `--cut N` (run, profile) cuts
every segment longer than N rows into pieces of N: the same rows without the
law's long tail, e.g. to tell what a power law's few giant segments cost from
what its crowd of short ones does. `stalls` reads Nsight Compute's source
page, exported as CSV from a report collected with `--section SourceCounters
--section WarpStateStats` (`ncu --import REPORT.ncu-rep --page source
--csv --print-source sass`, gzipped or not), and prints where each kernel's
warps waited: its stall reasons, then the instructions holding the most
samples.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import inspect
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import bench  # this folder's benchmark: laws, indptr, timer
except ImportError as err:  # it needs numpy and an installed segment_ops; `build` needs neither
    bench = None
    BENCH_MISSING = err

SOURCE_DIR = Path(__file__).resolve().parents[1]
HEADER = Path("csrc", "cuda", "segment_kernels.cuh")
MANIFEST = "variants.json"
DEFAULT_CASES = "float32:short:1,float32:power:1,bfloat16:short:1,bfloat16:power:1,bfloat16:power:4"
KINDS = ("fwd", "bwd")  # the sum, the gather
OP_OF_KIND = {"fwd": "segment_sum", "bwd": "segment_gather"}


class UsageError(Exception):
    """A mistake in the command line or its files: reported in one line, exit 2."""


IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"


def is_triton(path: Path) -> bool:
    """Whether a variant's file is a Triton module rather than a CUDA header."""
    return path.suffix == ".py"


def parse_variant(text: str) -> tuple[str, Path, list[str]]:
    """NAME=HEADER[:MACRO[=VALUE]...] -> (NAME, HEADER, ["MACRO=VALUE", ...])."""
    name, sep, rest = text.partition("=")
    if not sep or not re.fullmatch(IDENTIFIER, name):
        raise UsageError(
            f"variant {text!r}: expected NAME=HEADER[:MACRO[=VALUE]...], NAME a C identifier"
        )
    header, *defines = rest.split(":")
    if is_triton(Path(header)) and defines:
        raise UsageError(f"variant {name}: a Triton module ({header}) takes no macros")
    for define in defines:
        if not re.fullmatch(rf"{IDENTIFIER}(=[A-Za-z0-9_.+-]*)?", define):
            raise UsageError(
                f"variant {name}: {define!r} is not MACRO or MACRO=VALUE "
                "(a C identifier, then letters, digits, '_', '.', '+' or '-')"
            )
    path = Path(header)
    if not path.is_file():
        raise UsageError(f"variant {name}: no file {header}")
    return name, path, defines


def first_file(*candidates) -> str | None:
    """The first candidate path (None and empty ones skipped) that is a file."""
    return next((str(c) for c in candidates if c and Path(c).is_file()), None)


def find_cmake() -> str:
    found = first_file(
        os.environ.get("CMAKE"), Path(sys.executable).parent / "cmake", shutil.which("cmake")
    )
    if found is None:
        raise UsageError("cmake not found: pip install cmake, or set CMAKE")
    return found


def cuda_args() -> list[str]:
    """What find_package(Torch) needs to build the CUDA kernels beside a CUDA torch."""
    if not torch.version.cuda:
        return []
    from torch.utils import cpp_extension

    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not archs:
        raise UsageError("set TORCH_CUDA_ARCH_LIST to the GPU's architecture, e.g. 9.0")
    home = cpp_extension.CUDA_HOME
    if not home or not Path(home, "bin", "nvcc").is_file():
        raise UsageError("no CUDA toolkit found: set CUDA_HOME")
    args = [
        "-DSEGMENT_OPS_CUDA=ON",
        f"-DCMAKE_CUDA_COMPILER={Path(home, 'bin', 'nvcc')}",
        f"-DCUDA_TOOLKIT_ROOT_DIR={home}",
        f"-DTORCH_CUDA_ARCH_LIST={archs}",
    ]
    bundled = sorted(Path(torch.__file__).parents[1].glob("nvidia/*/lib/libnvrtc.so.*"))
    if bundled:
        args.append(f"-DCUDA_nvrtc_LIBRARY={bundled[0]}")
    return args


def macro_flags(defines: list[str]) -> list[str]:
    """The variant's macros for the C++ and the CUDA compiler, as CMake's initial flags."""
    if not defines:
        return []
    flags = " ".join(f"-D{d}" for d in defines)
    return [f"-DCMAKE_CXX_FLAGS={flags}", f"-DCMAKE_CUDA_FLAGS={flags}"]


def build(out: Path, variants: list[tuple[str, Path, list[str]]]) -> None:
    # Triton variants need neither CMake nor a CUDA toolkit here.
    cuda = any(not is_triton(header) for _, header, _ in variants)
    cmake, extra = (find_cmake(), cuda_args()) if cuda else (None, None)
    manifest = {}
    for name, header, defines in variants:
        namespace = f"segment_ops_ab_{name}"
        if is_triton(header):
            try:  # a typo shows here, not after the copy reached the GPU machine
                compile(header.read_text(), str(header), "exec")
            except SyntaxError as err:
                raise UsageError(f"variant {name}: {header}:{err.lineno}: {err.msg}") from None
            module = out / name / "_triton.py"
            module.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(header, module)
            manifest[name] = {
                "namespace": namespace,
                "triton": str(module.relative_to(out)),
                "from": str(header),
            }
            print(f"copied {name}: {module}", flush=True)
            continue
        src = out / name / "src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(SOURCE_DIR / "csrc", src / "csrc")
        shutil.copy2(SOURCE_DIR / "CMakeLists.txt", src)
        shutil.copy2(header, src / HEADER)
        log = out / name / "build.log"
        lib = out / name / "libsegment_ops.so"
        # The build tree (objects of every kernel, several times the library)
        # goes once the library and the CMake cache (how it was configured:
        # compilers, flags, architectures) are out: DIR then holds what `run`
        # loads and the record of how it was built, small enough to copy to
        # the GPU machine whole.
        with tempfile.TemporaryDirectory(prefix="build-", dir=out / name) as work:
            steps = [
                [
                    cmake,
                    "-S",
                    str(src),
                    "-B",
                    work,
                    "-DCMAKE_BUILD_TYPE=Release",
                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                    f"-DSEGMENT_OPS_NAMESPACE={namespace}",
                    # Every variant defines the same kernels: kept private, each
                    # library launches its own.
                    "-DCMAKE_CXX_VISIBILITY_PRESET=hidden",
                    "-DCMAKE_CUDA_VISIBILITY_PRESET=hidden",
                    *extra,
                    *macro_flags(defines),
                ],
                [cmake, "--build", work, "-j", os.environ.get("MAX_JOBS", "2")],
            ]
            with open(log, "w") as f:
                for step in steps:
                    if subprocess.run(step, stdout=f, stderr=subprocess.STDOUT).returncode:
                        raise UsageError(f"variant {name}: build failed, see {log}")
            shutil.copy2(Path(work, "libsegment_ops.so"), lib)
            shutil.copy2(Path(work, "CMakeCache.txt"), out / name / "CMakeCache.txt")
        manifest[name] = {
            "namespace": namespace,
            "header": str(header),
            "defines": defines,
            "lib": str(lib.relative_to(out)),
        }
        print(f"built {name}: {lib}", flush=True)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def read_manifest(directory: Path) -> dict[str, dict]:
    """The variants `build --out directory` wrote, by name."""
    path = directory / MANIFEST
    if not path.is_file():
        raise UsageError(f"{path}: not found; run `ab.py build --out {directory}` first")
    return json.loads(path.read_text())


def load(directory: Path) -> dict[str, object]:
    ops = {}
    for name, entry in read_manifest(directory).items():
        if "triton" in entry:
            ops[name] = load_triton(directory / entry["triton"], entry["namespace"])
            continue
        try:
            torch.ops.load_library(str(directory / entry["lib"]))
        except OSError as err:  # built against another torch, or moved
            raise UsageError(f"variant {name}: cannot load {entry['lib']}: {err}") from None
        ops[name] = getattr(torch.ops, entry["namespace"])
    return ops


def load_triton(path: Path, namespace: str) -> SimpleNamespace:
    """A Triton module variant, imported as a module of the installed
    segment_ops (whose helpers it uses) with its op registered under
    `namespace`, not segment_ops' own: its forward beside the installed one."""
    import importlib.util

    try:
        import segment_ops.ops
    except ImportError as err:
        raise UsageError(f"Triton variants need segment_ops installed: {err}") from None

    spec = importlib.util.spec_from_file_location(f"segment_ops.{namespace}", path)
    module = importlib.util.module_from_spec(spec)
    installed = segment_ops.ops.NAMESPACE
    segment_ops.ops.NAMESPACE = namespace  # read by the module's `from .ops import NAMESPACE`
    try:
        spec.loader.exec_module(module)
        segment_sum = module.segment_sum_triton
    except Exception as err:  # a variant that does not import: say which, in one line
        raise UsageError(f"Triton variant {path}: {type(err).__name__}: {err}") from None
    finally:
        segment_ops.ops.NAMESPACE = installed
    # Without forget_tuning (an older module) a variant keeps its first case's shapes.
    forget = getattr(module, "forget_tuning", lambda: None)
    return SimpleNamespace(
        segment_sum=segment_sum, triton=True, forget_tuning=forget, module=module
    )


def check_variants(ops: dict, kinds: tuple[str, ...], device: torch.device) -> None:
    """One-line refusals of what Triton variants cannot do: run off the GPU,
    or time a gather."""
    tritons = [name for name, op in ops.items() if getattr(op, "triton", False)]
    if tritons and device.type != "cuda":
        raise UsageError(f"--device {device}: Triton variants ({', '.join(tritons)}) need CUDA")
    for kind in kinds:
        if not any(hasattr(op, OP_OF_KIND[kind]) for op in ops.values()):
            raise UsageError(f"--ops {kind}: no variant has it (a Triton variant times fwd alone)")


def find_cuobjdump() -> str:
    """cuobjdump: $CUOBJDUMP, the CUDA toolkit's, PATH's, or the one triton ships."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    try:
        import triton

        shipped = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    except ImportError:
        shipped = None
    found = first_file(
        os.environ.get("CUOBJDUMP"),
        home and Path(home, "bin", "cuobjdump"),
        shutil.which("cuobjdump"),
        shipped,
    )
    if found is None:
        raise UsageError("cuobjdump not found: set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump")
    return found


RESOURCE = re.compile(r"\b(REG|SHARED|LOCAL|STACK):(\d+)")


def kernel_resources(report: str) -> dict[tuple[str, str], dict[str, int]]:
    """`cuobjdump -res-usage` output -> {(arch, kernel): {"REG": n, "SHARED": bytes,
    "LOCAL": bytes, "STACK": bytes}}."""
    found, arch, kernel = {}, "?", None
    for line in report.splitlines():
        line = line.strip()
        if line.startswith("arch = "):
            arch = line.removeprefix("arch = ")
        elif line.startswith("Function "):
            kernel = line.removeprefix("Function ").rstrip(":")
        elif kernel is not None and line.startswith("REG:"):
            found[(arch, kernel)] = {k: int(v) for k, v in RESOURCE.findall(line)}
            kernel = None
    return found


def short_names(kernels: list[str]) -> dict[str, str]:
    """Mangled kernel names -> their template names, as c++filt reads them
    (without the namespace and parameters); mangled where c++filt is missing."""
    filt = shutil.which("c++filt")
    if not filt or not kernels:
        return {k: k for k in kernels}
    lines = subprocess.run([filt], input="\n".join(kernels), capture_output=True, text=True)
    names = {}
    for kernel, line in zip(kernels, lines.stdout.splitlines(), strict=False):
        line = line.removeprefix("void ").replace("segment_ops::cuda::detail::", "")
        depth, end = 0, len(line)
        for i, ch in enumerate(line):  # the parameter list: the first '(' outside <>
            depth += (ch == "<") - (ch == ">")
            if ch == "(" and depth == 0:
                end = i
                break
        names[kernel] = line[:end]
    return names


def resources(
    directory: Path, arch: str | None, changed: bool, cases: list[tuple[str, str, int]]
) -> None:
    """Prints each CUDA variant's kernels side by side: registers, shared and
    local bytes; `*` where the variants differ. Then the same for the Triton
    variants' launches on `cases`, compiled here for `arch` (sm_90 unless
    named)."""
    manifest = read_manifest(directory)
    libs = {n: e["lib"] for n, e in manifest.items() if "lib" in e}
    tritons = {n: e for n, e in manifest.items() if "triton" in e}
    if libs:
        cuda_resources(directory, libs, arch, changed)
    if tritons:
        tables = {
            name: triton_resources(
                directory / e["triton"], e["namespace"], cases, parse_capability(arch)
            )
            for name, e in tritons.items()
        }
        print_side_by_side(tables, changed, "case")


def cell(res) -> str:
    if res is None:
        return "-"
    return f"{res['REG']}r {res['SHARED']}s {res['LOCAL']}l {res.get('STACK', 0)}k"


def print_side_by_side(tables: dict[str, dict], changed: bool, first: str) -> None:
    """One row per key (first field, name), one column per variant; `*` where
    the variants differ."""
    keys = sorted({k for table in tables.values() for k in table})
    print(
        f"{first:24}" + "  ".join(f"{n:>22}" for n in tables) + "  (r: registers, s: shared "
        "bytes, l: local bytes, k: stack bytes a thread)"
    )
    for key in keys:
        cells = [cell(tables[n].get(key)) for n in tables]
        differs = len(set(cells)) > 1
        if differs or not changed:
            row = "  ".join(f"{c:>22}" for c in cells)
            print(f"{key[0]:24}{row}  {key[1]}{'  *' if differs else ''}")


def cuda_resources(directory: Path, libs: dict[str, str], arch: str | None, changed: bool):
    tool = find_cuobjdump()
    tables = {}
    for name, lib in libs.items():
        dump = subprocess.run(
            [tool, "-res-usage", str(directory / lib)], capture_output=True, text=True
        )
        if dump.returncode:
            raise UsageError(f"variant {name}: cuobjdump failed: {dump.stderr.strip()[:200]}")
        tables[name] = kernel_resources(dump.stdout)
    keys = {k for table in tables.values() for k in table if arch in (None, k[0])}
    if not keys:
        raise UsageError(f"--arch {arch}: no kernel for it in {', '.join(libs)}")
    names = short_names(sorted({kernel for _, kernel in keys}))
    print_side_by_side(
        {
            n: {(a, names[k]): res for (a, k), res in table.items() if (a, k) in keys}
            for n, table in tables.items()
        },
        changed,
        "arch",
    )


# Mean segment length of each law, for the shape class a Triton variant's
# launch sees in `resources` (bench.py's means; `giant` is one segment).
LAW_MEAN_ROWS = {"short": 8, "long": 1024, "power": 11}
TRITON_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.int32: "i32",
    torch.int64: "i64",
}


def triton_launches(module, dtype_name: str, law: str, inner: int, rows: int) -> list:
    """What the module's `_launch` would compile for one case: (kernel,
    arguments, keyword arguments, label) per config its autotuners keep
    after pruning, and per direct launch; the label names the kernel and the
    config's own values. Nothing runs: the tensors are on the meta device and
    the launches are recorded instead."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    launches = []

    def tuned(self, *args, grid=None, warmup=False, **kwargs):
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        # as Autotuner.run: a single config is never pruned
        configs = self.prune_configs(kwargs) if len(self.configs) > 1 else self.configs
        varied = [
            option
            for option in ("num_stages", "num_ctas")
            if len({getattr(c, option) for c in self.configs}) > 1
        ]
        for config in configs:
            own = {**config.kwargs, "num_warps": config.num_warps, "maxnreg": config.maxnreg}
            own |= {option: getattr(config, option) for option in varied}
            launches.append((self.fn, args, {**kwargs, **config.all_kwargs()}, label(self, own)))

    def direct(self, *args, grid=None, warmup=False, **kwargs):
        launches.append((self, args, kwargs, label(self, kwargs)))

    def label(kernel, values: dict) -> str:
        name = getattr(kernel, "fn", kernel).__name__
        return " ".join([name] + [f"{k}={v}" for k, v in values.items() if v is not None])

    segments = 1 if law == "giant" else max(rows // LAW_MEAN_ROWS[law], 1)
    dtype = getattr(torch, dtype_name)
    x = torch.empty((rows, inner), dtype=dtype, device="meta")
    indptr = torch.empty(segments + 1, dtype=torch.int64, device="meta")
    out = torch.empty((segments, inner), dtype=dtype, device="meta")
    saved = Autotuner.run, JITFunction.run
    Autotuner.run, JITFunction.run = tuned, direct
    try:
        module._launch(x, indptr, out)
    finally:
        Autotuner.run, JITFunction.run = saved
    return launches


def compile_offline(kernel, args: tuple, kwargs: dict, capability: int) -> bytes:
    """The cubin of one launch for a compute capability (90: sm_90), as
    triton's ahead-of-time compiler builds it, specialized as a launch on
    real tensors would be: pointers 16-byte aligned, an integer of 1 a
    constant and one that is a multiple of 16 marked so, unless the kernel
    says not to specialize it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    while not isinstance(kernel, JITFunction):  # heuristics and other wrappers
        kernel = kernel.fn
    option_names = ("num_warps", "num_stages", "num_ctas", "maxnreg")
    options = {k: kwargs[k] for k in option_names if kwargs.get(k) is not None}
    values = dict(zip(kernel.arg_names, args, strict=False)) | {
        k: v for k, v in kwargs.items() if k not in option_names
    }
    signature, constexprs, aligned = {}, {}, {}
    unspecialized = set(getattr(kernel, "do_not_specialize", ()))
    for i, param in enumerate(kernel.params):
        if param.name in values:
            value = values[param.name]
        elif param.default is not inspect.Parameter.empty:
            value = param.default
        else:
            raise UsageError(f"{kernel.__name__}: no value for {param.name}")
        specialize = i not in unspecialized and param.name not in unspecialized
        if param.is_constexpr or value is None:
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TRITON_TYPES[value.dtype]
            aligned[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        elif value == 1 and specialize:
            signature[param.name], constexprs[param.name] = "constexpr", 1
        else:
            signature[param.name] = "i64" if not -(2**31) <= value < 2**31 else "i32"
            if value % 16 == 0 and specialize:
                aligned[(i,)] = [["tt.divisibility", 16]]
    target = GPUTarget("cuda", capability, 32)
    backend = triton.compiler.make_backend(target)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
    compiled = triton.compile(
        source, target=target, options=backend.parse_options(options).__dict__
    )
    return compiled.asm["cubin"]


def one_line(err: Exception) -> str:
    """An error in one line: triton's CompilationError by its reason (its
    message starts with the failing source), others by their first line."""
    if reason := getattr(err, "error_message", None):
        return f"{type(err).__name__}: {' '.join(str(reason).split())}"
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def triton_resources(
    path: Path, namespace: str, cases: list[tuple[str, str, int]], capability: int
) -> dict[tuple[str, str], dict[str, int]]:
    """{(case, launch label): cuobjdump's resources} for a Triton variant,
    each case at the benchmark's size (so its integer arguments specialize
    as the benchmark's do)."""
    module = load_triton(path, namespace).module
    tool = find_cuobjdump()
    table = {}
    with tempfile.TemporaryDirectory() as scratch:
        cubin = Path(scratch, "kernel.cubin")
        for dtype_name, law, inner in cases:
            case = f"{dtype_name}:{law}:{inner}"
            rows = case_rows(dtype_name, inner, 512, None)
            try:
                launches = triton_launches(module, dtype_name, law, inner, rows)
            except Exception as err:  # its _launch fails before any kernel: say so in one line
                raise UsageError(f"{path}: {case}: _launch: {one_line(err)}"[:400]) from None
            for kernel, args, kwargs, label in launches:
                try:
                    cubin.write_bytes(compile_offline(kernel, args, kwargs, capability))
                except Exception as err:  # a variant that does not compile: which, in one line
                    raise UsageError(f"{path}: {case}: {label}: {one_line(err)}"[:400]) from None
                dump = subprocess.run(
                    [tool, "-res-usage", str(cubin)], capture_output=True, text=True
                )
                if dump.returncode:
                    raise UsageError(f"cuobjdump failed on {label}: {dump.stderr.strip()[:200]}")
                found = kernel_resources(dump.stdout)
                table[(case, label)] = next(iter(found.values()), None)
    return table


def parse_capability(arch: str | None) -> int:
    """--arch for Triton variants: sm_90, sm_90a or 90 -> 90 (sm_90 if none)."""
    match = re.fullmatch(r"(?:sm_)?(\d+)a?", arch or "sm_90")
    if not match:
        raise UsageError(f"--arch {arch}: expected sm_XY, e.g. sm_90")
    return int(match.group(1))


# What `resources` compiles for: it needs neither the benchmark nor numpy.
RESOURCE_DTYPES = ("float16", "bfloat16", "float32", "float64")
RESOURCE_LAWS = (*LAW_MEAN_ROWS, "giant")


def parse_case(text: str, dtypes=None, laws=None) -> tuple[str, str, int]:
    """DTYPE:LAW:INNER, DTYPE of `dtypes` and LAW of `laws` (the benchmark's
    unless given)."""
    dtypes = dtypes or bench.DTYPES
    laws = laws or bench.LAWS
    parts = text.split(":")
    if (
        len(parts) != 3
        or parts[0] not in dtypes
        or parts[1] not in laws
        or not parts[2].isdigit()
        or int(parts[2]) < 1
    ):
        raise UsageError(
            f"case {text!r}: expected DTYPE:LAW:INNER, DTYPE of {dtypes}, "
            f"LAW of {laws}, INNER a positive integer"
        )
    return parts[0], parts[1], int(parts[2])


def parse_ops(text: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(k for k in text.split(",") if k))
    if not kinds or any(k not in KINDS for k in kinds):
        raise UsageError(f"--ops {text!r}: expected a comma-separated list of {', '.join(KINDS)}")
    return kinds


def case_rows(dtype_name: str, inner: int, src_mib: int, rows: int | None) -> int:
    elem = torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
    return rows or max(1024, (src_mib << 20) // (inner * elem))


def cut_lengths(lengths, longest: int):
    """Segment lengths with each one over `longest` rows cut into pieces of
    `longest` and one of the rest, in order: the same rows, and no segment
    longer than `longest` (empty ones stay)."""
    import numpy as np  # as bench does: `build` runs without it

    pieces = np.maximum(-(-lengths // longest), 1)
    cut = np.full(int(pieces.sum()), longest, dtype=lengths.dtype)
    cut[np.cumsum(pieces) - 1] = lengths - (pieces - 1) * longest
    return cut


def law_label(law: str, cut: int | None) -> str:
    """How output lines name a case's law: with its cut, if any."""
    return law if cut is None else f"{law}<={cut}"


def case_inputs(
    dtype_name: str, law: str, inner: int, device: torch.device, rows: int, cut: int | None = None
):
    """indptr, the sum's src and the gather's grad for one case (seeded lengths,
    cut to at most `cut` rows)."""
    dtype = getattr(torch, dtype_name)
    lengths = bench.segment_lengths(law, rows, 0)
    if cut is not None:
        lengths = cut_lengths(lengths, cut)
    indptr = bench.make_indptr(lengths, device)
    src = torch.randn(rows, inner, device=device, dtype=dtype)
    grad = torch.randn(indptr.numel() - 1, inner, device=device, dtype=dtype)
    return indptr, src, grad


def op_args(kind: str, src, grad, indptr) -> tuple:
    """The arguments of a kind's op: the sum of src, the gather of grad."""
    return (src, indptr) if kind == "fwd" else (grad, indptr, src.shape[0])


def kernel_name(name: str) -> str:
    """A kernel's name without its namespaces, template arguments and
    parameters: `void a::b::tile_sum_kernel<float, 1, true>(...)` is
    `tile_sum_kernel`."""
    name = name.split("(")[0].split("<")[0].strip()
    return name.removeprefix("void ").rsplit("::", 1)[-1]


def kernel_summary(
    calls: list[list[tuple[str, float, float]]], calls_per_recording: int = 1
) -> dict:
    """The device activity of an op's calls, each recording a list of (kernel
    name, start, end) in microseconds of `calls_per_recording` calls queued
    back to back: per kernel name its mean time a call, and a call's mean span
    (first start to last end) and idle time in it (the span less the union of
    the intervals: kernels that overlap, as those launched early do, count
    once)."""
    totals: dict[str, float] = {}
    spans, idles = [], []
    for call in calls:
        if not call:
            continue
        for name, start, end in call:
            short = kernel_name(name)
            totals[short] = totals.get(short, 0.0) + end - start
        intervals = sorted((start, end) for _, start, end in call)
        busy, (open_start, open_end) = 0.0, intervals[0]
        for start, end in intervals[1:]:
            if start > open_end:
                busy += open_end - open_start
                open_start, open_end = start, end
            else:
                open_end = max(open_end, end)
        busy += open_end - open_start
        span = max(end for _, end in intervals) - intervals[0][0]
        spans.append(span)
        idles.append(span - busy)
    n = max(len(spans), 1) * calls_per_recording
    longest_first = sorted(totals.items(), key=lambda kv: -kv[1])
    return {
        "kernels_us": {k: round(v / n, 1) for k, v in longest_first},
        "span_us": round(sum(spans) / n, 1),
        "idle_us": round(sum(idles) / n, 1),
    }


def recorded_kernels(fn, calls: int) -> list[tuple[str, float, float]]:
    """(kernel name, start, end) of each kernel of `calls` calls of fn queued
    back to back, recorded by torch.profiler (CUDA activity only)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as record

    with record(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [
        (ev.name, ev.time_range.start, ev.time_range.end)
        for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA
    ]


def kernel_times(fn, calls: int = 5, queued: int = 20) -> dict:
    """kernel_summary of `calls` calls of fn, each recorded alone (it starts
    on an idle device, so a gap between its kernels may be the host still
    launching the next), with the span and idle time a call of `queued` calls
    recorded back to back, as the timed loop runs them (`queued_span_us`,
    `queued_idle_us`; the first call's start still finds the device idle)."""
    fn()
    torch.cuda.synchronize()
    alone = kernel_summary([recorded_kernels(fn, 1) for _ in range(calls)])
    back_to_back = kernel_summary([recorded_kernels(fn, queued)], calls_per_recording=queued)
    return {
        **alone,
        "queued_span_us": back_to_back["span_us"],
        "queued_idle_us": back_to_back["idle_us"],
    }


def run_case(
    ops: dict,
    timer: bench.Timer,
    dtype_name: str,
    law: str,
    inner: int,
    device: torch.device,
    rows: int,
    rounds: int,
    kinds: tuple[str, ...] = KINDS,
    cut: int | None = None,
    kernels: bool = False,
) -> dict:
    names = list(ops)
    elem = torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
    indptr, src, grad = case_inputs(dtype_name, law, inner, device, rows, cut)
    segments = indptr.numel() - 1
    dst = torch.empty_like(src)
    moved = (rows + segments) * inner * elem + indptr.numel() * indptr.element_size()
    fns = {("copy", "-"): lambda: dst.copy_(src)}
    timed = {kind: [n for n in names if hasattr(ops[n], OP_OF_KIND[kind])] for kind in kinds}
    for kind, having in timed.items():  # a Triton variant has no gather: timed on fwd alone
        args = op_args(kind, src, grad, indptr)
        for name in having:
            op = getattr(ops[name], OP_OF_KIND[kind])
            fns[(kind, name)] = lambda op=op, a=args: op(*a)
    # Triton tunes once per shape class, which short and power-law segments of
    # one mean share: each case tunes on its own segments, as bench.py's do,
    # here before the rounds, so that a variant the compiler rejects on the GPU
    # is named in one line.
    for name in names:
        if forget := getattr(ops[name], "forget_tuning", None):
            forget()
            try:
                ops[name].segment_sum(src, indptr)
            except Exception as err:
                raise UsageError(f"variant {name}: {one_line(err)}"[:400]) from None
    times = {key: [] for key in fns}
    for _ in range(rounds):  # interleaved, so drift hits every variant alike
        for key, fn in fns.items():
            times[key].append(timer.median(fn))
    median = {key: statistics.median(t) for key, t in times.items()}
    copy_rate = 2 * rows * inner * elem / median[("copy", "-")]
    # Each kind against the first variant that has it.
    first = {kind: fns[(kind, having[0])]().double() for kind, having in timed.items() if having}
    case = {
        "dtype": dtype_name,
        "law": law,
        "inner": inner,
        "cut": cut,
        "rows": rows,
        "segments": segments,
        "copy_gbps": round(copy_rate / 1e9, 1),
        "variants": {},
    }
    label = law_label(law, cut)
    for name in names:
        results = {}
        for kind in kinds:
            if name not in timed[kind]:
                continue
            seconds = median[(kind, name)]
            diff = fns[(kind, name)]().double() - first[kind]
            results[kind] = {
                "ms": round(seconds * 1e3, 4),
                "copy_fraction": round(moved / seconds / copy_rate, 4),
                "speedup": round(median[(kind, timed[kind][0])] / seconds, 4),
                "max_abs_diff": float(diff.abs().max().item()) if diff.numel() else 0.0,
            }
            print(
                f"{dtype_name:8} {label:5} x{inner:<4} {kind} {name:>12}: "
                f"{results[kind]['copy_fraction']:6.1%} of copy  "
                f"{results[kind]['speedup']:.3f}x  diff {results[kind]['max_abs_diff']:.3g}",
                flush=True,
            )
            if kernels:
                activity = kernel_times(fns[(kind, name)])
                results[kind].update(activity)
                listed = ", ".join(f"{us} {k}" for k, us in activity["kernels_us"].items())
                print(
                    f"{'':27}kernels (us a call): {listed}; "
                    f"idle {activity['idle_us']} of {activity['span_us']} alone, "
                    f"{activity['queued_idle_us']} of {activity['queued_span_us']} queued",
                    flush=True,
                )
        case["variants"][name] = results
    return case


def run(
    directory: Path,
    cases: list[tuple[str, str, int]],
    device: torch.device,
    src_mib: int,
    rows: int | None,
    rounds: int,
    budget: float,
    kinds: tuple[str, ...] = KINDS,
    cut: int | None = None,
    kernels: bool = False,
) -> list[dict]:
    ops = load(directory)
    check_variants(ops, kinds, device)
    timer = bench.Timer(device, 2, 10, budget)
    results = []
    for dtype_name, law, inner in cases:
        n = case_rows(dtype_name, inner, src_mib, rows)
        results.append(
            run_case(ops, timer, dtype_name, law, inner, device, n, rounds, kinds, cut, kernels)
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def profile(
    ops: dict,
    variant: str | None,
    case: tuple[str, str, int],
    kind: str,
    device: torch.device,
    rows: int,
    calls: int,
    cut: int | None = None,
    warmup: int = 2,
) -> None:
    """Calls one variant's op `warmup` times, then `calls` times inside the
    profiler's range (cudaProfilerStart and Stop), on one case, untimed."""
    name = variant if variant is not None else next(iter(ops))
    if name not in ops:
        raise UsageError(f"--variant {name!r}: not built here; the variants are {', '.join(ops)}")
    call = getattr(ops[name], OP_OF_KIND[kind], None)
    if call is None:
        raise UsageError(f"--op {kind}: variant {name} is a Triton forward, it has no {kind}")
    check_variants({name: ops[name]}, (), device)
    dtype_name, law, inner = case
    indptr, src, grad = case_inputs(dtype_name, law, inner, device, rows, cut)
    args = op_args(kind, src, grad, indptr)
    for _ in range(warmup):
        call(*args)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    for _ in range(calls):
        call(*args)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    label = law_label(law, cut)
    print(f"{dtype_name} {label} x{inner} {kind} {name}: {calls} calls, {rows} rows", flush=True)


STALL_SAMPLES = "Warp Stall Sampling (All Samples)"


def stall_sections(path: Path) -> list[tuple[str, list[str], list[list[str]]]]:
    """(kernel, header, rows) per kernel of Nsight Compute's source page as CSV:
    each section is its header row (the one naming STALL_SAMPLES), the
    "Kernel Name" row before it where there is one, and its rows up to the
    next section."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", newline="") as f:
            lines = list(csv.reader(f))
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error) as err:
        raise UsageError(f"{path}: cannot read it as CSV ({err})") from None
    starts = [i for i, line in enumerate(lines) if STALL_SAMPLES in line]
    if not starts:
        raise UsageError(
            f"{path}: no {STALL_SAMPLES!r} column; expected the source page of a report "
            "collected with --section SourceCounters, as "
            "`ncu --import REPORT.ncu-rep --page source --csv --print-source sass`"
        )
    sections = []
    for n, i in enumerate(starts):
        header = lines[i][:-1] if lines[i][-1:] == [""] else lines[i]
        named = i > 0 and lines[i - 1][:1] == ["Kernel Name"] and len(lines[i - 1]) > 1
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        rows = []
        for j in range(i + 1, end):
            row = lines[j]
            if row[:1] == ["Kernel Name"] or not any(cell.strip() for cell in row):
                continue
            if len(row) == len(header) + 1 and row[-1] == "":  # a trailing comma
                row = row[:-1]
            if len(row) != len(header):
                raise UsageError(
                    f"{path}: row {j + 1} has {len(row)} cells where its header has "
                    f"{len(header)}"
                )
            rows.append(row)
        sections.append((lines[i - 1][1] if named else "?", header, rows))
    return sections


def stalls(path: Path, top: int) -> None:
    """Where each kernel of an Nsight Compute report waited: its stall reasons
    over the kernel, then the `top` instructions holding the most samples,
    each with its largest reasons. One instruction holding most of a kernel's
    samples (the first use of a batch of loads, say) is what to work on."""
    for kernel, header, rows in stall_sections(path):
        col = {name: k for k, name in enumerate(header)}
        reasons = [
            name for name in header if name.startswith("stall_") and "(Not Issued)" not in name
        ]

        def count(row, name, col=col):
            text = row[col[name]].replace(",", "").strip()
            if text in ("", "-"):
                return 0
            try:
                return int(float(text))
            except ValueError:
                where = row[col["Source"]].strip() if "Source" in col else row[0]
                raise UsageError(
                    f"{path}: {name} is {text!r} at {where!r}; expected a count"
                ) from None

        # Each row's counts, read once: its samples, then one per reason.
        table = [[count(row, name) for name in (STALL_SAMPLES, *reasons)] for row in rows]
        samples = [counts[0] for counts in table]
        total = sum(samples)
        print(f"{kernel_name(kernel)}: {total} stall samples over {len(rows)} instructions")
        if total == 0:
            continue
        by_reason = sorted(
            ((sum(counts[1 + r] for counts in table), name) for r, name in enumerate(reasons)),
            reverse=True,
        )
        print(
            "  reasons: "
            + ", ".join(
                f"{name.removeprefix('stall_')} {100 * n / total:.1f}%"
                for n, name in by_reason[:6]
                if n
            )
        )
        source = col.get("Source")
        for k in sorted(range(len(rows)), key=lambda k: -samples[k])[:top]:
            if samples[k] == 0:
                break
            row = rows[k]
            largest = sorted(zip(table[k][1:], reasons, strict=True), reverse=True)[:3]
            text = " ".join(row[source].split()) if source is not None else "?"
            print(
                f"  {100 * samples[k] / total:5.1f}% {samples[k]:7d}  #{k:<5d} {text[:56]:56s} "
                + " ".join(f"{name.removeprefix('stall_')} {n}" for n, name in largest if n)
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="build one library per variant")
    b.add_argument("--out", required=True, type=Path, help="folder for the libraries")
    b.add_argument("variants", nargs="+", metavar="NAME=HEADER[:MACRO[=VALUE]...]")
    r = commands.add_parser("run", help="time the built variants side by side")
    r.add_argument("dir", type=Path, help="the folder `build --out` wrote")
    r.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated DTYPE:LAW:INNER")
    r.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    r.add_argument("--src-mib", type=int, default=512, help="src size per case")
    r.add_argument("--rows", type=int, help="rows per case instead of --src-mib")
    r.add_argument("--rounds", type=int, default=3, help="interleaved rounds, median")
    r.add_argument("--budget", type=float, default=0.3, help="seconds per op and round")
    r.add_argument(
        "--ops", default=",".join(KINDS), help="comma-separated: fwd (the sum), bwd (the gather)"
    )
    r.add_argument("--out", type=Path, help="write the results here as JSON")
    r.add_argument(
        "--cut", type=int, metavar="N", help="cut segments longer than N rows into pieces of N"
    )
    r.add_argument(
        "--kernels",
        action="store_true",
        help="also each op's kernels: GPU time a call of each, and the time between them",
    )
    p = commands.add_parser("profile", help="call one variant's op on one case, for a profiler")
    p.add_argument("dir", type=Path, help="the folder `build --out` wrote")
    p.add_argument("--case", required=True, help="DTYPE:LAW:INNER")
    p.add_argument("--op", default="fwd", help="fwd (the sum) or bwd (the gather)")
    p.add_argument("--variant", help="which variant (the first built by default)")
    p.add_argument("--calls", type=int, default=5, help="calls of the op the profiler records")
    p.add_argument(
        "--warmup", type=int, default=2, help="calls before them, outside the profiler's range"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--src-mib", type=int, default=512, help="src size")
    p.add_argument("--rows", type=int, help="rows instead of --src-mib")
    p.add_argument(
        "--cut", type=int, metavar="N", help="cut segments longer than N rows into pieces of N"
    )
    st = commands.add_parser(
        "stalls", help="where a kernel's warps waited, per instruction (Nsight Compute CSV)"
    )
    st.add_argument(
        "report",
        type=Path,
        help="`ncu --import REPORT.ncu-rep --page source --csv --print-source sass` output "
        "(.csv, .csv.gz)",
    )
    st.add_argument("--top", type=int, default=12, help="instructions to list per kernel")
    res = commands.add_parser(
        "resources", help="registers, shared, local and stack bytes per kernel"
    )
    res.add_argument("dir", type=Path, help="the folder `build --out` wrote")
    res.add_argument(
        "--arch",
        help="one architecture, e.g. sm_90 (default: all built for CUDA variants, "
        "sm_90 for Triton ones)",
    )
    res.add_argument("--changed", action="store_true", help="only kernels where variants differ")
    res.add_argument(
        "--cases",
        default="bfloat16:power:1,float32:power:1",
        help="Triton variants: comma-separated DTYPE:LAW:INNER whose launches to compile",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "stalls":
            if args.top < 1:
                raise UsageError(f"--top {args.top}: expected at least 1")
            stalls(args.report, args.top)
        elif args.command == "resources":
            cases = [
                parse_case(c, RESOURCE_DTYPES, RESOURCE_LAWS) for c in args.cases.split(",") if c
            ]
            resources(args.dir, args.arch, args.changed, cases)
        elif args.command == "build":
            variants = [parse_variant(v) for v in args.variants]
            if len({name for name, _, _ in variants}) != len(variants):
                raise UsageError("variant names must differ")
            args.out.mkdir(parents=True, exist_ok=True)
            build(args.out, variants)
        elif bench is None:
            raise UsageError(
                f"{args.command} needs what benchmarks/bench.py imports: {BENCH_MISSING} "
                "(install numpy and this extension)"
            )
        elif args.cut is not None and args.cut < 1:
            raise UsageError(f"--cut {args.cut}: expected at least 1 (rows)")
        elif args.command == "profile":
            case = parse_case(args.case)
            kind = args.op
            if kind not in KINDS:
                raise UsageError(f"--op {kind!r}: expected fwd (the sum) or bwd (the gather)")
            if args.calls < 1:
                raise UsageError(f"--calls {args.calls}: expected at least 1")
            if args.warmup < 0:
                raise UsageError(f"--warmup {args.warmup}: expected 0 or more")
            rows = case_rows(case[0], case[2], args.src_mib, args.rows)
            ops = load(args.dir)
            profile(
                ops,
                args.variant,
                case,
                kind,
                torch.device(args.device),
                rows,
                args.calls,
                args.cut,
                args.warmup,
            )
        else:
            cases = [parse_case(c) for c in args.cases.split(",") if c]
            kinds = parse_ops(args.ops)
            if args.kernels and torch.device(args.device).type != "cuda":
                raise UsageError(f"--kernels needs a CUDA device, not {args.device!r}")
            results = run(
                args.dir,
                cases,
                torch.device(args.device),
                args.src_mib,
                args.rows,
                args.rounds,
                args.budget,
                kinds,
                args.cut,
                args.kernels,
            )
            if args.out:
                args.out.write_text(json.dumps({"cases": results}, indent=1) + "\n")
    except UsageError as err:
        print(f"ab.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
