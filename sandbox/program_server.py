"""The program's side of the jail's judge boundary (copied into the jail as _program.py; stdlib only).

Run as `python3 -I -B /work/_program.py MODULE REQUEST_FD ANSWER_FD` by the judge process
(sandbox/harness.py). Stage: inside the jail, untrusted: this file runs the user's program and
then answers the judge's calls of its functions, one JSON line per call, so nothing but plain
data (sandbox/plain_data.py) ever reaches the judge. Everything here can be replaced by the
program once it runs; the judge trusts none of it and checks every answer.

Answers: {"ready": {name: "function"}} once the program has run, naming its top-level callables,
then per call {"value": data}, {"raised": name, "message": text}, {"not_plain": text} or
{"exited": text}. The listing is only the program's claim: the judge calls a listed function only
when the test code reads its name as a global and does not define it itself, never for a name of
`builtins` or a dunder name, and it never takes a program's constants or modules (see the rule in
sandbox/harness.py).
"""

import contextlib
import importlib.util
import os
import sys
import traceback
import types

WORK_DIR = os.getcwd()  # the jail's /work (the session dir on the unsafe-local backend)
MESSAGE_LIMIT = 500


def _load_codec() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("_plain_data", os.path.join(WORK_DIR, "_plain_data.py"))
    codec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(codec)
    return codec


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the program may have closed or replaced them
            stream.flush()


def _run_program(module_name: str) -> dict:
    """Run main.py as module `module_name`, registered in sys.modules as a script's module would be."""
    path = os.path.join(WORK_DIR, "main.py")
    with open(path, encoding="utf-8") as source_file:
        code = compile(source_file.read(), path, "exec")
    module = types.ModuleType(module_name)
    module.__file__ = path
    sys.modules[module_name] = module
    exec(code, module.__dict__)  # noqa: S102 - running the program is this file's purpose
    return module.__dict__


def _failure(error: BaseException) -> dict:
    if isinstance(error, SystemExit):
        return {"exited": f"exit({error.code!r}) before the test completed"[:MESSAGE_LIMIT]}
    traceback.print_exc()
    return {"raised": type(error).__name__, "message": str(error)[:MESSAGE_LIMIT]}


def _names(namespace: dict) -> dict:
    """The program's top-level callables (functions, classes, ...), by name."""
    return {
        name: "function"
        for name, value in list(namespace.items())
        if not name.startswith("__") and callable(value)
    }


def _answer(call: dict, namespace: dict, codec: types.ModuleType) -> dict:
    function = namespace.get(call["function"])
    try:
        value = function(*codec.decode(call["args"]), **codec.decode(call["kwargs"]))
    except BaseException as error:  # noqa: BLE001 - any exception of the program is its answer
        return _failure(error)
    try:
        return {"value": codec.encode(value)}
    except codec.NotPlainData as error:
        return {"not_plain": f"{type(value).__name__}: {error}"[:MESSAGE_LIMIT]}


def main() -> None:
    module_name, request_fd, answer_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    codec = _load_codec()
    requests = os.fdopen(request_fd, "rb")

    def send(message: dict) -> None:
        _flush_streams()  # the program's output comes before the answer that follows it
        data = codec.dumps_line(message)
        while data:
            data = data[os.write(answer_fd, data) :]

    try:
        namespace = _run_program(module_name)
    except BaseException as error:  # noqa: BLE001
        send(_failure(error))
        return
    send({"ready": _names(namespace)})
    while line := requests.readline(codec.MAX_TEXT_CHARS + 1):
        answer = _answer(codec.loads_line(line), namespace, codec)
        send(answer)
        if "exited" in answer:
            return


if __name__ == "__main__":
    main()
