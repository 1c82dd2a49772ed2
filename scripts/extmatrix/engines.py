"""Container engines: which one builds the images and runs cibuildwheel, and its settings.

docker is chosen when its daemon answers and buildx is installed (images are
built with `docker buildx bake`); otherwise podman. podman takes its settings
from this project's own files (docker/podman/), handed to every call through
CONTAINERS_CONF and CONTAINERS_STORAGE_CONF: the host's /etc/containers is never
read or changed, and the image store lives in the engine cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .errors import NotBuildable, UserError

ENGINES = ("docker", "podman")
# Handed to builds so pip inside trusts what the host trusts (TLS-inspecting proxies):
# the first that exists of the variables people set for it, then each distribution's place.
CA_VARIABLES = ("EXTMATRIX_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
SYSTEM_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch, Gentoo
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL, CentOS, Amazon Linux
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # the same, newer layout
    "/etc/ssl/ca-bundle.pem",  # openSUSE, SLES
    "/etc/ssl/cert.pem",  # others (and macOS)
)
PODMAN_DIR = Path("docker") / "podman"  # relative to the project root


def docker_folder(project: Path) -> Path:
    """The container files (Dockerfile, podman settings, local base): the project's own
    docker/ where it has one, which its maintainer may adapt, else those that come with the
    engine, so that any extension's repository can build in a container as it is."""
    own = project / "docker"
    if own.is_dir():
        return own
    here = Path(__file__).resolve().parent
    for shipped in (here / "docker", here.parents[1] / "docker"):  # a wheel; a checkout
        if (shipped / "Dockerfile").is_file():
            return shipped
    return own


@dataclass(frozen=True)
class Engine:
    name: str  # docker | podman
    exe: str
    env: dict[str, str] = field(default_factory=dict)  # added to every call
    why: str = ""  # how it was chosen, for the user

    def cmd(self, *args: str) -> list[str]:
        return [self.exe, *args]

    def labels(self, image: str) -> dict[str, str] | None:
        """The image's labels; None when the engine does not have the image."""
        result = subprocess.run(
            self.cmd("image", "inspect", "--format", "{{json .Config.Labels}}", image),
            capture_output=True, text=True, env={**os.environ, **self.env})
        if result.returncode != 0:
            return None
        try:
            found = json.loads(result.stdout.strip().splitlines()[0])
        except (ValueError, IndexError):
            return {}
        return found if isinstance(found, dict) else {}


def check_choice(choice: str | None = None) -> str:
    """`choice`, or $EXTMATRIX_ENGINE, or auto; a UserError for a name no engine has."""
    chosen = choice or os.environ.get("EXTMATRIX_ENGINE") or "auto"
    if chosen not in ("auto", *ENGINES):
        where = None if choice else "$EXTMATRIX_ENGINE"
        raise UserError(where, f"unknown container engine '{chosen}'", "use docker or podman")
    return chosen


def detect(choice: str | None, project: Path, cache: Path) -> Engine:
    """The engine named by `choice` (or $EXTMATRIX_ENGINE), else the first usable one;
    `Engine.why` says how it was chosen, a NotBuildable what to install or start."""
    choice = check_choice(choice)
    named = "" if choice == "auto" else " (asked for)"
    docker_why = _docker_problem() if choice in ("auto", "docker") else None
    if choice in ("auto", "docker") and docker_why is None:
        return Engine("docker", shutil.which("docker") or "docker",
                      why=f"docker{named}: its daemon answers and buildx is installed")
    if choice == "docker":
        raise NotBuildable(f"docker: {docker_why}")
    podman_why = _podman_problem()
    if podman_why is None:
        chosen = podman(project, cache)
        because = f" (docker: {docker_why})" if docker_why else ""
        return Engine(chosen.name, chosen.exe, chosen.env,
                      why=f"podman{named}: installed with runc{because}")
    if choice == "podman":
        raise NotBuildable(f"podman: {podman_why}")
    raise NotBuildable(f"no container engine: docker: {docker_why}; podman: {podman_why}")


def _docker_problem() -> str | None:
    exe = shutil.which("docker")
    if exe is None:
        return "not installed (e.g. apt-get install docker.io)"
    if _fails([exe, "buildx", "version"]):
        return "buildx is not installed (e.g. the docker-buildx package)"
    if _fails([exe, "info", "--format", "{{.ServerVersion}}"]):
        return "no daemon answers (start dockerd, or check DOCKER_HOST)"
    return None


def _podman_problem() -> str | None:
    if shutil.which("podman") is None:
        return "not installed (e.g. apt-get install podman runc)"
    # Our containers.conf picks runc: crun fails on cgroups-hybrid hosts.
    if shutil.which("runc") is None:
        return "runc is not installed (e.g. apt-get install runc)"
    return None


def _fails(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return True


def podman(project: Path, cache: Path) -> Engine:
    folder = docker_folder(project) / "podman"
    conf, template = folder / "containers.conf", folder / "storage.conf.in"
    for needed in (conf, template):
        if not needed.is_file():
            raise UserError(str(needed), "podman settings file is missing",
                            "restore it (the engine's own are in its docker/podman/), or "
                            "remove the project's docker/ to use the engine's")
    state = cache / "podman"
    storage = state / "storage.conf"
    text = (template.read_text().replace("@GRAPHROOT@", str(state / "storage"))
            .replace("@RUNROOT@", str(state / "run")))
    _write_if_changed(storage, text)
    env = {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}
    return Engine("podman", shutil.which("podman") or "podman", env)


def _write_if_changed(path: Path, text: str) -> None:
    """Cells may start at once: never leave a half-written file for another to read."""
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def ca_bundle() -> Path | None:
    """The host CA bundle to trust inside builds: $EXTMATRIX_CA_BUNDLE ('' turns it off),
    else one named by PIP_CERT/REQUESTS_CA_BUNDLE/SSL_CERT_FILE, else the system's."""
    for variable in CA_VARIABLES:
        value = os.environ.get(variable)
        if value is None:
            continue
        if value == "" and variable == "EXTMATRIX_CA_BUNDLE":
            return None
        if Path(value).is_file():
            return Path(value)
        if variable == "EXTMATRIX_CA_BUNDLE":
            raise UserError(None, f"EXTMATRIX_CA_BUNDLE={value} is not a file",
                            "point it at a PEM bundle, or set it empty to pass none")
    return next((Path(p) for p in SYSTEM_CA_BUNDLES if Path(p).is_file()), None)
