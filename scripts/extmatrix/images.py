"""The build images the cells need: a `docker buildx bake` file, and building it.

One image per flavor family, toolkit, base image and platform; the cells that
share it share its tag (cell.image). docker builds the bake file as it is; podman
gets one `podman build` per bake target, so both build the same targets with the
same arguments. Without a registry, `--base local` first makes a manylinux-like
base from Debian packages (docker/local-base/) and builds the same targets on it.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from . import engines, envs
from .backends import Context
from .cells import Cell
from .engines import Engine
from .errors import NotBuildable, StepFailed, UserError
from .steps import Steps
from .toolchain import host_platform

BASES = ("upstream", "local")
LOCAL_SUITE = "bookworm"
DOCKER_DIR = "docker"  # the bake context, relative to the project root
OCI_PLATFORMS = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
LABEL = "io.extmatrix"
# Where podman builds see the host CA bundle: a path no package owns, because
# ca-certificates' postinst cannot replace a file mounted over its own.
CA_SECRET = "ca_bundle"  # RUN --mount=type=secret,id=ca_bundle in docker/
FIRST_PYPI_CUDA = 13  # PyPI's CUDA 12 wheels have no nvcc


@dataclass(frozen=True)
class Image:
    tag: str
    platform: str
    family: str
    toolkit: str | None
    base: str
    cells: tuple[str, ...]

    @property
    def target(self) -> str:
        """Bake target names allow only letters, digits, '-' and '_'; tags are unique per
        platform already (cells.py suffixes non-x86_64 ones)."""
        return re.sub(r"[^A-Za-z0-9_-]", "-", self.tag)

    def args(self) -> dict[str, str]:
        args = {"BASE_IMAGE": self.base}
        if self.family == "cuda":
            # CUDA installs as /usr/local/cuda-X.Y and its PyPI packages go by X.Y.*: a patch
            # release named in the matrix (13.0.2) would find neither.
            args["CUDA_VERSION"] = ".".join((self.toolkit or "").split(".")[:2])
        if self.family == "rocm":  # one base for the tools stage and ROCm itself
            args.update(ROCM_BASE_IMAGE=self.base, ROCM_VERSION=self.toolkit or "")
        return args

    def labels(self) -> dict[str, str]:
        return {f"{LABEL}.family": self.family, f"{LABEL}.toolkit": self.toolkit or "none",
                f"{LABEL}.base-image": self.base}


def local_base(prefix: str) -> str:
    return f"localhost/{prefix}-base:{LOCAL_SUITE}"


def local_rootfs(prefix: str) -> str:
    return f"localhost/{prefix}-rootfs:{LOCAL_SUITE}"


def needed(cells: list[Cell], base: str, prefix: str) -> list[Image]:
    """The images of `cells`, in plan order; `base` is 'upstream' or 'local'."""
    found: dict[tuple[str, str], Image] = {}
    for cell in cells:
        if base == "local":
            start = local_base(prefix)
        elif cell.base_image:
            start = cell.base_image
        else:
            raise UserError(None, f"cell {cell.id} has no base image",
                            f"set defaults.{cell.family}.base_image in the matrix")
        image = Image(cell.image, cell.platform, cell.family, cell.toolkit, start, (cell.id,))
        key = (cell.image, cell.platform)
        old = found.get(key)
        if old is None:
            found[key] = image
        elif (old.family, old.toolkit, old.base) != (image.family, image.toolkit, image.base):
            raise UserError(None, f"cells {old.cells[0]} and {cell.id} need different images "
                            f"under one tag {cell.image} ({old.base} vs {image.base})",
                            "give their flavors the same base_image")
        else:
            found[key] = replace(old, cells=(*old.cells, cell.id))
    return list(found.values())


def context_of(project: Path) -> str:
    """The bake context: the project's docker/, relative to the project root where the
    bake runs, or the engine's own (engines.docker_folder)."""
    folder = engines.docker_folder(project)
    return DOCKER_DIR if folder == project / DOCKER_DIR else str(folder)


def bake(images: list[Image], context: str = DOCKER_DIR) -> dict:
    """The bake file: docker buildx bake -f FILE, run from the project root."""
    return {
        "group": {"default": {"targets": [i.target for i in images]}},
        "target": {
            i.target: {
                "context": context,
                "dockerfile": "Dockerfile",
                "target": i.family,
                "platforms": [OCI_PLATFORMS[i.platform]],
                "args": i.args(),
                "labels": i.labels(),
                "tags": [i.tag],
            }
            for i in images
        },
    }


def bake_json(images: list[Image], context: str = DOCKER_DIR) -> str:
    return json.dumps(bake(images, context), indent=2) + "\n"


def unpinned(images: list[Image]) -> list[str]:
    """Upstream bases named by tag only: a rebuild may silently start from another image."""
    return [f"base image {i.base} is pinned by tag only; pin it by digest "
            "(NAME@sha256:…, e.g. from 'skopeo inspect') so every build starts from the same one"
            for i in images if "@sha256:" not in i.base and not i.base.startswith("localhost/")]


def skip_reason(image: Image, base: str, host: str) -> str | None:
    """Why this machine cannot build `image`, or None."""
    if image.platform != host:
        return (f"a {image.platform} image is built on a {image.platform} builder "
                f"(this machine is {host})")
    if base != "local":
        return None
    if image.family == "rocm":
        return ("a ROCm image starts from a base that ships ROCm (the matrix's base_image, "
                "from a registry); the local Debian base has none, and Debian's own hipcc "
                "(5.2) is far older than any ROCm torch supports")
    if image.family == "cuda" and int((image.toolkit or "0").split(".")[0]) < FIRST_PYPI_CUDA:
        return (f"CUDA {image.toolkit} has no nvcc on PyPI: its image needs a base that ships "
                "the toolkit, from a registry")
    return None


def choose_base(requested: str | None, cells: list[Cell]) -> tuple[str, str | None]:
    """'upstream' when every base image's registry answers, else 'local'; and why."""
    if requested in BASES:
        return requested, None
    registries = sorted({registry_of(c.base_image) for c in cells if c.base_image})
    down = [r for r in registries if not registry_reachable(r)]
    if down:
        return "local", (f"{', '.join(down)} not reachable: building on a local Debian base "
                         "(--base local)")
    return "upstream", None


def registry_of(image: str) -> str:
    """quay.io/pypa/x:tag -> quay.io; rocm/dev:tag and bare names -> docker.io."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def registry_reachable(registry: str) -> bool:
    if registry == "localhost":
        return True
    host = "registry-1.docker.io" if registry == "docker.io" else registry
    return envs.reachable(f"https://{host}/v2/")  # 401 without a token still means "up"


def podman_build(engine: Engine, target: dict, ca: Path | None) -> list[str]:
    """One bake target as a podman build command (run from the project root).

    Only images of this machine's platform are built, so `platforms` is left out.
    """
    context = target["context"]
    # podman's default OCI format drops SHELL, and the Dockerfile's RUNs need bash.
    cmd = engine.cmd("build", "--format", "docker", "-f", f"{context}/{target['dockerfile']}",
                     "--target", target["target"])
    for tag in target["tags"]:
        cmd += ["-t", tag]
    for key, value in target["args"].items():
        cmd += ["--build-arg", f"{key}={value}"]
    for key, value in target["labels"].items():
        cmd += ["--label", f"{key}={value}"]
    if ca is not None:
        cmd += ["--secret", ca_secret(ca)]
    return [*cmd, context]


def ca_secret(ca: Path) -> str:
    """The host CA bundle as the build secret the Dockerfiles' pip steps mount: it is
    there while they run and in no layer of the image."""
    return f"id={CA_SECRET},src={ca}"


def bootstrap(engine: Engine, ctx: Context, ca: Path | None) -> tuple[list[str], dict[str, str]]:
    """The local base: debootstrap + import (once), then its Containerfile (layer-cached)."""
    prefix = ctx.matrix.images.prefix
    env = {**engine.env, "ENGINE": engine.exe, "SUITE": LOCAL_SUITE,
           "WORKDIR": str(ctx.cache / "container" / "rootfs"),
           "ROOTFS_IMAGE": local_rootfs(prefix), "BASE_IMAGE": local_base(prefix),
           "CA_BUNDLE": str(ca) if ca else ""}
    return ["bash", str(engines.docker_folder(ctx.root) / "local-base" / "bootstrap.sh")], env


class ImageFailed(Exception):
    pass


def build(ctx: Context, cells: list[Cell], engine_choice: str | None, base_choice: str | None,
          out: TextIO | None = None) -> int:
    """Build the images of `cells`, printing every command; 0 when all that can be built were."""
    out = out or sys.stdout
    engine = engines.detect(engine_choice, ctx.root, ctx.cache)
    print(f"# engine: {engine.why}", file=out, flush=True)
    base, note = choose_base(base_choice, cells)
    images = needed(cells, base, ctx.matrix.images.prefix)
    if note:
        print(f"# {note}", file=out, flush=True)
    for warning in unpinned(images):
        print(f"# warning: {warning}", file=out, flush=True)
    todo = []
    for image in images:
        why = skip_reason(image, base, host_platform())
        if why:
            print(f"# skipping {image.tag} ({', '.join(image.cells)}): {why}", file=out)
        else:
            todo.append(image)
    if not todo:
        print("# no image to build here", file=out, flush=True)
        return 0
    ca = engines.ca_bundle()
    if ca is None and engine.name == "podman":
        # buildah refuses a secret mount whose secret was not given: give an empty one.
        ca = ctx.work / "no-ca-bundle.pem"
        ca.parent.mkdir(parents=True, exist_ok=True)
        ca.write_text("")
    logs = ctx.work / "images"
    try:
        if base == "local":
            _local_base(engine, ctx, ca, out)
        if engine.name == "docker":
            path = ctx.work / "docker-bake.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(bake_json(todo, context_of(ctx.root)))
            secret = ["--set", f"*.secrets={ca_secret(ca)}"] if ca else []
            cmd = engine.cmd("buildx", "bake", "-f", str(path), "--load", *secret,
                             *(i.target for i in todo))
            _run(cmd, engine.env, ctx.root, out, ", ".join(i.tag for i in todo), logs)
        else:
            targets = bake(todo, context_of(ctx.root))["target"]
            for image in todo:
                _run(podman_build(engine, targets[image.target], ca), engine.env, ctx.root, out,
                     image.tag, logs)
    except ImageFailed as exc:
        print(f"extmatrix: {exc}", file=sys.stderr)
        return 1
    for image in todo:
        print(f"# built {image.tag} on {image.base} for {', '.join(image.cells)}", file=out)
    return 0


def _local_base(engine: Engine, ctx: Context, ca: Path | None, out: TextIO) -> None:
    if engine.labels(local_rootfs(ctx.matrix.images.prefix)) is None and not shutil.which(
            "debootstrap"):
        raise NotBuildable("--base local needs debootstrap (apt-get install debootstrap)")
    cmd, env = bootstrap(engine, ctx, ca)
    _run(cmd, env, ctx.root, out, "the local base image", ctx.work / "images")


def _run(cmd: list[str], env: dict[str, str], cwd: Path, out: TextIO, what: str,
         logs: Path) -> None:
    """Run an image build, its output shown as it comes and kept in a log under `logs`,
    which a failure names with the line that says why."""
    log = logs / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', what)[:100]}.log"
    log.unlink(missing_ok=True)  # this build's output alone
    steps = Steps(log, echo=out, stream=out)
    try:
        steps.run(f"building {what}", cmd, env=env, cwd=cwd)
    except StepFailed as exc:
        raise ImageFailed(exc.detail) from None
    finally:
        steps.close()
