"""What a test's own processes leave in ``/dev/shm``, told apart from everyone else's.

``/dev/shm`` is the machine's: other programs, other test sessions and the tests' own
earlier processes create and remove entries there at any time. A leak check that
compares the whole directory before and after a test fails when some other process
leaves an entry meanwhile, and passes when an entry of the test's happens to be held
by a stranger. :class:`ShmAudit` counts only what the test's processes could have made:

- names of the kinds they make (:data:`OWN_KINDS`): torch's shared storages
  ``torch_<pid>_...`` (both sharing strategies; ``odb._process.diagnostics`` removes the
  half-made ones of a killed process), multiprocessing's semaphores ``sem.mp-...`` and
  its heap arenas ``pym-<pid>-...``, ``multiprocessing.shared_memory``'s ``psm_...``;
- created after the audit started (absent from its first listing), by this user;
- for the kinds whose name carries the creating process's id (torch's, the arenas'):
  made by a process of the test, i.e. the test process or one of its descendants, a
  process the audit is told to adopt (``adopted``: the pool's ranks, detached so that
  they are no descendants), or a member of a process group one of them leads (the
  children a killed rank leaves behind keep its group). Processes end before the
  check, so a thread records them as they come: every ``period_s`` and on
  :meth:`ShmAudit.sample`. A process that lives shorter than the period is missed;
  every process these tests start (a spawned rank, a forked collate process or
  DataLoader worker) lives far longer before it shares anything;
- not held (mapped or open) by any live process when checked, for ``settle_s`` at most:
  the resource tracker of a killed process unlinks its semaphores a moment later.

A semaphore or ``psm_`` block names no process; one that another process of this user
creates during the test and abandons, unheld for ``settle_s``, is counted. That is a
leak on the machine too, and it is rare: the tests' own ``sem.`` names come from spawn
and forkserver contexts, which unlink them when the last user lets go.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

SHM_DIR = "/dev/shm"
# Name patterns of what the tests' processes make; group 1 is the creator's pid.
OWN_KINDS = (
    re.compile(r"torch_(\d+)_"),
    re.compile(r"pym-(\d+)-"),
    re.compile(r"sem\.mp-()"),
    re.compile(r"psm_()"),
)


def shm_entries() -> set[str]:
    """Names in ``/dev/shm`` (POSIX semaphores ``sem.*``, shared-memory segments)."""
    return set(os.listdir(SHM_DIR)) if os.path.isdir(SHM_DIR) else set()


def held_shm(pids: Iterable[int] | None = None) -> set[str]:
    """``/dev/shm`` names that processes ``pids`` (default: all) map or hold open.

    Two ways a name is held: by the path a mapping or descriptor shows, and by inode.
    The inode is what finds a POSIX semaphore: ``sem_open`` maps a temporary file and
    then links it to its name, so a process holding ``sem.mp-x`` shows
    ``/dev/shm/sem.<random> (deleted)`` in its maps, never ``sem.mp-x``.

    A descriptor closed between the listing of ``/proc/<pid>/fd`` and its read is
    skipped alone, not the process's others: the test process itself opens and closes
    files all the time (the recorder thread reads ``/proc``), and skipping the rest of
    its descriptors then missed a segment it held (a false leak under load).
    """
    held: set[str] = set()
    inodes: set[int] = set()
    prefix = SHM_DIR + "/"
    pids = _all_pids() if pids is None else pids
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    at = line.find(prefix)
                    if at >= 0:
                        held.add(line[at + len(prefix) :].split()[0])
                        inodes.add(int(line.split()[4]))
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # the process ended, or is not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    held.add(target[len(prefix) :].split()[0])
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
            except OSError:  # closed since the listing
                continue
    return held | {name for name in shm_entries() if _inode(name) in inodes}


def mapped_file(address: int) -> str:
    """The file this process maps at ``address``, as ``/proc/self/maps`` names it
    (``""`` for an anonymous mapping); AssertionError if nothing is mapped there."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"nothing mapped at {address:#x}")


def _inode(name: str) -> int | None:
    try:
        return os.stat(os.path.join(SHM_DIR, name)).st_ino
    except FileNotFoundError:
        return None


def creator(name: str) -> int | None:
    """The pid a ``/dev/shm`` name of :data:`OWN_KINDS` carries; 0 if it names none;
    None if the name is of another kind (no process of a test makes it)."""
    for kind in OWN_KINDS:
        match = kind.match(name)
        if match:
            return int(match.group(1) or 0)
    return None


class ShmAudit:
    """Records the test's processes from its start; :meth:`leaked` names their leaks.

    Start it before the test's processes start, call :meth:`leaked` once they are gone,
    and close it (a context manager does).

    Example:
        >>> import subprocess
        >>> with ShmAudit() as shm:
        ...     ran = subprocess.run(["true"])  # the test's processes, ended
        ...     shm.leaked()
        []
    """

    def __init__(
        self, period_s: float = 0.05, adopted: Callable[[], Iterable[int]] | None = None
    ) -> None:
        self.before = shm_entries()
        self.uid = os.getuid()
        self.root = os.getpid()
        self.period_s = period_s
        self.adopted = adopted if adopted is not None else tuple
        self.seen: set[int] = {self.root}  # every process of the test ever recorded
        self.roles: dict[int, str] = {}  # what each was when last recorded: command, parent
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="shm-audit", daemon=True)
        self._thread.start()

    def __enter__(self) -> ShmAudit:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop recording processes."""
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No recording meanwhile: the recorder opens files in ``/proc`` now and then,
        which a count of this process's descriptors would otherwise catch."""
        with self._lock:
            yield

    def sample(self) -> None:
        """Record the processes of the test that are alive now."""
        with self._lock:
            ppid, pgid, command = _process_table()
            self.seen |= set(self.adopted())
            leaders = {p for p in self.seen if p != self.root}
            added = True
            while added:  # children listed before their parent was recorded
                new = {
                    p
                    for p in ppid
                    if p not in self.seen and (ppid[p] in self.seen or pgid[p] in leaders)
                }
                self.seen |= new
                leaders |= new
                added = bool(new)
            for p in self.seen & command.keys():
                self.roles[p] = f"{command[p]}, child of {ppid[p]}"

    def role(self, name: str) -> str:
        """Who made ``/dev/shm`` entry ``name``: its creator's pid, command and parent
        when last recorded (a DataLoader worker calls itself ``pt_data_worker``)."""
        pid = creator(name)
        return f"pid {pid} ({self.roles.get(pid or 0, 'not recorded')})"

    def ours(self, name: str) -> bool:
        """Whether the ``/dev/shm`` entry ``name`` is one a process of the test made."""
        pid = creator(name)
        if pid is None or name in self.before:
            return False
        try:
            if os.stat(os.path.join(SHM_DIR, name)).st_uid != self.uid:
                return False
        except FileNotFoundError:
            return False
        return pid == 0 or pid in self.seen

    def leaked(self, settle_s: float = 10.0) -> list[str]:
        """Entries the test's processes made that no live process holds any more.

        Waits up to ``settle_s`` for the resource trackers to unlink what a killed
        process left.
        """
        self.sample()
        deadline = time.monotonic() + settle_s
        while True:
            mine = {name for name in shm_entries() if self.ours(name)}
            leaked = mine - held_shm() if mine else set()
            if not leaked or time.monotonic() > deadline:
                return sorted(leaked)
            time.sleep(0.2)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _process_table() -> tuple[dict[int, int], dict[int, int], dict[int, str]]:
    """Parent, process group and command of every live process (``/proc/<pid>/stat``)."""
    ppid: dict[int, int] = {}
    pgid: dict[int, int] = {}
    command: dict[int, str] = {}
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command (which may hold spaces and parentheses).
        fields = stat[stat.rfind(b")") + 2 :].split()
        ppid[pid], pgid[pid] = int(fields[1]), int(fields[2])
        command[pid] = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
    return ppid, pgid, command
