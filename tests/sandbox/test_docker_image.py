"""The offline image recipe, its version check, and the engine start-up script CI runs."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import docker
import pytest

from sandbox.backends.base import SandboxFailure
from sandbox.backends.docker import DEFAULT_IMAGE, DockerBackend
from sandbox.image.build import IMAGE_VERSION, VERSION_LABEL, _source_entries, add_sandbox_user, image_version

START_SCRIPT = Path(__file__).parents[2] / "sandbox" / "scripts" / "start_docker.sh"


def test_one_line_apt_sources_give_their_uri_and_suite():
    text = "# comment\ndeb [signed-by=/k.gpg] http://mirror.example/debian bookworm main\ndeb-src http://x y main\n"
    assert _source_entries(text) == [("http://mirror.example/debian", ["bookworm"])]


def test_deb822_apt_sources_give_every_uri_with_its_suites():
    text = (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "\n"
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
    )
    assert _source_entries(text) == [
        ("http://deb.debian.org/debian", ["bookworm", "bookworm-updates"]),
        ("http://deb.debian.org/debian-security", ["bookworm-security"]),
    ]


def test_the_image_keeps_only_the_sandbox_and_nobody_accounts(tmp_path):
    (tmp_path / "etc").mkdir()
    for name in ("passwd", "group", "shadow", "gshadow"):
        (tmp_path / "etc" / name).write_text("root:x:0:0:root:/root:/bin/bash\n")
    add_sandbox_user(tmp_path)
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["group", "passwd"]
    passwd = (tmp_path / "etc" / "passwd").read_text().splitlines()
    assert [line.split(":")[0] for line in passwd] == ["sandbox", "nobody"]
    assert (tmp_path / "work").is_dir()


def test_the_built_image_carries_the_current_recipe_version():
    assert image_version(DEFAULT_IMAGE) == IMAGE_VERSION


async def test_an_image_of_another_recipe_version_is_refused_with_the_rebuild_command():
    client = docker.from_env()
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    client.api.import_image_from_data(
        empty.getvalue(), repository="agentrl-sandbox", tag="test-old", changes=[f"LABEL {VERSION_LABEL}=0"]
    )
    try:
        with pytest.raises(SandboxFailure, match="recipe version '0'.*sandbox.image.build"):
            await DockerBackend.create(image="agentrl-sandbox:test-old", pool_size=1)
    finally:
        client.images.remove("agentrl-sandbox:test-old", force=True)
        client.close()


def test_the_start_script_is_idempotent_when_engine_and_image_are_ready():
    finished = subprocess.run(
        ["bash", str(START_SCRIPT)], capture_output=True, text=True, timeout=120, check=False
    )
    assert finished.returncode == 0, finished.stderr
    assert "docker engine already answers" in finished.stderr
    assert f"{DEFAULT_IMAGE} is up to date (version {IMAGE_VERSION})" in finished.stderr


def test_the_dockerfile_labels_the_same_recipe_version_as_the_offline_build():
    dockerfile = (Path(__file__).parents[2] / "sandbox" / "image" / "Dockerfile").read_text()
    assert f'LABEL {VERSION_LABEL}="{IMAGE_VERSION}"' in dockerfile
