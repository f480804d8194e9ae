"""This process's threads by the names the kernel holds for them (``/proc/self/task``).

A native thread (Gloo's, a TCPStore's) names itself with ``pthread_setname_np`` once it
first runs; until then it carries the process's name.
"""

from __future__ import annotations

import os


def thread_names() -> dict[int, str]:
    """This process's threads: ``{thread id: name}`` (``/proc/self/task/*/comm``).

    A thread that ends while listed is left out.
    """
    names = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names[int(task)] = comm.read().strip()
        except OSError:  # the thread ended while listed: ENOENT, or ESRCH while it exits
            continue
    return names
