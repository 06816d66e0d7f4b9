"""One Docker jail: its lock-down as Docker reports it, and what the in-jail runner observes."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from sandbox.backends.base import Limits
from sandbox.backends.docker import DockerBackend
from sandbox.backends.seccomp_filter import docker_profile

QUICK = Limits(wall_time_s=3.0, cpu_time_s=2.0, memory_mb=128, max_output_bytes=1000)
IPC_KEY = 0x5EED
# Leaves a SysV shared memory segment, a message queue and a semaphore set, each holding data.
LEAVE_IPC = f"""
import ctypes
libc = ctypes.CDLL(None)
libc.shmat.restype = ctypes.c_void_p
segment = libc.shmget({IPC_KEY}, 4096, 0o1600)
ctypes.memmove(libc.shmat(segment, None, 0), b"shm secret", 10)
class Message(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 16)]
queue = libc.msgget({IPC_KEY}, 0o1600)
sent = libc.msgsnd(queue, ctypes.byref(Message(1, b"queue secret")), 16, 0)
semaphores = libc.semget({IPC_KEY}, 1, 0o1600)
print(segment >= 0, queue >= 0, sent, semaphores >= 0, libc.semctl(semaphores, 0, 16, 42))  # 16: SETVAL
"""
# Looks the three objects up by key, then counts every SysV IPC object of the namespace.
FIND_IPC = f"""
import ctypes
libc = ctypes.CDLL(None)
print(libc.shmget({IPC_KEY}, 0, 0), libc.msgget({IPC_KEY}, 0), libc.semget({IPC_KEY}, 0, 0))
print(sum(len(open(f"/proc/sysvipc/{{kind}}").readlines()) - 1 for kind in ("shm", "msg", "sem")))
"""


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
    assert host["SecurityOpt"] == ["no-new-privileges", f"seccomp={docker_profile()}"]
    # The program's 256 MiB (its processes and its tmpfs files together) plus the runner's 32.
    memory = (256 + 32) << 20
    assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (memory, memory, 50)
    assert sorted(host["Tmpfs"]) == ["/dev/shm", "/tmp", "/work"]
    assert host["IpcMode"] == "private"
    assert (host["Sysctls"]["kernel.shm_rmid_forced"], host["Sysctls"]["kernel.msgmni"]) == ("1", "16")
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


async def test_a_daemon_left_behind_is_killed_with_the_run_and_leaves_nothing_to_recycle(session):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = await _run(session, code)
    assert (result.stdout, result.suspicious) == (b"parent done\n", False)
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


async def test_ipc_objects_a_run_leaves_are_removed_and_flagged_suspicious(session):
    left = await _run(session, LEAVE_IPC)
    found = await _run(session, FIND_IPC)
    assert (left.stdout, left.suspicious) == (b"True True 0 True 0\n", True)
    assert found.stdout == b"-1 -1 -1\n0\n"


async def test_ipc_objects_of_one_session_reach_neither_the_next_session_nor_the_host(backend):
    first = await backend.open_session()
    left = await _run(first, LEAVE_IPC)
    await first.close()
    second = await backend.open_session()
    found = await _run(second, FIND_IPC)
    await second.close()
    host_keys = _host_sysv_ipc_keys()
    assert left.stdout == b"True True 0 True 0\n"
    assert found.stdout == b"-1 -1 -1\n0\n"
    assert str(IPC_KEY) not in host_keys


def _host_sysv_ipc_keys() -> set[str]:
    listings = (Path(f"/proc/sysvipc/{kind}").read_text() for kind in ("shm", "msg", "sem"))
    return {line.split()[0] for listing in listings for line in listing.splitlines()[1:]}


async def test_message_queues_and_posix_queues_are_few_and_removed_after_the_run(session):
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "queues = 0\n"
        "while libc.msgget(0, 0o1600) >= 0:\n    queues += 1\n"  # 0: IPC_PRIVATE
        "print(queues, ctypes.get_errno())\n"
        "posix = 0\n"
        "while libc.mq_open(f'/q{posix}'.encode(), os.O_CREAT | os.O_RDWR, 0o600, None) >= 0:\n"
        "    posix += 1\n"
        "print(posix, ctypes.get_errno())\n"
    )
    made = await _run(session, code)
    left = await session.run(["sh", "-c", "ls -A /dev/mqueue; tail -n +2 /proc/sysvipc/msg"], b"", QUICK)
    assert (made.stdout, made.suspicious) == (b"16 28\n9 24\n", True)  # ENOSPC; EMFILE: 800 KiB

    assert left.stdout == b""


async def test_python_multiprocessing_still_works_inside_the_jail(session):
    code = (
        "import multiprocessing\n"
        "from multiprocessing import shared_memory\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.Pool(2) as pool:\n        print(pool.map(abs, [-1, -2, 3]))\n"
        "    block = shared_memory.SharedMemory(create=True, size=8)\n"
        "    block.buf[0] = 7\n    print(block.buf[0])\n    block.close()\n    block.unlink()\n"
    )
    result = await _run(session, code, Limits(wall_time_s=10.0, cpu_time_s=5.0, max_processes=16))
    assert (result.stdout, result.suspicious) == (b"[1, 2, 3]\n7\n", False)


async def test_writing_judge_files_replaces_symlinks_left_there_without_following_them(session):
    plant = (
        "import os\n"
        "os.mkdir('/tmp/outside')\n"
        "open('/tmp/outside/target', 'w').write('keep')\n"
        "os.symlink('/tmp/outside/target', 'input.txt')\n"
        "os.symlink('/tmp/outside', 'data')\n"
    )
    check = (
        "import os\n"
        "print(open('/tmp/outside/target').read(), os.listdir('/tmp/outside'))\n"
        "print(os.path.islink('input.txt'), open('input.txt').read())\n"
        "print(os.path.islink('data'), open('data/case.txt').read())\n"
    )
    planted = await _run(session, plant)
    await session.write_files({"input.txt": b"judge", "data/case.txt": b"case"})
    result = await _run(session, check)
    assert planted.exit_code == 0
    assert result.stdout == b"keep ['target']\nFalse judge\nFalse case\n"


async def test_writing_judge_files_replaces_a_locked_directory_left_there(session):
    plant = (
        "import os\nos.makedirs('input.txt/inner')\nos.chmod('input.txt/inner', 0)\nos.chmod('input.txt', 0)"
    )
    planted = await _run(session, plant)
    await session.write_files({"input.txt": b"judge"})
    result = await _run(session, "print(open('input.txt').read())")
    assert (planted.exit_code, result.stdout) == (0, b"judge\n")


async def test_running_out_of_inodes_in_work_is_output_exceeded_and_the_container_is_reused(backend):
    fill = (
        "import os\n"
        "count = 0\n"
        "try:\n"
        "    while True:\n        os.close(os.open(f'f{count}', os.O_CREAT | os.O_WRONLY))\n        count += 1\n"
        "except OSError as error:\n    print(error.errno, count > 16000)\n"
    )
    first = await backend.open_session()
    filled = await _run(first, fill)
    await first.close()
    second = await backend.open_session()
    after = await _run(second, "import os\nopen('x', 'w').write('x')\nprint(os.listdir('.'))")
    await second.close()
    assert (filled.exit_code, filled.stdout, filled.output_exceeded, filled.suspicious) == (
        0,
        b"28 True\n",  # ENOSPC once the 16384 inodes of /work are used up
        True,
        False,
    )
    assert second.container_id == first.container_id
    assert after.stdout == b"['x']\n"
