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
#   CA_BUNDLE      host CA bundle pip trusts, passed as the build secret ca_bundle (never
#                  stored in a layer)  (default: /etc/ssl/certs/ca-certificates.crt; empty: none)
#   ENGINE         podman or docker executable       (default: $PODMAN, else podman; docker
#                  builds with buildx)
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
tarball="${WORKDIR}/rootfs-${SUITE}.tar"  # kept: a second engine imports the same one
if ! "${ENGINE}" image inspect "${ROOTFS_IMAGE}" >/dev/null 2>&1; then
  if [[ ! -s "${tarball}" ]]; then
    rm -rf "${rootfs}"
    mkdir -p "${WORKDIR}"
    debootstrap --variant=minbase "${SUITE}" "${rootfs}" "${MIRROR}"
    tar -C "${rootfs}" -cf "${tarball}.partial" .
    mv "${tarball}.partial" "${tarball}"
    rm -rf "${rootfs}"
  fi
  "${ENGINE}" import - "${ROOTFS_IMAGE}" <"${tarball}"
fi

build_args=(--build-arg "ROOTFS_IMAGE=${ROOTFS_IMAGE}")
if [[ -n "${CA_BUNDLE}" ]]; then
  build_args+=(--secret "id=ca_bundle,src=${CA_BUNDLE}")
fi
if [[ "$(basename "${ENGINE}")" == podman* ]]; then
  # podman's default OCI format drops SHELL.
  build=("${ENGINE}" build --format docker)
else
  build=("${ENGINE}" buildx build --load)
fi
"${build[@]}" -f "${here}/Containerfile" -t "${BASE_IMAGE}" "${build_args[@]}" "${here}"
