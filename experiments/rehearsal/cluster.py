"""A real two-node Slurm cluster on this machine, started and stopped by pid.

The paper path (`snakemake --profile slurm`) needs `sbatch`, `srun` and two nodes whose
names resolve for torchrun's c10d rendezvous. This module brings up exactly that with
Debian's `slurm-wlm` 22.05 and `munge`, as root:

    python -m experiments.rehearsal.cluster run -- snakemake --profile slurm ...
    python -m experiments.rehearsal.cluster up        # prints `export SLURM_CONF=...`
    python -m experiments.rehearsal.cluster status
    python -m experiments.rehearsal.cluster down

What it starts, all from a state directory (default `/tmp/odb-slurm`) that holds its own
`slurm.conf`, logs, spool and a `state.json` naming every pid it started:

- a `munged` of its own (run as the munge user, on its own socket, so it neither needs
  nor disturbs a system munge), with a key in `/etc/munge/munge.key` if none exists;
- `slurmctld` and one `slurmd` per node (`n1`, `n2`), both nodes on this host
  (`NodeAddr=127.0.0.1`, a free port each), in two partitions: `gpu` (the default) and
  `cpu`, mirroring a real site's split. The nodes have no GPUs;
- one line `127.0.0.1 n1 n2` in `/etc/hosts`, tagged with a marker naming the state dir;
- `/etc/slurm/slurm.conf` as a link to its conf (a file already there is kept aside and
  put back by `down`): jobs' own `srun` calls find the cluster there, as on a real site.
  A link to another running cluster is refused; one left by a cluster whose daemons are
  gone (a machine restarted under it) is replaced.

What it guarantees to stop: `down` (and `run`, in a `finally` that also runs on SIGINT
and SIGTERM) cancels the cluster's jobs, stops exactly the pids in `state.json`
(SIGTERM, a grace period, SIGKILL), kills any `slurmstepd` left by those daemons,
removes its `/etc/hosts` line and its `/etc/slurm/slurm.conf` link (restoring a file
it kept aside) and the state directory. The Debian packages and the munge
key stay installed. `up` on a running cluster and `down` on a stopped one do nothing.

Clients (`sbatch`, `srun`, `sinfo`, the Snakemake Slurm executor) find the cluster only
through `SLURM_CONF=<state dir>/slurm.conf`; `run` exports it into its command's
environment. Jobs inherit the submitter's environment (`--export=ALL`), so PATH and
PYTHONPATH reach every task. There is no accounting database: poll with `squeue`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

DEFAULT_STATE_DIR = Path("/tmp/odb-slurm")
NODES = ("n1", "n2")
# The first partition is the default one: training goes to `gpu`, the rest to `cpu`.
PARTITIONS = ("gpu", "cpu")
HOSTS_FILE = Path("/etc/hosts")
# Where Slurm clients look without SLURM_CONF. Jobs need the cluster found there: the
# Snakemake Slurm job-step executor strips every SLURM_* variable but the job's identity
# from the environment of the rule it runs, so a rule's own `srun` (the 2-node launcher)
# sees no SLURM_CONF, as on a real site, where the configuration lives here.
SITE_CONF = Path("/etc/slurm/slurm.conf")
MUNGE_KEY = Path("/etc/munge/munge.key")
PACKAGES = ("slurm-wlm", "munge")
# Executables the packages provide; any one missing means the packages are installed.
EXECUTABLES = (
    "slurmctld",
    "slurmd",
    "munged",
    "munge",
    "sinfo",
    "sbatch",
    "srun",
    "squeue",
    "scancel",
)
_PORT_RANGE = (17000, 19000)
_STOP_GRACE_S = 10.0


class ClusterError(RuntimeError):
    """The cluster could not be brought up or used; the message says what to change."""


@dataclass(frozen=True)
class ClusterSpec:
    """Everything `slurm.conf` depends on; validated on construction.

    Example:
        >>> spec = ClusterSpec(Path("/tmp/odb-slurm"), "vm", 17000, (17001, 17002), 2, 10000)
        >>> spec.conf_path
        PosixPath('/tmp/odb-slurm/slurm.conf')
    """

    state_dir: Path
    hostname: str
    ctld_port: int
    node_ports: tuple[int, ...]
    cpus: int
    memory_mb: int
    nodes: tuple[str, ...] = NODES
    partitions: tuple[str, ...] = PARTITIONS

    def __post_init__(self) -> None:
        if len(self.node_ports) != len(self.nodes):
            raise ValueError(
                f"node_ports {self.node_ports} must give one port per node {self.nodes}"
            )
        ports = (self.ctld_port, *self.node_ports)
        if len(set(ports)) != len(ports):
            raise ValueError(f"ports {ports} must be distinct")
        if self.cpus < 1 or self.memory_mb < 100:
            raise ValueError(
                f"cpus={self.cpus}, memory_mb={self.memory_mb}: need cpus >= 1 and "
                "memory_mb >= 100 per node"
            )
        if not self.state_dir.is_absolute():
            raise ValueError(f"state_dir {self.state_dir} must be an absolute path")

    @property
    def conf_path(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def munge_dir(self) -> Path:
        return self.state_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"


def slurm_conf(spec: ClusterSpec) -> str:
    """The `slurm.conf` text for `spec` (pure: no I/O).

    Settings are those verified on this kind of machine (root, no cgroups, no
    accounting). `config_overrides` makes slurmd trust the configured CPUs and memory:
    both nodes share one host, so each may claim what the host has.
    """
    s = spec.state_dir
    nodes = ",".join(spec.nodes)
    lines = [
        "# Written by experiments/rehearsal/cluster.py; removed by its `down`.",
        "ClusterName=odb-rehearsal",
        f"SlurmctldHost={spec.hostname}(127.0.0.1)",
        f"SlurmctldPort={spec.ctld_port}",
        f"SlurmdPort={spec.node_ports[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={spec.munge_socket}",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={max(spec.memory_mb // spec.cpus, 1)}",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "InactiveLimit=0",
        "KillWait=5",
        # Finished jobs stay in squeue this long: Snakemake's executor (no sacct here)
        # reads their end state from squeue and wants >= 120 s; Slurm's default.
        "MinJobAge=300",
        f"StateSaveLocation={s}/ctld",
        f"SlurmctldPidFile={s}/slurmctld.pid",
        f"SlurmctldLogFile={spec.log_dir}/slurmctld.log",
        f"SlurmdSpoolDir={s}/spool/%n",
        f"SlurmdPidFile={s}/slurmd-%n.pid",
        f"SlurmdLogFile={spec.log_dir}/slurmd-%n.log",
    ]
    for node, port in zip(spec.nodes, spec.node_ports, strict=True):
        lines.append(
            f"NodeName={node} NodeHostname={spec.hostname} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={spec.cpus} RealMemory={spec.memory_mb} State=UNKNOWN"
        )
    for i, part in enumerate(spec.partitions):
        default = "YES" if i == 0 else "NO"
        lines.append(
            f"PartitionName={part} Nodes={nodes} Default={default} MaxTime=7-00:00:00 State=UP"
        )
    return "\n".join(lines) + "\n"


def hosts_marker(state_dir: Path) -> str:
    """The comment that tags this cluster's `/etc/hosts` line."""
    return f"# odb-rehearsal-cluster {state_dir}"


def hosts_with_nodes(text: str, nodes: Sequence[str], marker: str) -> str:
    """`text` (an /etc/hosts) with one tagged `127.0.0.1 <nodes>` line; no duplicates."""
    text = hosts_without_nodes(text, marker)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + f"127.0.0.1 {' '.join(nodes)} {marker}\n"


def hosts_without_nodes(text: str, marker: str) -> str:
    """`text` with every line tagged by `marker` removed, the rest byte for byte."""
    kept = [ln for ln in text.splitlines(keepends=True) if not ln.rstrip().endswith(marker)]
    return "".join(kept)


def _log(message: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- packages and munge -------------------------------------------------------------


def _executable(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/usr/bin", "/sbin"):
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return None


def _exe(name: str) -> str:
    found = _executable(name)
    if found is None:
        raise ClusterError(f"{name} not found after installing {PACKAGES}; check apt's output")
    return found


def ensure_packages() -> None:
    """Install `slurm-wlm` and `munge` from apt when any of their executables is missing.

    Services are kept from starting during the install (a temporary policy-rc.d), so
    nothing runs that this module did not start and record.
    """
    missing = [name for name in EXECUTABLES if _executable(name) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(
            f"{', '.join(missing)} not installed and this is not root: run as root, or "
            f"install them first with `apt-get install {' '.join(PACKAGES)}`"
        )
    _log(f"installing {' '.join(PACKAGES)} (missing: {', '.join(missing)}; about a minute)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with _services_blocked():
        for cmd in (
            ["apt-get", "-q", "update"],
            ["apt-get", "-q", "install", "-y", "--no-install-recommends", *PACKAGES],
        ):
            _log(" ".join(cmd))
            done = subprocess.run(cmd, env=env, stdout=sys.stderr, check=False)
            if done.returncode != 0:
                raise ClusterError(f"`{' '.join(cmd)}` failed (exit {done.returncode})")
    _log("packages installed")


@contextlib.contextmanager
def _services_blocked() -> Iterator[None]:
    policy = Path("/usr/sbin/policy-rc.d")
    if policy.exists():  # someone else's policy: leave it as it is
        yield
        return
    policy.write_text("#!/bin/sh\n# odb-rehearsal-cluster: no service starts\nexit 101\n")
    policy.chmod(0o755)
    try:
        yield
    finally:
        policy.unlink(missing_ok=True)


def ensure_munge_key(key: Path = MUNGE_KEY) -> None:
    """Create a 1 KiB random munge key (owner munge, mode 400) if there is none."""
    if key.exists():
        return
    munge = pwd.getpwnam("munge")
    key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(key.parent, munge.pw_uid, munge.pw_gid)
    key.write_bytes(os.urandom(1024))
    os.chown(key, munge.pw_uid, munge.pw_gid)
    key.chmod(0o400)
    _log(f"wrote a munge key to {key}")


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


def _start(state: State, name: str, cmd: list[str], user: str | None = None) -> None:
    """Start one foreground daemon in its own session and record its pid at once."""
    out = (state.spec.log_dir / f"{name}.out").open("ab")
    with _signals_deferred():  # no signal between the start and the record of the pid
        proc = _popen_daemon(state, cmd, out, user)
        state.pids[name] = proc.pid
        state.save()
    out.close()
    _log(f"started {name} (pid {proc.pid})")


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
def _signals_deferred() -> Iterator[None]:
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


def _pid_alive(pid: int, name: str) -> bool:
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


def _stop_pid(pid: int, name: str, grace_s: float = _STOP_GRACE_S) -> None:
    if not _pid_alive(pid, name):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _pid_alive(pid, name):
        time.sleep(0.1)
    if _pid_alive(pid, name):
        _log(f"{name} (pid {pid}) ignored SIGTERM for {grace_s:.0f} s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _log(f"stopped {name} (pid {pid})")


def _tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return f"--- {path}: missing"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- {path} (last {len(text)} lines)\n" + "\n".join(text)


def _logs_tail(spec: ClusterSpec) -> str:
    return "\n".join(_tail(p) for p in sorted(spec.log_dir.glob("*")))


# --- bring up -----------------------------------------------------------------------------


def free_ports(count: int, taken: Sequence[int] = ()) -> tuple[int, ...]:
    """`count` distinct TCP ports, free on all interfaces a moment ago, from a random start.

    Slurm needs fixed ports in its config, so they cannot be bound to port 0; a random
    start keeps two clusters brought up at once from picking the same ones.
    """
    low, high = _PORT_RANGE
    start = random.randrange(low, high)
    found: list[int] = []
    for offset in range(high - low):
        port = low + (start - low + offset) % (high - low)
        if port not in taken and _port_free(port):
            found.append(port)
            if len(found) == count:
                return tuple(found)
    raise ClusterError(f"fewer than {count} free TCP ports in {low}-{high}")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def default_spec(state_dir: Path, cpus: int | None, memory_mb: int | None) -> ClusterSpec:
    """A spec for this host: free ports, and per node all CPUs and 90% of memory / nodes."""
    total_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    ports = free_ports(1 + len(NODES))
    return ClusterSpec(
        state_dir=state_dir.resolve(),
        hostname=socket.gethostname().split(".")[0],
        ctld_port=ports[0],
        node_ports=ports[1:],
        cpus=cpus or os.cpu_count() or 1,
        memory_mb=memory_mb or int(total_mb * 0.9) // len(NODES),
    )


def _prepare_dirs(spec: ClusterSpec) -> None:
    spec.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    spec.state_dir.chmod(0o755)  # munged, run as munge, must reach its own folder
    for sub in ("ctld", "spool", "log"):
        (spec.state_dir / sub).mkdir(exist_ok=True)
    munge = pwd.getpwnam("munge")
    spec.munge_dir.mkdir(mode=0o755, exist_ok=True)
    os.chown(spec.munge_dir, munge.pw_uid, munge.pw_gid)
    spec.conf_path.write_text(slurm_conf(spec))


def _start_munged(state: State) -> None:
    d = state.spec.munge_dir
    cmd = [
        _exe("munged"),
        "--foreground",
        f"--socket={state.spec.munge_socket}",
        f"--key-file={MUNGE_KEY}",
        f"--log-file={d}/munged.log",
        f"--pid-file={d}/munged.pid",
        f"--seed-file={d}/munged.seed",
    ]
    _start(state, "munged", cmd, user="munge")
    probe = [_exe("munge"), "-n", f"--socket={state.spec.munge_socket}"]
    _wait(
        lambda: subprocess.run(probe, capture_output=True, check=False).returncode == 0,
        state,
        "munged to answer on its socket",
        timeout_s=20,
    )


def _edit_hosts(edit: Callable[[str], str]) -> None:
    """Rewrite /etc/hosts in place (it may be a bind mount) under an exclusive lock."""
    with HOSTS_FILE.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read()
        new = edit(text)
        if new != text:
            f.seek(0)
            f.write(new)
            f.truncate()


def _add_hosts(state: State) -> None:
    marker = hosts_marker(state.spec.state_dir)
    _edit_hosts(lambda text: hosts_with_nodes(text, state.spec.nodes, marker))
    state.hosts_added = True
    state.save()
    _log(f"added `127.0.0.1 {' '.join(state.spec.nodes)}` to {HOSTS_FILE}")


def _saved_site_conf(spec: ClusterSpec) -> Path:
    return spec.state_dir / "site-slurm.conf.saved"


def _linked_cluster() -> Path | None:
    """The state dir of the local cluster `SITE_CONF` points at, if one of ours."""
    if not SITE_CONF.is_symlink():
        return None
    target = SITE_CONF.parent / SITE_CONF.readlink()
    return target.parent if target.name == "slurm.conf" else None


def _cluster_alive(state_dir: Path) -> bool:
    """True when `state_dir` holds a cluster whose every started daemon still runs."""
    other = State.load(state_dir)
    return bool(other and other.pids) and all(
        _pid_alive(pid, name) for name, pid in other.pids.items()
    )


def _link_site_conf(state: State) -> None:
    """Point `SITE_CONF` at this cluster's conf, keeping a site's own file aside.

    A link left by a cluster whose daemons no longer run (a machine restarted under it)
    is replaced; a link to a running cluster is refused.
    """
    other = _linked_cluster()
    if other is not None and other != state.spec.state_dir:
        if _cluster_alive(other):
            raise ClusterError(
                f"another local cluster is up (state dir {other}; {SITE_CONF} points at it) "
                "and jobs find their cluster there: stop it first with `python -m "
                f"experiments.rehearsal.cluster down --state-dir {other}`"
            )
        SITE_CONF.unlink()
        _log(f"removed a stale {SITE_CONF} link to {other} (no cluster runs there)")
    if SITE_CONF.exists() or SITE_CONF.is_symlink():
        shutil.move(str(SITE_CONF), _saved_site_conf(state.spec))
        _log(f"kept the existing {SITE_CONF} aside; `down` puts it back")
    SITE_CONF.parent.mkdir(parents=True, exist_ok=True)
    SITE_CONF.symlink_to(state.spec.conf_path)
    state.site_conf_linked = True
    state.save()
    _log(f"linked {SITE_CONF} -> {state.spec.conf_path}")


def _unlink_site_conf(state: State) -> None:
    if SITE_CONF.is_symlink() and SITE_CONF.readlink() == state.spec.conf_path:
        SITE_CONF.unlink()
    saved = _saved_site_conf(state.spec)
    if saved.exists() or saved.is_symlink():
        shutil.move(str(saved), SITE_CONF)
    _log(f"restored {SITE_CONF}")


def _start_slurm(state: State) -> None:
    conf = str(state.spec.conf_path)
    _start(state, "slurmctld", [_exe("slurmctld"), "-D", "-f", conf])
    for node in state.spec.nodes:
        _start(state, f"slurmd-{node}", [_exe("slurmd"), "-D", "-N", node, "-f", conf])


def nodes_idle(sinfo_output: str, nodes: Sequence[str]) -> bool:
    """True when `sinfo -h -N -o '%N %t'` shows every node in `nodes` idle (pure)."""
    states: dict[str, set[str]] = {}
    for line in sinfo_output.splitlines():
        if line.strip():
            name, node_state = line.split()[:2]
            states.setdefault(name, set()).add(node_state)
    return all(states.get(node) == {"idle"} for node in nodes)


def _sinfo(spec: ClusterSpec) -> str:
    cmd = [_exe("sinfo"), "-h", "-N", "-o", "%N %t"]
    done = subprocess.run(
        cmd, env=client_env(spec), capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout if done.returncode == 0 else ""


def _wait(ready: Callable[[], bool], state: State, what: str, timeout_s: float) -> None:
    """Poll `ready()` until true; fail early if a started daemon died, late with its logs."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [n for n, pid in state.pids.items() if not _pid_alive(pid, n)]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"not within {timeout_s:g} s"
            raise ClusterError(
                f"waiting for {what}: {why}. Daemon logs follow; fix what they name, or "
                f"raise --timeout if the machine is just slow.\n{_logs_tail(state.spec)}"
            )
        time.sleep(0.5)


def is_running(state: State) -> bool:
    """True when every daemon in `state` runs and sinfo shows every node idle or busy."""
    if not all(_pid_alive(pid, name) for name, pid in state.pids.items()):
        return False
    names = {line.split()[0] for line in _sinfo(state.spec).splitlines() if line.strip()}
    return set(state.spec.nodes) <= names


def up(
    state_dir: Path, cpus: int | None = None, memory_mb: int | None = None, timeout_s: float = 120.0
) -> State:
    """Bring the cluster up (a no-op when it already runs); on failure stop what started.

    Example:
        >>> state = up(Path("/tmp/odb-slurm"))  # doctest: +SKIP
        >>> os.environ["SLURM_CONF"] = str(state.spec.conf_path)  # doctest: +SKIP
    """
    existing = State.load(state_dir)
    if existing is not None and is_running(existing):
        _log(f"already up ({existing.spec.conf_path}); nothing to do")
        return existing
    if existing is not None:
        _log("a previous cluster in this state dir is partly down: stopping its rest")
        down(state_dir)
    if os.geteuid() != 0:
        raise ClusterError(
            "bringing the cluster up needs root (it edits /etc/hosts, runs munged as the "
            "munge user and slurmd as root): run it with sudo, or as root in a container"
        )
    start = time.monotonic()
    ensure_packages()
    ensure_munge_key()
    state = State(default_spec(state_dir, cpus, memory_mb))
    try:
        _prepare_dirs(state.spec)
        state.save()
        _start_munged(state)
        _add_hosts(state)
        _link_site_conf(state)
        _start_slurm(state)
        _wait(
            lambda: nodes_idle(_sinfo(state.spec), state.spec.nodes),
            state,
            f"sinfo to show {', '.join(state.spec.nodes)} idle",
            timeout_s,
        )
    except BaseException:
        _log("bring-up failed: stopping what it started")
        down(state.spec.state_dir)
        raise
    _log(
        f"up in {time.monotonic() - start:.1f} s: nodes {', '.join(state.spec.nodes)} idle, "
        f"partitions {', '.join(state.spec.partitions)} (default {state.spec.partitions[0]})"
    )
    return state


# --- tear down ----------------------------------------------------------------------------


def _cancel_jobs(state: State) -> None:
    """Cancel every job of this cluster and give the nodes a moment to end their steps."""
    if not _pid_alive(state.pids.get("slurmctld", -1), "slurmctld"):
        return
    env = client_env(state.spec)
    listed = subprocess.run(
        [_exe("squeue"), "-h", "-o", "%i"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    jobs = listed.stdout.split()
    if not jobs:
        return
    _log(f"cancelling {len(jobs)} job(s): {' '.join(jobs)}")
    subprocess.run([_exe("scancel"), *jobs], env=env, timeout=30, check=False)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = subprocess.run(
            [_exe("squeue"), "-h", "-o", "%i"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if not left.stdout.split():
            return
        time.sleep(0.5)


def _kill_orphan_steps(spec: ClusterSpec) -> None:
    """SIGKILL any slurmstepd left by this cluster's slurmd (they carry its SLURM_CONF)."""
    tag = f"SLURM_CONF={spec.conf_path}".encode() + b"\0"
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.joinpath("comm").read_text().strip() != "slurmstepd":
                continue
            if tag not in proc.joinpath("environ").read_bytes() + b"\0":
                continue
            os.kill(int(proc.name), signal.SIGKILL)
            _log(f"killed a leftover slurmstepd (pid {proc.name})")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


def down(state_dir: Path) -> None:
    """Stop exactly what `up` started in `state_dir` and remove what it added (idempotent)."""
    state = State.load(state_dir)
    if state is None:
        _log(f"no cluster in {state_dir}; nothing to stop")
        return
    with contextlib.suppress(subprocess.TimeoutExpired, ClusterError):
        _cancel_jobs(state)
    for name, pid in reversed(state.pids.items()):
        _stop_pid(pid, name)
    _kill_orphan_steps(state.spec)
    if state.hosts_added:
        _edit_hosts(lambda text: hosts_without_nodes(text, hosts_marker(state.spec.state_dir)))
        _log(f"removed this cluster's line from {HOSTS_FILE}")
    if state.site_conf_linked:
        _unlink_site_conf(state)
    shutil.rmtree(state.spec.state_dir, ignore_errors=True)
    _log(f"down; removed {state.spec.state_dir}")


def status(state_dir: Path) -> int:
    """Print the daemons and `sinfo`; 0 when the cluster is up, 1 when it is not."""
    state = State.load(state_dir)
    if state is None:
        print(f"down: no cluster in {state_dir}")
        return 1
    for name, pid in state.pids.items():
        print(f"{name:12} pid {pid:<8} {'running' if _pid_alive(pid, name) else 'NOT running'}")
    print(f"export SLURM_CONF={state.spec.conf_path}")
    print(_sinfo(state.spec) or "sinfo: no answer", end="")
    return 0 if is_running(state) else 1


# --- run --------------------------------------------------------------------------------


class _Interrupted(BaseException):
    """SIGTERM or SIGINT arrived while no command was running: unwind to the teardown."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class _Signals:
    """SIGINT/SIGTERM policy for `run`: bring-up unwinds, the command gets the signal,
    and the teardown finishes regardless, so no daemon outlives the caller.

    SIGTERM is forwarded to the command. SIGINT is not: a terminal's Ctrl-C already
    reaches the command (same process group), and a second one would cut its cleanup.
    """

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.tearing_down = False

    def __enter__(self) -> _Signals:
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._old.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.tearing_down:
            _log(f"signal {signum} during teardown: finishing the teardown first")
        elif self.child is not None and self.child.poll() is None:
            if signum == signal.SIGTERM:
                self.child.send_signal(signum)
        else:
            raise _Interrupted(signum)


def run(
    command: Sequence[str],
    state_dir: Path,
    cpus: int | None = None,
    memory_mb: int | None = None,
    timeout_s: float = 120.0,
) -> int:
    """Bring the cluster up, run `command` with `SLURM_CONF` set, tear down; its exit code.

    A cluster already up in `state_dir` is used and left running (it is not ours to stop).
    """
    if not command:
        raise ClusterError("run needs a command: `cluster run -- <command ...>`")
    existing = State.load(state_dir)
    reuse = existing is not None and is_running(existing)
    with _Signals() as signals:
        try:
            state = existing if reuse and existing else up(state_dir, cpus, memory_mb, timeout_s)
            _log(f"running {' '.join(command)} with SLURM_CONF={state.spec.conf_path}")
            with _signals_deferred():  # so that a signal always finds the child recorded
                signals.child = subprocess.Popen(list(command), env=client_env(state.spec))
            code = signals.child.wait()
            _log(f"command exited with {code}")
            return 128 - code if code < 0 else code
        except _Interrupted as stop:
            return 128 + stop.signum
        finally:
            signals.tearing_down = True
            if signals.child is not None and signals.child.poll() is None:
                signals.child.kill()
                signals.child.wait()
            if not reuse:
                down(state_dir)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"conf, logs, spool and state.json (default {DEFAULT_STATE_DIR})",
    )
    sizing = argparse.ArgumentParser(add_help=False)
    sizing.add_argument(
        "--cpus", type=int, default=None, help="CPUs per node (default: this host's; may exceed it)"
    )
    sizing.add_argument(
        "--memory-mb",
        type=int,
        default=None,
        help="RealMemory per node (default: 90%% of this host's / nodes)",
    )
    sizing.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for both nodes to be idle (default 120)",
    )
    parser = argparse.ArgumentParser(
        prog="python -m experiments.rehearsal.cluster", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("up", parents=[common, sizing], help="start the cluster (idempotent)")
    sub.add_parser("down", parents=[common], help="stop it by pid (idempotent)")
    sub.add_parser("status", parents=[common], help="daemons and sinfo; exit 0 when up")
    run_p = sub.add_parser(
        "run",
        parents=[common, sizing],
        help="up, run a command with SLURM_CONF set, down; its exit code",
    )
    run_p.add_argument("command", nargs=argparse.REMAINDER, help="-- <command ...>")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "up":
            with _Signals():  # SIGTERM unwinds like Ctrl-C: a failed `up` stops its daemons
                state = up(args.state_dir, args.cpus, args.memory_mb, args.timeout)
            print(f"export SLURM_CONF={state.spec.conf_path}")
            return 0
        if args.action == "down":
            down(args.state_dir)
            return 0
        if args.action == "status":
            return status(args.state_dir)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return run(command, args.state_dir, args.cpus, args.memory_mb, args.timeout)
    except ClusterError as err:
        print(f"cluster: {err}", file=sys.stderr)
        return 2
    except _Interrupted as stop:
        return 128 + stop.signum


if __name__ == "__main__":
    sys.exit(main())
