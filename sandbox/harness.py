"""The in-jail judge process for call and assert tests (copied into the jail; stdlib only).

Run as `python3 -I -B /work/_harness.py call|assert`. Stage: inside the jail, trusted: the
host writes this file, sandbox/plain_data.py and the test afresh before every run, while no
process of the program is alive.

The program never runs in this process. It runs in a child (sandbox/program_server.py) that
answers calls of its functions over two pipes, one JSON line per call; the dataset's test code
(trusted) runs here, against proxies of those functions, so every value it compares is plain
data this process decoded itself. The backend starts this process out of the program's reach:
either as its PID namespace's init (bwrap), which no process of the namespace can kill, stop
or signal, or with the program as the init of a PID namespace of its own (Docker), from which
this process cannot even be seen. It makes itself non-dumpable (no ptrace, no /proc/<pid>/mem
or fd access for same-uid code; the seccomp filter denies ptrace and process_vm_* besides), and
the program holds none of its file descriptors but the two call pipes. When the test is over,
every process of the program is killed, and only then is "\\n<marker> <report JSON>\\n" printed,
with a per-run marker read from stdin that the program never sees.

What an assert test sees of the program: the test code runs in a namespace of its own, never the
program's module globals, holding `__name__`, the judge's `__builtins__` and one proxy per name
the test code reads as a global (per `symtable`, in any of its scopes) and binds nowhere at module
level itself, when the program defines a callable of that name. So HumanEval's `check(entry_point)`
gets the entry point, an MBPP assert gets the functions it calls, and HumanEval/32's `poly` or 38's
`encode_cyclic` (helpers of the prompt that the test calls) get theirs. Never exposed: a name of
`builtins` (a program's `abs`, `range`, `set` or `len` is not the test's), a dunder name, a name
the test binds itself (its `check`, its imports such as `math`; `candidate`, a parameter, is never
a global), and anything but a function: a program's constants and modules never become the
test's. A task whose function is named like a builtin cannot be judged by an assert test (the
builtin wins); use a call test, which calls the request's entry point by name. The program
server's listing is the program's claim, not a source of names: only the test code decides.
"""

import builtins
import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import symtable
import sys
import types

MARKER_LENGTH = 32
PR_SET_DUMPABLE = 4
WORK_DIR = os.getcwd()  # the jail's /work (the session dir on the unsafe-local backend)
STATUS_FD_ENV = "SANDBOX_STATUS_FD"  # where a judge running as init reports the program's wait status
MODULE_NAMES = {"call": "solution", "assert": "__main__"}
BUILTIN_NAMES = frozenset(vars(builtins))  # the judge's own, read before any test code runs


class ProgramEnded(BaseException):
    """The program exited, died or answered nonsense: not an exception test code may catch."""


class NotPlainReturn(BaseException):
    """The program returned something other than plain data."""


class ProgramRaised(Exception):
    """The program raised an exception that is not a builtin one."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _load_codec() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("_plain_data", os.path.join(WORK_DIR, "_plain_data.py"))
    codec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(codec)
    return codec


def _read_marker() -> bytes:
    marker = b""
    while len(marker) < MARKER_LENGTH:
        chunk = os.read(0, MARKER_LENGTH - len(marker))
        if not chunk:
            raise SystemExit("harness: no marker on stdin")
        marker += chunk
    return marker


def _program_cannot_reach_us() -> bool:
    """As the init, or with children in another PID namespace, no child can signal this process."""
    if os.getpid() == 1:
        return True
    try:
        return os.readlink("/proc/self/ns/pid") != os.readlink("/proc/self/ns/pid_for_children")
    except FileNotFoundError:  # unshared: the kernel makes the namespace with our first child
        return True


class Program:
    """The program's process and the two pipes of its call protocol."""

    def __init__(self, mode: str, codec: types.ModuleType) -> None:
        self.codec = codec
        request_read, self.request_fd = os.pipe()  # pipes are close-on-exec; only two ends are passed on
        self.answer_file_read, answer_write = os.pipe()
        for fd in (request_read, answer_write):
            os.set_inheritable(fd, True)
        argv = [sys.executable, "-I", "-B", f"{WORK_DIR}/_program.py", MODULE_NAMES[mode]]
        environment = {key: value for key, value in os.environ.items() if key != STATUS_FD_ENV}
        self.pid = os.posix_spawn(
            sys.executable,
            [*argv, str(request_read), str(answer_write)],
            environment,
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)],
            setsid=True,  # a process group and session of its own: kill(0, ...) cannot reach us
        )
        os.close(request_read)
        os.close(answer_write)
        self.answers = os.fdopen(self.answer_file_read, "rb")
        self.wait_status: int | None = None

    def receive(self) -> dict:
        line = self.answers.readline(self.codec.MAX_TEXT_CHARS + 1)
        if not line:
            raise ProgramEnded("the program ended before the test completed")
        try:
            return self.codec.loads_line(line)
        except ValueError as error:
            raise ProgramEnded(f"the program's answer is unreadable: {error}") from None

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        try:
            request = {
                "function": name,
                "args": self.codec.encode(list(args)),
                "kwargs": self.codec.encode(kwargs),
            }
        except self.codec.NotPlainData as error:
            raise TypeError(f"only plain data can be passed to the program's {name}(): {error}") from None
        data = self.codec.dumps_line(request)
        try:
            while data:
                data = data[os.write(self.request_fd, data) :]
        except BrokenPipeError:
            raise ProgramEnded("the program ended before the test completed") from None
        return self._value_of(self.receive())

    def _value_of(self, answer: dict) -> object:
        if "value" in answer:
            try:
                return self.codec.decode(answer["value"])
            except (ValueError, TypeError) as error:
                raise ProgramEnded(f"the program's answer is unreadable: {error}") from None
        if "not_plain" in answer:
            raise NotPlainReturn(str(answer["not_plain"]))
        if "raised" in answer:
            name, message = str(answer["raised"]), str(answer.get("message", ""))
            builtin = getattr(builtins, name, None)
            if isinstance(builtin, type) and issubclass(builtin, Exception):
                raise builtin(message)  # tests may expect a ValueError; the class is ours, not the program's
            raise ProgramRaised(name, message)
        raise ProgramEnded(str(answer.get("exited", "the program answered out of protocol")))

    def function(self, name: str):
        def proxy(*args: object, **kwargs: object) -> object:
            return self.call(name, args, kwargs)

        proxy.__name__ = proxy.__qualname__ = name
        return proxy

    def end(self) -> None:
        """Kill every process of the program and reap them; as init, reap every orphan too.

        `wait_status` is the program's own wait status if it ended by itself, else 0: it was
        still answering calls when the judge was done with it.
        """
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        self.wait_status = status if pid == self.pid else 0
        if os.getpid() != 1:  # the program is its namespace's init: the namespace dies with it
            if pid != self.pid:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            return
        while True:  # the init's kill(-1) spares only itself
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return


def names_from_the_program(test_code: str) -> set[str]:
    """The names the test code reads as globals but never binds at module level: the program's to give.

    Builtins and dunder names are never among them, whatever the program defines.
    """
    top = symtable.symtable(test_code, "test.py", "exec")
    read, bound, tables = set(), set(), [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in table.get_symbols():
            if table is not top and not symbol.is_global():
                continue  # a local, a parameter (`candidate`) or a closure's variable
            if symbol.is_referenced():
                read.add(symbol.get_name())
            # Bound here: `def`, `class`, `import`, `=`, `for`, `with ... as`, `global x; x = ...`.
            if symbol.is_assigned() or symbol.is_imported():
                bound.add(symbol.get_name())
    return {name for name in read - bound - BUILTIN_NAMES if not name.startswith("__")}


def _namespace(program: Program, listed: dict, wanted: set[str]) -> dict:
    """The test's globals: a proxy for each name it wants that the program listed as a function."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    for name in sorted(wanted):
        if listed.get(name) == "function":
            namespace[name] = program.function(name)
    return namespace


def _run_test(mode: str, program: Program, test: dict) -> dict:
    ready = program.receive()
    if "ready" not in ready:
        program._value_of(ready)  # raises what the program's start-up raised
    names = ready["ready"] if isinstance(ready["ready"], dict) else {}
    if mode == "assert":
        code = compile(test["code"], "test.py", "exec")
        namespace = _namespace(program, names, names_from_the_program(test["code"]))
        exec(code, namespace)  # noqa: S102 - trusted test code
        return {"status": "ok"}
    entry_point = test["entry_point"]
    if names.get(entry_point) != "function":
        return {"status": "error", "exception": "NameError", "message": f"no function {entry_point!r}"}
    value = program.call(entry_point, test["args"], test["kwargs"])
    try:
        return {"status": "ok", "value": json.dumps(value)}
    except (TypeError, ValueError) as error:
        return {"status": "unserialisable", "message": f"{type(value).__name__}: {error}"[:500]}


def _report(mode: str, program: Program, test: dict) -> dict:
    try:
        return _run_test(mode, program, test)
    except AssertionError as error:
        return {"status": "assertion_failed", "message": str(error)[:500]}
    except NotPlainReturn as error:
        return {"status": "not_plain", "message": str(error)[:500]}
    except ProgramEnded as error:
        return {"status": "exited", "message": str(error)[:500]}
    except ProgramRaised as error:
        return {"status": "error", "exception": error.name, "message": str(error)[:500]}
    except Exception as error:  # noqa: BLE001 - raised by the program's function or by the test itself
        return {"status": "error", "exception": type(error).__name__, "message": str(error)[:500]}


def main() -> None:
    mode = sys.argv[1]
    if ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SystemExit("harness: prctl failed")
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # an init ignores every signal it has no handler for
    status_fd = int(os.environ.get(STATUS_FD_ENV, "-1"))
    if status_fd >= 0:
        os.set_inheritable(status_fd, False)
    marker = _read_marker()
    if not _program_cannot_reach_us():  # a backend's fault: reported, and no program runs
        os.write(1, b"\n" + marker + b' {"status": "unprotected"}\n')
        return
    codec = _load_codec()
    # Read every input before the program runs: it may rewrite any file in /work.
    with open(os.path.join(WORK_DIR, "_test.json"), encoding="utf-8") as test_file:
        test = json.load(test_file)
    program = Program(mode, codec)
    try:
        report = _report(mode, program, test)
    finally:
        program.end()
    if status_fd >= 0:  # as the jail's init we report the program's real wait status, as our C init does
        os.write(status_fd, b"%d\n" % program.wait_status)
    report["wait_status"] = program.wait_status
    sys.stdout.flush()  # what the test code printed comes before the report
    data = b"\n" + marker + b" " + json.dumps(report).encode() + b"\n"
    while data:
        data = data[os.write(1, data) :]


if __name__ == "__main__":
    main()
