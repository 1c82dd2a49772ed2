#!/usr/bin/env bash
# Build a manylinux-like base image from Debian without any container registry.
#
#   1. debootstrap a minimal Debian root filesystem      (~40 s, ~200 MB)
#   2. import it as a podman image                        (~7 s)
#   3. podman build Containerfile on top of it           (python, gcc, auditwheel)
#
# Needs root, debootstrap, and podman (with runc; see ../podman/containers.conf) or docker.
# All locations are parameters (environment variables):
#   SUITE          Debian suite                     (default: bookworm)
#   MIRROR         Debian mirror                     (default: http://deb.debian.org/debian)
#   WORKDIR        scratch dir for the rootfs        (default: ${TMPDIR:-/tmp}/extmatrix-rootfs)
#   ROOTFS_IMAGE   name for the imported rootfs      (default: localhost/extmatrix-rootfs:$SUITE)
#   BASE_IMAGE     name of the final base image      (default: localhost/extmatrix-base:$SUITE)
#   CA_BUNDLE      host CA bundle mounted for pip    (default: /etc/ssl/certs/ca-certificates.crt;
#                  set empty to skip the mount)
#   ENGINE         podman or docker executable       (default: $PODMAN, else podman)
# Podman's own config comes from CONTAINERS_CONF / CONTAINERS_STORAGE_CONF if set.
set -euo pipefail

SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
WORKDIR=${WORKDIR:-${TMPDIR:-/tmp}/extmatrix-rootfs}
ROOTFS_IMAGE=${ROOTFS_IMAGE:-localhost/extmatrix-rootfs:${SUITE}}
BASE_IMAGE=${BASE_IMAGE:-localhost/extmatrix-base:${SUITE}}
CA_BUNDLE=${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
ENGINE=${ENGINE:-${PODMAN:-podman}}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

rootfs="${WORKDIR}/rootfs"
if ! "${ENGINE}" image inspect "${ROOTFS_IMAGE}" >/dev/null 2>&1; then
  rm -rf "${rootfs}"
  mkdir -p "${WORKDIR}"
  debootstrap --variant=minbase "${SUITE}" "${rootfs}" "${MIRROR}"
  tar -C "${rootfs}" -c . | "${ENGINE}" import - "${ROOTFS_IMAGE}"
  rm -rf "${rootfs}"
fi

build_args=(--build-arg "ROOTFS_IMAGE=${ROOTFS_IMAGE}")
if [[ "$(basename "${ENGINE}")" == podman* ]]; then
  # podman's default OCI format drops SHELL; docker build has no volume mounts.
  build_args+=(--format docker)
  if [[ -n "${CA_BUNDLE}" ]]; then
    build_args+=(-v "${CA_BUNDLE}:/run/host-ca-bundle.crt:ro"
                 --build-arg PIP_CERT=/run/host-ca-bundle.crt)
  fi
fi
"${ENGINE}" build -f "${here}/Containerfile" -t "${BASE_IMAGE}" "${build_args[@]}" "${here}"
