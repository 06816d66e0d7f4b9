"""In-jail runner: PID 1 of every sandbox container; runs one untrusted process at a time.

The host talks to it over the container's attached stdin/stdout with length-prefixed JSON
messages (4-byte big-endian length, then UTF-8 JSON; bytes travel base64-encoded). Operations:

    ping                          -> {"ok": true}
    write {files: {path: b64}}    -> {"ok": true}          (into /work, a tmpfs)
    run {argv, stdin, limits, judge_process}
                                  -> {"output": 1|2, "data": b64} per chunk of stdout|stderr, as read,
                                     then {"ok": true, "result": {...ProcessResult fields but output...}}
    reset                         -> {"ok": true, "clean": bool}  (kill everything, empty /work, /tmp,
                                                              remove IPC objects)

Every process the runner starts runs under the namespace seccomp filter (BPF that the host
exported with libseccomp, sandbox/backends/seccomp_filter.py, passed as the runner's argument),
loaded right before exec: no program can make or enter a namespace. The judge of a call or
assert test gets its user and PID namespace from the runner first, then the filter.

Why PID 1: inside its PID namespace the init process ignores every signal it has no handler for,
SIGKILL included, so jailed code running as the same uid cannot kill the runner, and orphaned
grandchildren are reparented to it, so `kill(-1, SIGKILL)` from here ends every other process.
The runner also makes itself non-dumpable so that jailed code cannot ptrace it or read
/proc/1/mem, /proc/1/fd/*. It only measures; verdicts are decided on the host.

Standard library only: the host passes this file's source as `python3 -I -S -c SOURCE FILTER`,
FILTER being the namespace filter's BPF, base64-encoded.
"""

import base64
import ctypes
import json
import math
import os
import resource
import selectors
import signal
import stat
import struct
import subprocess
import sys
import time

WORK_DIR = "/work"
SCRATCH_DIRS = ("/work", "/tmp")
SCRATCH_DIR_MODES = {"/work": 0o700, "/tmp": 0o1777}  # as mounted; a program may chmod them
# Writable places outside the two scratch tmpfs mounts; anything left there is suspicious.
OTHER_WRITABLE_DIRS = ("/dev/shm", "/dev/mqueue")
POSIX_QUEUE_DIR = "/dev/mqueue"
# The container's IPC namespace lives as long as the container: (listing, libc call removing one).
SYSV_IPC_OBJECTS = (
    ("/proc/sysvipc/shm", "shmctl"),
    ("/proc/sysvipc/msg", "msgctl"),
    ("/proc/sysvipc/sem", "semctl"),
)
IPC_RMID = 0
OOM_COUNT_WAIT_S = 0.1
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORK_DIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
MAX_OPEN_FILES = 256
# POSIX message queue bytes per uid, the kernel's default: nine queues of default size.
MAX_QUEUE_BYTES = 819200
READ_CHUNK = 65536
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
BPF_INSTRUCTION_BYTES = 8
# A test's judge process (sandbox/harness.py) runs with the program as the init of a PID namespace
# the judge is not in: no process of the program can see, signal or ptrace it. The user namespace
# lets an unprivileged process make the PID namespace.
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000


class SeccompProgram(ctypes.Structure):
    """struct sock_fprog: a BPF program as prctl(PR_SET_SECCOMP) takes it."""

    _fields_ = [("length", ctypes.c_ushort), ("instructions", ctypes.c_void_p)]


class NamespaceFilter:
    """The namespace seccomp filter, loaded by each child of the runner right before exec."""

    def __init__(self, bpf):
        if not bpf or len(bpf) % BPF_INSTRUCTION_BYTES:
            raise ValueError(f"the namespace filter must be whole BPF instructions, got {len(bpf)} bytes")
        self.instructions = ctypes.create_string_buffer(bpf, len(bpf))
        self.program = SeccompProgram(len(bpf) // BPF_INSTRUCTION_BYTES, ctypes.addressof(self.instructions))
        self.libc = ctypes.CDLL(None, use_errno=True)
        word = ctypes.c_ulong
        self.libc.prctl.argtypes = [ctypes.c_int, word, ctypes.c_void_p, word, word]

    def load(self):
        """Stack the filter on this process (and so on all it will start); raise OSError if refused."""
        if self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if self.libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self.program), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "loading the namespace seccomp filter failed")

    def enter_judge_namespaces(self):
        """A user namespace (this uid mapped to itself) and a PID namespace for this process's children."""
        uid, gid = os.geteuid(), os.getegid()
        if self.libc.unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
            raise OSError(ctypes.get_errno(), "unshare of the judge's namespaces failed")
        maps = {"setgroups": "deny", "uid_map": f"{uid} {uid} 1", "gid_map": f"{gid} {gid} 1"}
        for name, text in maps.items():  # in this order: no gid map without setgroups denied
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)


def read_message(stream):
    header = stream.read(4)
    if len(header) < 4:
        return None
    (length,) = struct.unpack(">I", header)
    return json.loads(stream.read(length))


def write_message(stream, message):
    payload = json.dumps(message).encode()
    stream.write(struct.pack(">I", len(payload)) + payload)
    stream.flush()


def oom_kill_count():
    """How many processes the kernel's OOM killer has killed in this container so far."""
    for path in OOM_FILES:
        try:
            with open(path) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return 0


def _oom_counted_within(oom_before, wait_s):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if oom_kill_count() > oom_before:
            return True
        time.sleep(0.002)
    return oom_kill_count() > oom_before


def other_processes():
    """Pids of live (not zombie) processes in the container other than the runner."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    state = handle.read().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                pids.append(int(name))
    return pids


def kill_everything_else():
    """SIGKILL every other process (one atomic pass over the namespace) and reap them all."""
    kill_all()
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def sysv_ipc_ids(listing):
    """Ids of the SysV IPC objects in one /proc/sysvipc listing (a header, then one per line)."""
    try:
        with open(listing) as handle:
            return [int(line.split()[1]) for line in handle.readlines()[1:] if line.strip()]
    except OSError:
        return []


def remove_ipc_objects():
    """Remove every SysV IPC object and POSIX message queue, so that none outlives the run that
    made it: they could carry data to a later session or hold memory the runner needs. They all
    belong to the runner's uid (or were created by it), which is allowed to remove them.
    Returns how many there were."""
    libc = ctypes.CDLL(None, use_errno=True)
    count = 0
    for listing, function in SYSV_IPC_OBJECTS:
        for ident in sysv_ipc_ids(listing):
            count += 1
            if function == "semctl":
                libc.semctl(ident, 0, IPC_RMID)
            else:
                getattr(libc, function)(ident, IPC_RMID, None)
    try:
        queues = os.listdir(POSIX_QUEUE_DIR)
    except OSError:
        queues = []
    for name in queues:
        count += 1
        try:
            os.unlink(os.path.join(POSIX_QUEUE_DIR, name))
        except OSError:
            pass  # still listed: reset() reports the container unclean and it is recycled
    return count


def ipc_objects_left():
    return any(sysv_ipc_ids(listing) for listing, _ in SYSV_IPC_OBJECTS)


def set_child_limits(limits):
    cpu_s = max(1, math.ceil(limits["cpu_time_s"]))
    # The hard limit one second later turns an ignored SIGXCPU into SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    # Each container runs as its own uid, so this counts the run's processes plus the runner.
    processes = limits["max_processes"] + 1
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    file_size = limits["max_file_size_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_OPEN_FILES, MAX_OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (MAX_QUEUE_BYTES, MAX_QUEUE_BYTES))
    # When the container runs out of memory the kernel must kill the program, never the runner
    # (that would end the container mid-run). Raising one's own score needs no privilege, but
    # /proc/self of a non-dumpable process belongs to root; exec makes it dumpable anyway.
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    with open("/proc/self/oom_score_adj", "w") as handle:
        handle.write("1000")


def spawn(argv, limits, judge_process, namespace_filter):
    def prepare_child():
        set_child_limits(limits)
        if judge_process:  # the judge's children (the program) get a user and PID namespace of their own
            namespace_filter.enter_judge_namespaces()
        namespace_filter.load()  # last: it denies what made the namespaces

    return subprocess.Popen(
        argv,
        cwd=WORK_DIR,
        env=CHILD_ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own session and process group
        preexec_fn=prepare_child,  # noqa: PLW1509 (the runner has one thread)
    )


class Pump:
    """Feeds stdin, streams capped stdout/stderr to the host and notices the exit of one process.

    Output is never held here: each chunk goes to the host as it is read (`emit`), so the
    runner's memory does not grow with the output limit, which may be far above the memory
    the container leaves the runner."""

    def __init__(self, process, stdin, max_output_bytes, emit):
        self.selector = selectors.DefaultSelector()
        self.streams = {process.stdout: 1, process.stderr: 2}  # as in the host's attach framing
        self.sizes = {process.stdout: 0, process.stderr: 0}
        self.emit = emit
        self.max_output_bytes = max_output_bytes
        self.output_exceeded = False
        self.pending_stdin = memoryview(stdin)
        self.stdin = process.stdin
        # A pidfd becomes readable when the process exits: no polling, no SIGCHLD handler.
        self.pidfd = os.pidfd_open(process.pid)
        self.selector.register(self.pidfd, selectors.EVENT_READ)
        for stream in self.streams:
            self.selector.register(stream, selectors.EVENT_READ)
        if stdin:
            os.set_blocking(process.stdin.fileno(), False)
            self.selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()

    def is_open(self):
        return bool(self.selector.get_map())

    def step(self, timeout):
        """Wait up to `timeout` for I/O; True once the process has exited."""
        exited = False
        for key, _ in self.selector.select(timeout):
            if key.fileobj is self.pidfd:
                self.selector.unregister(self.pidfd)
                os.close(self.pidfd)
                exited = True
            elif key.fileobj is self.stdin:
                self._write_stdin()
            else:
                self._read(key.fileobj)
        return exited

    def _write_stdin(self):
        try:
            written = os.write(self.stdin.fileno(), self.pending_stdin[:READ_CHUNK])
        except BlockingIOError:
            written = 0
        except BrokenPipeError:  # the program stopped reading: the rest of stdin is dropped
            written = len(self.pending_stdin)
        self.pending_stdin = self.pending_stdin[written:]
        if not self.pending_stdin:
            self.selector.unregister(self.stdin)
            self.stdin.close()

    def _read(self, stream):
        chunk = os.read(stream.fileno(), READ_CHUNK)
        if not chunk:
            self.selector.unregister(stream)
            stream.close()
            return
        room = self.max_output_bytes - self.sizes[stream]
        if len(chunk) > room:
            self.output_exceeded = True
        kept = chunk[: max(0, room)]
        if kept:
            self.sizes[stream] += len(kept)
            self.emit(self.streams[stream], kept)

    def close(self):
        for key in list(self.selector.get_map().values()):
            if key.fileobj is self.pidfd:
                os.close(self.pidfd)
            else:
                key.fileobj.close()
        self.selector.close()


def kill_all():
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(argv, stdin, limits, emit, namespace_filter, judge_process=False):
    """Run argv with limits; the runner's own wall clock kills everything at the deadline.
    Output goes to `emit(stream, chunk)` as it is read."""
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    oom_before = oom_kill_count()
    start = time.monotonic()
    try:
        process = spawn(argv, limits, judge_process, namespace_filter)
    except OSError as error:
        return _exec_failure(argv, error, time.monotonic() - start, emit)
    pump = Pump(process, stdin, limits["max_output_bytes"], emit)
    deadline = start + limits["wall_time_s"]
    status, timed_out = None, False
    while pump.is_open():
        now = time.monotonic()
        if status is None and (now >= deadline or pump.output_exceeded):
            timed_out = timed_out or now >= deadline
            kill_all()
        if pump.step(max(0.0, deadline - now)):
            status = os.wait4(process.pid, 0)[1]
            process.returncode = status  # reaped here: Popen must never wait on this pid again
            # The run ends with its program, as a bwrap jail's PID namespace does: whatever it
            # left running (a daemon, or a helper that would exit by itself a moment later, such
            # as multiprocessing's resource tracker) is killed now, so pipes it holds reach EOF.
            kill_everything_else()
    pump.close()
    kill_everything_else()
    wall_time_s = time.monotonic() - start
    # Every process of the run is gone, so nothing can make new IPC objects meanwhile.
    left_ipc_objects = remove_ipc_objects() > 0
    usage_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_time_s = (usage_after.ru_utime - usage_before.ru_utime) + (
        usage_after.ru_stime - usage_before.ru_stime
    )
    # Leftover processes were killed and reaped above, which leaves nothing of them: no reason to
    # recycle the container. What is: a process that survived the kill, files outside the scratch
    # dirs, IPC objects the run left (removed, but they reached past the run's own files).
    survivors = bool(other_processes())
    suspicious = survivors or left_ipc_objects or not _other_writable_dirs_empty()
    return _result(status, pump, limits, wall_time_s, cpu_time_s, timed_out, suspicious, oom_before)


def _result(status, pump, limits, wall_time_s, cpu_time_s, timed_out, suspicious, oom_before):
    code = os.waitstatus_to_exitcode(status)
    exit_code, signal_number = (code, None) if code >= 0 else (None, -code)
    cpu_exceeded = signal_number == signal.SIGXCPU or cpu_time_s > limits["cpu_time_s"]
    memory_exceeded = oom_kill_count() > oom_before
    if signal_number == signal.SIGKILL and not (timed_out or memory_exceeded or pump.output_exceeded):
        # The kernel counts an OOM kill after it sent the SIGKILL, so the victim can be reaped
        # before the count moves: wait for it, briefly, only for a SIGKILL the runner did not send.
        memory_exceeded = _oom_counted_within(oom_before, OOM_COUNT_WAIT_S)
    return {
        "exit_code": exit_code,
        "signal": signal_number,
        "wall_time_s": wall_time_s,
        "cpu_time_s": cpu_time_s,
        "timed_out": timed_out or cpu_exceeded,
        "memory_exceeded": memory_exceeded,
        "output_exceeded": pump.output_exceeded or _scratch_full(limits["max_file_size_mb"] << 20),
        "suspicious": suspicious,
    }


def _exec_failure(argv, error, wall_time_s, emit):
    emit(2, f"cannot execute {argv[0]!r}: {error.strerror}\n".encode())
    return {
        "exit_code": 127,
        "signal": None,
        "wall_time_s": wall_time_s,
        "cpu_time_s": 0.0,
        "timed_out": False,
        "memory_exceeded": False,
        "output_exceeded": False,
        "suspicious": False,
    }


def _scratch_full(max_file_size):
    """Whether the program hit the file size limit or filled a scratch tmpfs: output it could
    not write (most runtimes ignore SIGXFSZ and see EFBIG/ENOSPC as an ordinary error)."""
    for directory in SCRATCH_DIRS:
        usage = os.statvfs(directory)
        if usage.f_bavail == 0 or usage.f_favail == 0:  # out of space or out of inodes
            return True
        if any(size >= max_file_size for size in file_sizes(directory)):
            return True
    return False


def _directory_entries(directory_fd):
    """(subdirectory names, [(file name, size)]) of one directory; nothing is followed."""
    subdirectories, files = [], []
    with os.scandir(directory_fd) as entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirectories.append(entry.name)
                else:
                    files.append((entry.name, entry.stat(follow_symlinks=False).st_size))
            except OSError:
                continue
    return subdirectories, files


def walk_tree(path, on_files, on_leave=None):
    """Visit a tree of any depth iteratively, through directory fds (a program may build trees
    deeper than Python's stack or PATH_MAX): on_files(fd, files) per directory, and
    on_leave(parent_fd, name) after a subdirectory's contents were visited. Unreadable
    directories are made readable (the runner owns everything under the scratch dirs).
    The same walk as sandbox/backends/tree.py, which this file cannot import."""
    fd = os.open(path, DIRECTORY_FLAGS)
    names, pending = [], []
    try:
        subdirectories, files = _directory_entries(fd)
        on_files(fd, files)
        pending.append(subdirectories)
        while True:
            if pending[-1]:
                name = pending[-1].pop()
                try:
                    os.chmod(name, 0o700, dir_fd=fd)
                    child = os.open(name, DIRECTORY_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                os.close(fd)
                fd = child
                names.append(name)
                subdirectories, files = _directory_entries(fd)
                on_files(fd, files)
                pending.append(subdirectories)
                continue
            pending.pop()
            if not names:
                return
            parent = os.open("..", DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            name = names.pop()
            if on_leave is not None:
                on_leave(fd, name)
    finally:
        os.close(fd)


def file_sizes(directory):
    sizes = []
    walk_tree(directory, lambda _, files: sizes.extend(size for _, size in files))
    return sizes


def empty_tree(directory):
    """Remove everything under directory (not directory itself)."""

    def unlink_files(fd, files):
        for name, _ in files:
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass

    def remove_directory(parent_fd, name):
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except OSError:
            pass  # still listed: reset() reports the container unclean and it is recycled

    walk_tree(directory, unlink_files, remove_directory)


def _other_writable_dirs_empty():
    return all(not os.path.isdir(path) or not os.listdir(path) for path in OTHER_WRITABLE_DIRS)


def write_files(files):
    """Write each file at its path under /work, replacing whatever a program left there.

    The program ran as the runner's uid and may have put a directory, a symlink or an
    unreadable directory where a judge file or one of its parents belongs. No program process
    is alive between runs, so what is checked here cannot change before it is written."""
    os.chmod(WORK_DIR, 0o700)  # the program may have taken away our access to /work itself
    for relative, encoded in files.items():
        parent = WORK_DIR
        for part in relative.split("/")[:-1]:
            parent = os.path.join(parent, part)
            _make_real_directory(parent)
        path = os.path.join(WORK_DIR, relative)
        remove_path(path)
        # O_NOFOLLOW|O_EXCL: never write through a link, never into something already there.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(os.open(path, flags, 0o666), "wb") as handle:
            handle.write(base64.b64decode(encoded))


def _make_real_directory(path):
    """A writable directory (not a link to one) at path, replacing anything else there."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.chmod(path, 0o700)
            return
    except FileNotFoundError:
        pass
    remove_path(path)
    os.mkdir(path, 0o700)


def remove_path(path):
    """Remove a file, a symlink (never what it points to) or a whole directory tree at path."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):  # lstat: a symlink to a directory is not a directory here
        os.chmod(path, 0o700)  # jailed code may chmod its directories to 000
        empty_tree(path)
        os.rmdir(path)
    else:
        os.unlink(path)


def reset():
    """Kill every process and empty the scratch dirs; `clean` says whether that fully worked."""
    kill_everything_else()
    for directory in SCRATCH_DIRS:
        os.chmod(directory, SCRATCH_DIR_MODES[directory])
        for name in os.listdir(directory):
            try:
                remove_path(os.path.join(directory, name))
            except OSError:
                pass
    remove_ipc_objects()
    clean = all(not os.listdir(directory) for directory in SCRATCH_DIRS)
    return clean and _other_writable_dirs_empty() and not ipc_objects_left() and not other_processes()


def handle(request, responses, namespace_filter):
    operation = request["op"]
    if operation == "ping":
        return {"ok": True}
    if operation == "write":
        write_files(request["files"])
        return {"ok": True}
    if operation == "run":
        stdin = base64.b64decode(request["stdin"])

        def emit(stream, chunk):
            write_message(responses, {"output": stream, "data": base64.b64encode(chunk).decode()})

        judge_process = request.get("judge_process", False)
        result = run(request["argv"], stdin, request["limits"], emit, namespace_filter, judge_process)
        return {"ok": True, "result": result}
    if operation == "reset":
        return {"ok": True, "clean": reset()}
    return {"ok": False, "error": f"unknown operation {operation!r}"}


def main():
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # PID 1 ignores signals without a handler; drop Python's SIGINT handler so that holds.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.umask(0o077)
    if len(sys.argv) != 2:
        raise SystemExit("runner: pass the namespace filter's BPF, base64-encoded, as the only argument")
    namespace_filter = NamespaceFilter(base64.b64decode(sys.argv[1]))
    requests, responses = sys.stdin.buffer, sys.stdout.buffer
    while (request := read_message(requests)) is not None:
        try:
            response = handle(request, responses, namespace_filter)
        except Exception as error:  # noqa: BLE001 (reported to the host, which recycles the container)
            response = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        write_message(responses, response)


if __name__ == "__main__":
    main()
