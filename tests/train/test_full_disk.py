"""Run records on a disk that fills up: metrics.jsonl and config.yaml stay whole, and the next run works.

Each test mounts a small tmpfs of its own (the tests run as root, here and in CI) and fills it.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.config_loader import dump_config, load_config
from agentrl.metrics import MetricsLogger
from agentrl.train import record, record_config

FILLER = "filler"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.fail(
            "these tests mount a tmpfs, which needs root (CAP_SYS_ADMIN): "
            f"mount exited {mounted.returncode}: {mounted.stderr.strip()}"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill(disk: Path) -> None:
    """Take every free byte of `disk` with one file."""
    fd = os.open(disk / FILLER, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)


def free(disk: Path) -> None:
    (disk / FILLER).unlink()


def test_a_metrics_line_that_does_not_fit_is_not_written_at_all_and_the_next_run_resumes(small_disk, capsys):
    config = load_config(["env=math", "trainer.logger=[]"])
    path = small_disk / "metrics.jsonl"
    MetricsLogger(small_disk, config, resumed=False).log(1, {"reward/mean": 0.5})
    before = path.read_bytes()
    fill(small_disk)
    # Longer than what is left of the file's last page, so a plain write would store part of it.
    big_step = {f"env/metric_{index}/mean": float(index) for index in range(500)}
    with pytest.raises(OSError) as raised:
        MetricsLogger(small_disk, config, resumed=True).log(2, big_step)
    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    free(small_disk)
    logger = MetricsLogger(small_disk, config, resumed=True)
    logger.discard_after(1)
    logger.log(2, big_step)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert capsys.readouterr().err == ""


def test_a_resume_with_a_changed_setting_on_a_full_disk_keeps_the_earlier_config_whole(small_disk, capsys):
    first, changed = load_config(["env=math", "rollout.n=4"]), load_config(["env=math", "rollout.n=8"])
    record_config(small_disk, first)
    (small_disk / "checkpoints" / "step_000002").mkdir(parents=True)
    fill(small_disk)
    assert record(small_disk, changed) == 1
    assert capsys.readouterr().err == (
        f"error: cannot write {small_disk / 'config.yaml'}: No space left on device\n"
    )
    assert (small_disk / "config.yaml").read_text() == dump_config(first)
    assert sorted(path.name for path in small_disk.iterdir()) == ["checkpoints", "config.yaml", FILLER]
    free(small_disk)
    assert record(small_disk, changed) == 0
    assert (small_disk / "config.before_step_3.yaml").read_text() == dump_config(first)
    assert (small_disk / "config.yaml").read_text() == dump_config(changed)
