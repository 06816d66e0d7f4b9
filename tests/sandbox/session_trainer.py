"""A stand-in trainer for the session leak tests: episodes on the loop's shared session pool.

    python tests/sandbox/session_trainer.py BACKEND WORK_ROOT MODE NUM_EPISODES

Every episode opens a session, leaves files and a background process in it, and closes it in
`finally`; every fifth raises mid-episode (an injected crash, caught as the agent loop catches
an env error). MODE "finish" ends normally; "crash" raises out of the run after NUM_EPISODES;
"wait" prints READY after NUM_EPISODES and keeps running episodes until the test sends SIGINT or
SIGKILL. Not a test module itself.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys

from sandbox.sessions import SessionPoolSettings, shared_session_pool

SESSION_UID_BASE = 63450
MAX_SESSIONS = 4


def pool_settings(backend: str, work_root: str) -> SessionPoolSettings:
    return SessionPoolSettings(
        backend=backend, num_warm=2, max_sessions=MAX_SESSIONS, max_starting=2,
        uid_base=SESSION_UID_BASE, work_root=work_root if backend == "bwrap" else None,
    )  # fmt: skip


def _print_tasks() -> None:
    """The stacks of every task (a test that waited too long asks for them with SIGUSR2)."""
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


class InjectedCrash(Exception):
    pass


async def episode(settings: SessionPoolSettings, index: int) -> None:
    pool = await shared_session_pool(settings)
    session = await pool.acquire()
    try:
        await session.write_file("state.txt", f"episode {index}\n".encode())
        await session.exec("sleep 300 & echo $! > pid.txt; cat state.txt")
        if index % 5 == 4:
            raise InjectedCrash(f"episode {index}")
        await session.exec("wc -c state.txt")
    finally:
        await session.close()


async def main(backend: str, work_root: str, mode: str, num_episodes: int) -> None:
    settings = pool_settings(backend, work_root)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _print_tasks)
    index = 0
    while True:
        # Two episodes at once, as a group of rollouts runs them.
        results = await asyncio.gather(
            episode(settings, index), episode(settings, index + 1), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, InjectedCrash):
                raise result
        index += 2
        if index == num_episodes:
            if mode == "finish":
                return
            if mode == "crash":
                raise RuntimeError("injected crash of the whole run")
            print("READY", flush=True)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # a test that waits too long asks for the stacks
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
