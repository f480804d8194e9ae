"""Let Gloo's worker threads finish with the GIL before the interpreter finalizes.

Every Gloo collective that torch runs on a tensor Python made ends, on the process
group's worker thread (``pt_gloo_runloop``), with that thread dropping its reference to
the tensor; since the tensor's Python object is then released, the thread takes the
GIL (``TensorImpl::decref_pyobject``), *after* the caller's ``wait()`` has returned. If
the main thread reaches interpreter finalization first (a process that exits right
after its last collective: a checkpoint's ``all_gather_object``, a Trainer's loss
gather), CPython before 3.14 ends a thread that asks for the GIL with ``pthread_exit``;
its forced unwind crosses the tensor's ``noexcept`` destructor and the C++ runtime
aborts the process: "terminate called without an active exception", SIGABRT, after a
run that finished. A process group still referenced (a ``DistributedDataParallel``
model's reducer holds the default group even after ``destroy_process_group``) keeps its
threads until then.

:func:`hand_over_gil`, the exit hook's last step, releases the GIL in short sleeps
until no Gloo thread of this process is running or runnable on two checks in a row, so
a worker thread that still has a reference to drop gets the GIL while Python can still
give it. It cannot finish a collective still in flight (a peer that has not joined).
"""

from __future__ import annotations

import os
import time

GLOO_THREADS = frozenset({"pt_gloo_runloop", "gloo_tcp_loop"})
STEP_S = 0.005  # each sleep releases the GIL for this long
QUIET_CHECKS = 2  # checks in a row with no Gloo thread runnable
LIMIT_S = 0.5  # a thread busy that long is in a collective, not releasing a reference


def gloo_thread_states() -> list[str]:
    """The scheduler state (``R``, ``S``, ...) of each Gloo thread of this process.

    Read from ``/proc/self/task/*/stat``; a thread that ends while being read is skipped.
    Empty without ``/proc`` or without Gloo threads.
    """
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    states = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as stat_file:
                stat = stat_file.read()
        except OSError:  # the thread ended meanwhile
            continue
        name_end = stat.rindex(")")
        if stat[stat.index("(") + 1 : name_end] in GLOO_THREADS:
            states.append(stat[name_end + 2])
    return states


def hand_over_gil(limit_s: float = LIMIT_S) -> int:
    """Release the GIL until no Gloo thread runs; returns the sleeps it took (0: none).

    Returns at once when this process has no Gloo thread; else after
    :data:`QUIET_CHECKS` checks in a row, each after a sleep of :data:`STEP_S`, that find
    none running or runnable (state ``R``), or after ``limit_s``.
    """
    if not gloo_thread_states():
        return 0
    sleeps, quiet = 0, 0
    deadline = time.monotonic() + limit_s
    while quiet < QUIET_CHECKS and time.monotonic() < deadline:
        time.sleep(STEP_S)
        sleeps += 1
        quiet = quiet + 1 if "R" not in gloo_thread_states() else 0
    return sleeps
