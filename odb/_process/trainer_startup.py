"""Starting a spawned collate process safely: the main-guard check and the handshake.

A forked collate process (the default on Linux, ``ODBConfig.collate_start``) needs neither. With
``spawn`` (or ``forkserver``) the new interpreter re-imports the script that started the
trainer, which re-runs its top-level code; in a script without an ``if __name__ ==
"__main__":`` guard that code builds the process group and the loader again, blocks in
its first collective, and never lets the collate process start: the trainer waited
forever. :func:`unguarded_main_line` finds that case before anything is spawned, from
the script's syntax tree and the line now running, so the loader fails at once with a
message naming the guard.

Every other way a spawned collate process can fail to come up (its interpreter or
imports stuck, the dataset's unpickling hanging) is covered by the handshake: the
user's collate spec travels *after* the process has started, over a pipe written by a helper
thread (:class:`JobSender`, which later sends the epochs' jobs on the same pipe), and
the process confirms it holds it; no confirmation within ``start_timeout_s`` is an
error.
"""

from __future__ import annotations

import ast
import functools
import inspect
import pickle
import queue
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from types import FrameType
from typing import Any


def unguarded_main_line() -> str | None:
    """``"path:line"`` when the running script's current top-level statement is unguarded.

    That statement (the one that, through any calls, is building or iterating the
    loader) would run again in a spawned process. None when it sits under an
    ``if __name__ == "__main__":`` block, or when there is no script file to re-import
    (``python -c``, an interactive session, a notebook).
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    frame = _main_module_frame(path)
    if frame is None:
        return None
    guarded = _guarded_lines(path)
    if guarded is None or frame.f_lineno in guarded:
        return None
    return f"{path}:{frame.f_lineno}"


def _main_module_frame(path: str) -> FrameType | None:
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_code.co_filename == path:
            return frame
        frame = frame.f_back
    return None


@functools.lru_cache(maxsize=8)
def _guarded_lines(path: str) -> frozenset[int] | None:
    """Lines of ``path`` inside a top-level ``if __name__ == "__main__":``; None if unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    lines: set[int] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return frozenset(lines)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, looking into ``try``/``with`` blocks that wrap them."""
    for node in body:
        yield node
        if isinstance(node, (ast.Try, ast.With)):
            yield from _top_level(node.body)


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = {_name_or_str(test.left), _name_or_str(test.comparators[0])}
    return isinstance(test.ops[0], ast.Eq) and sides == {"name:__name__", "str:__main__"}


def _name_or_str(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return f"name:{node.id}"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return f"str:{node.value}"
    return ""


def main_guard_error(where: str, mode_field: str = "collate_mode") -> RuntimeError:
    """The error for an unguarded script: what happens, and the two ways out."""
    return RuntimeError(
        f"{mode_field}='process' here starts the collate process with the 'spawn' method, which "
        f"re-runs the top-level code of your script in the new process; {where} is not "
        'under an `if __name__ == "__main__":` guard, so there it would build the loader '
        "(and the process group) again and block, and the loader would hang. Put the "
        'training code under `if __name__ == "__main__":` (e.g. call a main() function '
        f"there), or use {mode_field}='thread' (no extra process), or fork the collate process "
        "(collate_start_method='fork', Linux)"
    )


def check_startable(spec: Any, config: Any) -> None:
    """Raise now, before any collective, what would keep a collate process from starting.

    With a spawned collate process (``config.collate_start``): an unguarded script (see
    above). With a spawned collate process or spawned workers: a user's collate spec
    (``spec``) that cannot be pickled. A forked process and forked workers need neither.
    """
    spawned = config.collate_start != "fork"
    if spawned:
        unguarded = unguarded_main_line()
        if unguarded is not None:
            raise main_guard_error(unguarded)
    workers_spawned = config.num_workers > 0 and config.worker_start_method not in (None, "fork")
    if not (spawned or workers_spawned):
        return
    try:
        pickle.dumps(spec)
    except Exception as exc:
        how = (
            f"collate_start_method={config.collate_start!r} sends"
            if spawned
            else f"worker_start_method={config.worker_start_method!r} sends"
        )
        raise TypeError(
            f"collate_mode='process' with {how} the dataset, collate_fn and length_fn to "
            f"a new interpreter, but they cannot be pickled ({exc}). Use module-level "
            "functions instead of lambdas/closures, fork (collate_start_method='fork' "
            "and worker_start_method=None, on Linux), or collate_mode='thread'"
        ) from exc


class JobSender:
    """Sends a collate process its messages (the boot, then one job per epoch), in order.

    Each payload is pickled by the caller's thread (a pickling error is the caller's) and
    written by one daemon thread: a process that never reads (stuck starting) cannot
    block the trainer, and the writes fail once the process is gone. :meth:`close`
    closes the pipe after the messages already queued, which the process reads as the
    end of its jobs.
    """

    def __init__(self, connection: Connection) -> None:
        self._pending: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._write, args=(connection,), name="odb-collate-jobs", daemon=True
        )
        self._thread.start()

    def send(self, payload: Any) -> None:
        self._pending.put(bytes(ForkingPickler.dumps(payload)))

    def close(self) -> None:
        self._pending.put(None)

    def _write(self, connection: Connection) -> None:
        try:
            while (data := self._pending.get()) is not None:
                connection.send_bytes(data)
        except OSError:
            pass  # the process died or was stopped; the trainer reports that
        finally:
            connection.close()
