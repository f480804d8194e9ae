"""The cluster's processes: the state file naming every pid started, starting a daemon,
stopping one by pid, and the log tails an error shows."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from experiments.cluster.spec import STOP_GRACE_S, ClusterSpec, log

# --- processes ------------------------------------------------------------------------


@dataclass
class State:
    """What `up` started, saved to `<state dir>/state.json` after every step."""

    spec: ClusterSpec
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    hosts_added: bool = False
    site_conf_linked: bool = False

    @property
    def path(self) -> Path:
        return self.spec.state_dir / "state.json"

    def save(self) -> None:
        spec = {**dataclasses.asdict(self.spec), "state_dir": str(self.spec.state_dir)}
        data = {
            "spec": spec,
            "pids": self.pids,
            "hosts_added": self.hosts_added,
            "site_conf_linked": self.site_conf_linked,
        }
        self.path.write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, state_dir: Path) -> State | None:
        path = state_dir / "state.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        raw = data["spec"]
        spec = ClusterSpec(
            **{
                **raw,
                "state_dir": Path(raw["state_dir"]),
                "node_ports": tuple(raw["node_ports"]),
                "nodes": tuple(raw["nodes"]),
                "partitions": tuple(raw["partitions"]),
            }
        )
        return cls(
            spec,
            {k: int(v) for k, v in data["pids"].items()},
            data["hosts_added"],
            data.get("site_conf_linked", False),
        )


def start_daemon(state: State, name: str, cmd: list[str], user: str | None = None) -> None:
    """Start one foreground daemon in its own session and record its pid at once."""
    out = (state.spec.log_dir / f"{name}.out").open("ab")
    with signals_deferred():  # no signal between the start and the record of the pid
        proc = _popen_daemon(state, cmd, out, user)
        state.pids[name] = proc.pid
        state.save()
    out.close()
    log(f"started {name} (pid {proc.pid})")


def _popen_daemon(
    state: State, cmd: list[str], out: BinaryIO, user: str | None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=client_env(state.spec),
        start_new_session=True,
        user=user,
        group=user,
    )


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver them as usual.

    (A blocked signal mask would be inherited by the daemons, so Python-level handlers.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    watched = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in watched}
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        for signum in pending:
            os.kill(os.getpid(), signum)


def client_env(spec: ClusterSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with `SLURM_CONF` for this cluster."""
    return {**(os.environ if base is None else base), "SLURM_CONF": str(spec.conf_path)}


def pid_alive(pid: int, name: str) -> bool:
    """True while `pid` runs and is still the daemon `name` (not a reused pid)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return name.split("-")[0].encode() in cmdline


def stop_pid(pid: int, name: str, grace_s: float = STOP_GRACE_S) -> None:
    if not pid_alive(pid, name):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pid_alive(pid, name):
        time.sleep(0.1)
    if pid_alive(pid, name):
        log(f"{name} (pid {pid}) ignored SIGTERM for {grace_s:.0f} s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    log(f"stopped {name} (pid {pid})")


def _tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return f"--- {path}: missing"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- {path} (last {len(text)} lines)\n" + "\n".join(text)


def logs_tail(spec: ClusterSpec) -> str:
    return "\n".join(_tail(p) for p in sorted(spec.log_dir.glob("*")))
