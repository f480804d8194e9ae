"""Run a test's body in a forked child of the test process, so what it starts ends with it.

Some of torch's settings start helpers that live as long as the process that set them:
with the ``file_system`` sharing strategy the first shared tensor starts a
``torch_shm_manager`` (a child process) and keeps a connection to it. Set in the pytest
process, they would outlive the test and show up among its children in later tests.
A forked child costs no imports; its body's assertions and errors come back as an
``AssertionError`` with the child's traceback.

Example:
    >>> def _double(x):  # module level in a real test
    ...     return 2 * x
    >>> run_forked(_double, 21)
    42
"""

from __future__ import annotations

import queue
import traceback
from collections.abc import Callable
from typing import Any

from odb._process.forking import checked_fork_context


def run_forked(fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> Any:
    """``fn(*args)`` in a forked child; its return value (picklable), or its error raised.

    Raises:
        AssertionError: ``fn`` raised (the message holds the child's traceback), or the
            child reported nothing within ``timeout_s`` (it is killed).
    """
    ctx = checked_fork_context()
    results = ctx.Queue()
    child = ctx.Process(target=_report, args=(results, fn, args), name="forked-test-body")
    child.start()
    try:
        status, value = results.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(
            f"the forked child running {fn.__name__} reported nothing within {timeout_s} s "
            f"(exit code {child.exitcode}); killed"
        ) from None
    finally:
        child.join(10.0)
        if child.is_alive():
            child.kill()
            child.join()
    if status == "error":
        raise AssertionError(f"{fn.__name__} failed in a forked child:\n{value}")
    return value


def _report(results: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        results.put(("ok", fn(*args)))
    except BaseException:  # noqa: BLE001 - reported to the test process
        results.put(("error", traceback.format_exc()))
