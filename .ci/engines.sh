#!/usr/bin/env bash
# Container engines for the container-cell tests, on a Debian machine where we are root:
# podman (with runc) and debootstrap, and docker: the engine from docker.io, buildx from
# Debian trixie (bookworm has none; trixie's installs on bookworm). Sourced by .ci/run;
# `start_dockerd` / `stop_dockerd` run a daemon of our own (own data root, own PID file).
set -euo pipefail

install_engines() {
  local need=()
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || need+=(runc)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v dockerd >/dev/null || need+=(docker.io)
  if ((${#need[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if ! docker buildx version >/dev/null 2>&1; then
    local list=/etc/apt/sources.list.d/extmatrix-trixie.list
    echo "deb http://deb.debian.org/debian trixie main" >"$list"
    # Only docker-buildx comes from trixie: nothing else is upgraded from it.
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' \
      >/etc/apt/preferences.d/extmatrix-trixie
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t trixie docker-buildx >/dev/null
  fi
}

DOCKERD_ROOT=${DOCKERD_ROOT:-/var/lib/extmatrix-dockerd}
DOCKERD_PIDFILE="$DOCKERD_ROOT.pid"

start_dockerd() {
  if docker info >/dev/null 2>&1; then return 0; fi  # one answers already: use it
  mkdir -p "$DOCKERD_ROOT"
  # The default bridge and iptables: bake and cibuildwheel use the default network.
  dockerd --storage-driver=overlay2 --data-root "$DOCKERD_ROOT" --pidfile "$DOCKERD_PIDFILE" \
    --exec-root "$DOCKERD_ROOT.exec" >"$DOCKERD_ROOT.log" 2>&1 &
  for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "dockerd did not start; its log: $DOCKERD_ROOT.log" >&2
  tail -n 20 "$DOCKERD_ROOT.log" >&2
  return 1
}

stop_dockerd() {
  if [[ -f "$DOCKERD_PIDFILE" ]]; then
    kill "$(cat "$DOCKERD_PIDFILE")" 2>/dev/null || true
    for _ in $(seq 30); do [[ -f "$DOCKERD_PIDFILE" ]] || break; sleep 1; done
  fi
}
