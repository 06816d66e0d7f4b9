#!/usr/bin/env bash
# SGLang's generated HTTP contract (sglang/api/v1/api_types.py) for tests/engine/test_sglang_client_contract.py.
# `pip install sglang` would pull torch and GPU wheels, so only the wheel is downloaded (no
# dependencies) and that one module is extracted; it needs msgspec alone (a dev dependency).
# Idempotent; run by tests/install_system_packages.sh with the test virtualenv active.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(python -c 'from agentrl.engine.remote.sglang_protocol import SGLANG_VERSION; print(SGLANG_VERSION)')"
TARGET="$REPO_ROOT/tests/.sglang/$VERSION"
if [ ! -f "$TARGET/api_types.py" ]; then
    echo "[fetch_sglang_api] downloading the sglang $VERSION wheel for its api_types.py" >&2
    WHEELS="$(mktemp -d)"
    trap 'rm -rf "$WHEELS"' EXIT
    python -m pip download -q --no-deps --only-binary=:all: "sglang==$VERSION" -d "$WHEELS"
    mkdir -p "$TARGET"
    python - "$WHEELS" "$TARGET" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("sglang-*.whl"))
with zipfile.ZipFile(wheel) as archive:
    pathlib.Path(sys.argv[2], "api_types.py").write_bytes(archive.read("sglang/api/v1/api_types.py"))
PY
fi
