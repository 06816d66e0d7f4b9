"""The in-jail test harness for call and assert tests (copied into the jail; stdlib only).

Run as `python3 -I -B /work/_harness.py call|assert`. Stage: inside the jail, untrusted.

Why two processes: the host proves that a test ran to completion with a per-run random
marker. The parent reads the marker from stdin *before* forking, makes itself non-dumpable
(so that same-uid code can neither ptrace it nor open /proc/<parent>/mem or its fds), then
forks a child that wipes its copy of the marker and only then runs the user's program. The
child reports its outcome to the parent through a pipe; the parent (a child subreaper) waits
for the child, kills every process the program left behind, and only then prints
"\\n<marker> <report JSON>\\n". Output that lacks the marker, or a child that exits early
(sys.exit, os._exit, a signal), never yields an "ok" report. Return values travel as JSON
text: the host compares them, so `__eq__` overrides have nothing to act on.
"""

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import traceback
import types

MARKER_LENGTH = 32
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
REPORT_WAIT_S = 1.0
_write, _exit, _dumps = os.write, os._exit, json.dumps  # bound before user code can patch modules


def _read_marker() -> bytearray:
    """Read the marker straight into a buffer we can wipe (no intermediate copies)."""
    marker = bytearray(MARKER_LENGTH)
    view, filled = memoryview(marker), 0
    while filled < MARKER_LENGTH:
        count = os.readv(0, [view[filled:]])
        if count == 0:
            raise SystemExit("harness: no marker on stdin")
        filled += count
    return marker


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[_write(fd, data) :]


def _exec_file(path: str, module_name: str) -> dict:
    """Run a file as module `module_name`, registered in sys.modules as a script's module would be."""
    with open(path, encoding="utf-8") as source_file:
        code = compile(source_file.read(), path, "exec")
    module = types.ModuleType(module_name)
    module.__file__ = path
    sys.modules[module_name] = module
    exec(code, module.__dict__)  # noqa: S102 - running the program is this file's purpose
    return module.__dict__


def _run_test(mode: str) -> dict:
    if mode == "assert":
        _exec_file(os.path.abspath("program.py"), "__main__")
        return {"status": "ok"}
    with open("_call.json", encoding="utf-8") as call_file:
        call = json.load(call_file)
    namespace = _exec_file(os.path.abspath("main.py"), "solution")
    function = namespace.get(call["entry_point"])
    if not callable(function):
        return {
            "status": "error",
            "exception": "NameError",
            "message": f"no function {call['entry_point']!r}",
        }
    value = function(*call["args"], **call["kwargs"])
    try:
        value_json = _dumps(value)
    except (TypeError, ValueError) as error:
        return {"status": "unserialisable", "message": f"{type(value).__name__}: {error}"[:500]}
    return {"status": "ok", "value": value_json}


def _children() -> list[int]:
    me, children = os.getpid(), []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue  # not a process, or gone
        if int(fields[1]) == me:
            children.append(int(entry))
    return children


def _kill_descendants() -> None:
    """SIGKILL our children until none is left; their orphans are re-parented to us meanwhile."""
    while True:
        for child in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _child(mode: str, marker: bytearray, report_fd: int) -> None:
    marker[:] = bytes(MARKER_LENGTH)  # the user's program must never see it
    null_fd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    try:
        report = _run_test(mode)
    except AssertionError as error:
        report = {"status": "assertion_failed", "message": str(error)[:500]}
    except SystemExit as error:
        report = {"status": "exited", "message": f"exit({error.code!r}) before the test completed"[:500]}
    except BaseException as error:  # noqa: BLE001 - any exception of the program is its runtime error
        traceback.print_exc()
        report = {"status": "error", "exception": type(error).__name__, "message": str(error)[:500]}
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream must not lose the report
            stream.flush()
    _write_all(report_fd, _dumps(report).encode())
    _exit(0)


def main() -> None:
    mode = sys.argv[1]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("harness: prctl failed")
    marker = _read_marker()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(mode, marker, write_fd)
    os.close(write_fd)
    chunks: list[bytes] = []
    reader = threading.Thread(
        target=lambda: chunks.extend(iter(lambda: os.read(read_fd, 65536), b"")), daemon=True
    )
    reader.start()
    _, status = os.waitpid(pid, 0)
    # Nothing the program started may outlive it: a leftover process could read our report line
    # back out of the stdout pipe (via /proc/self/fd/1) and append a forged one. As a child
    # subreaper we inherit every orphan of the program, daemons included, and only those.
    _kill_descendants()
    reader.join(timeout=REPORT_WAIT_S)
    try:
        report = json.loads(b"".join(chunks)) if chunks else {"status": "no_report"}
    except ValueError:
        report = {"status": "no_report"}
    report["wait_status"] = status
    _write_all(1, b"\n" + bytes(marker) + b" " + json.dumps(report).encode() + b"\n")
    _exit(0)


if __name__ == "__main__":
    main()
