"""One Docker jail: its lock-down as Docker reports it, and what the in-jail runner observes."""

from __future__ import annotations

import docker
import pytest

from sandbox.backends.base import Limits
from sandbox.backends.docker import DockerBackend

QUICK = Limits(wall_time_s=3.0, cpu_time_s=2.0, memory_mb=128, max_output_bytes=1000)


@pytest.fixture
async def backend():
    backend = await DockerBackend.create(pool_size=1, memory_mb=256, pids_limit=50)
    yield backend
    await backend.close()


@pytest.fixture
async def session(backend):
    session = await backend.open_session()
    yield session
    await session.close()


async def _run(session, code: str, limits: Limits = QUICK, stdin: bytes = b""):
    return await session.run(["python3", "-c", code], stdin, limits)


async def test_docker_reports_the_container_locked_down(session):
    client = docker.from_env()
    attrs = client.containers.get(session.container_id).attrs
    client.close()
    host = attrs["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["NetworkMode"] == "none"
    assert host["SecurityOpt"] == ["no-new-privileges"]
    # The program's 256 MiB plus the scratch allowance: tmpfs pages (64 + 64 + 16), inodes
    # (3 mounts x 16384 x 1536 bytes = 72 MiB) and the runner's reserve (32).
    memory = (256 + 64 + 64 + 16 + 72 + 32) << 20
    assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (memory, memory, 50)
    assert sorted(host["Tmpfs"]) == ["/dev/shm", "/tmp", "/work"]
    assert all("nr_inodes=16384" in options for options in host["Tmpfs"].values())
    uid, gid = attrs["Config"]["User"].split(":")
    assert int(uid) >= 1000 and uid == gid
    assert attrs["Config"]["Labels"]["agentrl.sandbox"] == "1"


async def test_jailed_code_runs_as_a_non_root_uid_without_capabilities(session):
    code = (
        "import os\n"
        "caps = [line.split() for line in open('/proc/self/status') if line.startswith('Cap')]\n"
        "print(os.getuid(), *(value for _, value in caps))"
    )
    uid, *capability_sets = (await _run(session, code)).stdout.split()
    assert int(uid) >= 1000
    assert (
        capability_sets == [b"0000000000000000"] * 5
    )  # inheritable, permitted, effective, bounding, ambient


async def test_the_root_filesystem_is_read_only_and_the_network_absent(session):
    code = (
        "import socket\n"
        "try:\n    open('/etc/owned', 'w')\nexcept OSError as e:\n    print(e.errno)\n"
        "s = socket.socket()\n"
        "try:\n    s.connect(('1.1.1.1', 80))\nexcept OSError as e:\n    print(e.errno)\n"
    )
    result = await _run(session, code)
    assert result.stdout.split() == [b"30", b"101"]  # EROFS, ENETUNREACH


async def test_stdin_files_and_output_pass_through_exactly(session):
    await session.write_files(
        {"dir/echo.py": b"import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])\n"}
    )
    stdin = bytes(range(256)) * 4
    result = await session.run(["python3", "dir/echo.py"], stdin, Limits(max_output_bytes=1024))
    assert (result.exit_code, result.stdout, result.output_exceeded) == (0, stdin[::-1], False)


async def test_output_beyond_the_limit_is_cut_and_flagged(session):
    result = await _run(session, "import sys\nwhile True: sys.stdout.write('x' * 4096)")
    assert result.output_exceeded
    assert result.stdout == b"x" * 1000


async def test_touching_more_memory_than_the_limit_is_a_memory_kill(session):
    result = await _run(session, "x = bytearray(400 << 20)")
    assert (result.memory_exceeded, result.signal) == (True, 9)


async def test_burning_cpu_past_the_cpu_limit_times_out(session):
    result = await _run(session, "while True: pass", Limits(wall_time_s=5.0, cpu_time_s=1.0))
    assert (result.timed_out, result.signal) == (True, 24)  # SIGXCPU
    assert result.cpu_time_s > 0.9


async def test_a_daemon_left_behind_is_killed_and_flagged_suspicious(session):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = await _run(session, code)
    assert (result.stdout, result.suspicious) == (b"parent done\n", True)
    count = await _run(session, "import os; print(sum(p.isdigit() for p in os.listdir('/proc')))")
    assert count.stdout == b"2\n"  # the runner and the counter


async def test_a_file_left_in_dev_shm_is_flagged_suspicious(session):
    result = await _run(session, "open('/dev/shm/x', 'w').write('x')")
    assert (result.exit_code, result.suspicious) == (0, True)


async def test_kill_minus_one_and_kill_of_pid_1_leave_the_runner_serving(session):
    # kill(-1) spares the caller, and PID 1 of a namespace ignores signals it has no handler for.
    killed = await session.run(["sh", "-c", "sleep 60 & kill -9 1; kill -9 -1; echo survived"], b"", QUICK)
    after = await _run(session, "print('still here')")
    assert (killed.exit_code, killed.stdout, killed.suspicious) == (0, b"survived\n", False)
    assert after.stdout == b"still here\n"


async def test_the_runner_memory_and_descriptors_are_out_of_reach(session):
    code = (
        "for path in ('/proc/1/mem', '/proc/1/fd/0', '/proc/1/environ'):\n"
        "    try:\n        open(path, 'rb').read(1)\n        print('read', path)\n"
        "    except OSError as e:\n        print(e.errno)\n"
    )
    result = await _run(session, code)
    assert result.stdout.split() == [b"13", b"13", b"13"]  # EACCES: the runner is not dumpable


async def test_a_fork_bomb_is_contained_and_cleaned_up(session):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = await _run(session, bomb, Limits(wall_time_s=1.0, cpu_time_s=1.0, max_processes=20))
    count = await _run(session, "import os; print(sum(p.isdigit() for p in os.listdir('/proc')))")
    assert result.timed_out
    assert count.stdout == b"2\n"


async def test_a_missing_program_exits_127_with_a_message(session):
    result = await session.run(["./no-such-binary"], b"", QUICK)
    assert result.exit_code == 127
    assert b"no-such-binary" in result.stderr


async def test_file_names_leaving_the_work_dir_are_rejected(session):
    for name in ("../etc/passwd", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(ValueError, match="relative path inside /work"):
            await session.write_files({name: b"x"})


async def test_cpp_compiles_and_runs_inside_the_jail(session):
    await session.write_files(
        {"main.cpp": b"#include <iostream>\nint main(){int a,b;std::cin>>a>>b;std::cout<<a+b;}\n"}
    )
    compiled = await session.run(["g++", "-O2", "-o", "main", "main.cpp"], b"", Limits(memory_mb=1024))
    result = await session.run(["./main"], b"2 40", QUICK)
    assert (compiled.exit_code, compiled.stderr) == (0, b"")
    assert result.stdout == b"42"
