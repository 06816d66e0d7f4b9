#!/usr/bin/env bash
# Make a Docker engine and the sandbox image available on this machine. Idempotent.
#
#   1. install docker.io, bubblewrap and debootstrap with apt-get when any is missing;
#   2. start dockerd in the background when no engine answers on the socket;
#   3. wait (bounded) until the engine answers;
#   4. build the sandbox image offline when it is absent or stale.
#
# Environment: AGENTRL_SANDBOX_IMAGE (default agentrl-sandbox:latest),
#              DOCKER_WAIT_S (default 60), DOCKERD_LOG (default /var/log/agentrl-dockerd.log).
set -euo pipefail

IMAGE="${AGENTRL_SANDBOX_IMAGE:-agentrl-sandbox:latest}"
WAIT_S="${DOCKER_WAIT_S:-60}"
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/agentrl-dockerd.log}"
SOCKET=/var/run/docker.sock
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

log() { echo "[start_docker] $*" >&2; }

engine_answers() {
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

install_missing_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v bwrap >/dev/null || missing+=(bubblewrap)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if ((${#missing[@]} == 0)); then
        return
    fi
    if [[ $(id -u) -ne 0 ]]; then
        log "missing ${missing[*]} and not root: install them or rerun as root"
        exit 1
    fi
    log "installing ${missing[*]}"
    # Another apt run on a shared machine holds the lock for a while: wait for it.
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
}

start_engine() {
    if engine_answers; then
        log "docker engine already answers"
        return
    fi
    if pgrep -x dockerd >/dev/null; then
        log "dockerd is running but not answering yet; waiting for it"
    else
        log "starting dockerd (log: $DOCKERD_LOG)"
        # setsid: the engine must outlive this script and the shell that ran it.
        setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    local waited=0
    until engine_answers; do
        if ((waited >= WAIT_S)); then
            log "no docker engine answered on $SOCKET within ${WAIT_S}s; last lines of $DOCKERD_LOG:"
            tail -n 20 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    log "docker engine answers on $SOCKET after ${waited}s"
}

build_image() {
    # Builds only when the image is absent or was built from another version of the recipe.
    (cd "$REPO_ROOT" && python3 -m sandbox.image.build --image "$IMAGE" --if-stale)
}

install_missing_packages
start_engine
build_image
