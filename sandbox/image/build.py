"""Build the sandbox image offline: debootstrap a minimal Debian, then `docker import` it.

No image registry is reachable from the machines this runs on, so `docker build` from a base
image is impossible; the Debian package mirror from the machine's apt sources is. The image holds
python3 and g++, and a non-root user that the containers run as. The in-jail runner is not baked
into the image: the Docker backend passes its source on the command line, so the image never
goes stale when the runner changes.

    python -m sandbox.image.build [--image agentrl-sandbox:latest] [--mirror URL] [--suite bookworm]
                                  [--if-stale]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_IMAGE = "agentrl-sandbox:latest"
DEFAULT_SUITE = "bookworm"
PACKAGES = ("python3", "g++")
SANDBOX_UID = 10001
SANDBOX_USER = "sandbox"
# Bump when the recipe below changes: images of another version are rebuilt by --if-stale
# and refused by the Docker backend.
IMAGE_VERSION = "2"
VERSION_LABEL = "agentrl.sandbox.image_version"
_APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
# Directories of the rootfs that only package management or documentation needs.
_PRUNED_DIRS = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man")


def find_debian_mirror(suite: str = DEFAULT_SUITE) -> str:
    """The URI of the Debian archive that the machine's apt sources use for `suite`."""
    for text in _read_apt_sources():
        for uri, suites in _source_entries(text):
            if suite in suites and "debian-security" not in uri:
                return uri
    raise ValueError(
        f"no Debian mirror serving suite {suite!r} found in /etc/apt/sources.list(.d); "
        "pass one with --mirror http://deb.debian.org/debian"
    )


def _read_apt_sources() -> list[str]:
    texts = []
    for location in _APT_SOURCES:
        files = sorted(location.glob("*")) if location.is_dir() else [location]
        texts += [f.read_text() for f in files if f.is_file() and f.suffix in ("", ".list", ".sources")]
    return texts


def _source_entries(text: str) -> list[tuple[str, list[str]]]:
    """(uri, suites) pairs from one-line (`deb URI SUITE ...`) or deb822 (`URIs:`/`Suites:`) text."""
    entries = []
    for match in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.MULTILINE):
        entries.append((match.group(1), [match.group(2)]))
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^(URIs|Suites):\s*(.+)$", stanza, re.MULTILINE))
        if "URIs" in fields and "Suites" in fields:
            entries += [(uri, fields["Suites"].split()) for uri in fields["URIs"].split()]
    return entries


def debootstrap(rootfs: Path, suite: str, mirror: str) -> None:
    """Install a minimal Debian `suite` with PACKAGES into `rootfs`."""
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed: apt-get install -y debootstrap")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(rootfs), mirror]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def add_sandbox_user(rootfs: Path) -> None:
    """Leave only the sandbox user and nobody in the account files; jailed code has no use
    for the others (containers run under uids of their own, given by the backend)."""
    (rootfs / "etc/passwd").write_text(
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}::/work:/usr/sbin/nologin\n"
        "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
    )
    (rootfs / "etc/group").write_text(f"{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
    for name in ("shadow", "gshadow", "passwd-", "group-", "shadow-", "gshadow-"):
        (rootfs / "etc" / name).unlink(missing_ok=True)
    # Mount point for the container's /work tmpfs; the root filesystem is read-only.
    (rootfs / "work").mkdir(exist_ok=True)


def prune(rootfs: Path) -> None:
    """Drop package caches and documentation; the jail never installs anything."""
    for relative in _PRUNED_DIRS:
        directory = rootfs / relative
        if directory.is_dir():
            for child in directory.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()


def docker_import(rootfs: Path, image: str) -> None:
    """Import `rootfs` as `image`, running as the sandbox user by default."""
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    changes = [
        f"USER {SANDBOX_UID}:{SANDBOX_UID}",
        "WORKDIR /work",
        "ENV LANG=C.UTF-8",
        f"LABEL {VERSION_LABEL}={IMAGE_VERSION}",
    ]
    argv = ["docker", "import"] + [arg for change in changes for arg in ("--change", change)] + ["-", image]
    try:
        subprocess.run(argv, stdin=tar.stdout, check=True, stdout=subprocess.DEVNULL)
    finally:
        tar.stdout.close()
        if tar.wait() != 0:
            raise RuntimeError(f"tar of {rootfs} failed with exit code {tar.returncode}")


def build_image(image: str = DEFAULT_IMAGE, suite: str = DEFAULT_SUITE, mirror: str | None = None) -> None:
    """Build `image` from scratch (about a minute, a few hundred MB of packages from the mirror)."""
    if os.geteuid() != 0:
        raise RuntimeError("building the sandbox image needs root (debootstrap chroots)")
    mirror = mirror or find_debian_mirror(suite)
    with tempfile.TemporaryDirectory(prefix="agentrl-sandbox-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        print(f"debootstrap {suite} from {mirror} ...", file=sys.stderr)
        debootstrap(rootfs, suite, mirror)
        add_sandbox_user(rootfs)
        prune(rootfs)
        print(f"docker import -> {image} ...", file=sys.stderr)
        docker_import(rootfs, image)
    print(f"built {image}", file=sys.stderr)


def image_version(image: str) -> str | None:
    """The recipe version `image` was built with; None when there is no such image."""
    inspect = subprocess.run(
        ["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{VERSION_LABEL}"}}}}', image],
        capture_output=True,
        text=True,
        check=False,
    )
    return inspect.stdout.strip() if inspect.returncode == 0 else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--suite", default=DEFAULT_SUITE)
    parser.add_argument("--mirror", default=None, help="Debian mirror URI (default: from apt sources)")
    parser.add_argument("--if-stale", action="store_true", help="build only if absent or of another version")
    args = parser.parse_args(argv)
    if args.if_stale and image_version(args.image) == IMAGE_VERSION:
        print(f"{args.image} is up to date (version {IMAGE_VERSION})", file=sys.stderr)
        return
    build_image(args.image, args.suite, args.mirror)


if __name__ == "__main__":
    main()
