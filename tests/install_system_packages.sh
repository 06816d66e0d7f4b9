#!/usr/bin/env bash
# System packages the test suite needs, installed with apt-get when missing. Idempotent.
#   - Debian's chromium and chromedriver, for the run viewer's browser tests;
#   - gcc and python3-seccomp for the bwrap backend's init and seccomp filter;
#   - g++ and Python headers for torch.compile's CPU code generation (the compiled-layer tests);
#   - SGLang's HTTP contract module, from its wheel (tests/fetch_sglang_api.sh);
#   - a Docker engine, bubblewrap and the offline-built sandbox image (sandbox/scripts/start_docker.sh).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "[install_system_packages] installing chromium and chromium-driver" >&2
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends chromium chromium-driver >/dev/null
fi
# The bwrap backend compiles its jail init with gcc and exports its seccomp filter with
# libseccomp's binding for the system interpreter (python3-seccomp).
if ! command -v gcc >/dev/null || ! /usr/bin/python3 -c "import seccomp" 2>/dev/null; then
    echo "[install_system_packages] installing gcc and python3-seccomp" >&2
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends gcc libc6-dev python3-seccomp >/dev/null
fi
# torch.compile's CPU code generation builds C++ against the interpreter's headers.
if ! command -v g++ >/dev/null || ! python -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    echo "[install_system_packages] installing g++ and the Python headers" >&2
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends g++ python3-dev >/dev/null
fi
bash "$REPO_ROOT/tests/fetch_sglang_api.sh"
bash "$REPO_ROOT/sandbox/scripts/start_docker.sh"
