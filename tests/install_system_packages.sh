#!/usr/bin/env bash
# System packages the test suite needs, installed with apt-get when missing. Idempotent.
#   - Debian's chromium and chromedriver, for the run viewer's browser tests;
#   - a Docker engine, bubblewrap and the offline-built sandbox image (sandbox/scripts/start_docker.sh).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "[install_system_packages] installing chromium and chromium-driver" >&2
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends chromium chromium-driver >/dev/null
fi
bash "$REPO_ROOT/sandbox/scripts/start_docker.sh"
