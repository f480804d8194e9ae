"""Bring the cluster up, check it, tear it down (``up``, ``status``, ``down``)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from experiments.cluster.daemons import (
    State,
    client_env,
    logs_tail,
    pid_alive,
    start_daemon,
    stop_pid,
)
from experiments.cluster.host import (
    add_hosts,
    edit_hosts,
    ensure_munge_key,
    ensure_packages,
    link_site_conf,
    require_executable,
    unlink_site_conf,
)
from experiments.cluster.spec import (
    HOSTS_FILE,
    MUNGE_KEY,
    ClusterError,
    ClusterSpec,
    default_spec,
    hosts_marker,
    hosts_without_nodes,
    log,
    slurm_conf,
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
        require_executable("munged"),
        "--foreground",
        f"--socket={state.spec.munge_socket}",
        f"--key-file={MUNGE_KEY}",
        f"--log-file={d}/munged.log",
        f"--pid-file={d}/munged.pid",
        f"--seed-file={d}/munged.seed",
    ]
    start_daemon(state, "munged", cmd, user="munge")
    probe = [require_executable("munge"), "-n", f"--socket={state.spec.munge_socket}"]
    _wait(
        lambda: subprocess.run(probe, capture_output=True, check=False).returncode == 0,
        state,
        "munged to answer on its socket",
        timeout_s=20,
    )


def _start_slurm(state: State) -> None:
    conf = str(state.spec.conf_path)
    start_daemon(state, "slurmctld", [require_executable("slurmctld"), "-D", "-f", conf])
    for node in state.spec.nodes:
        start_daemon(
            state, f"slurmd-{node}", [require_executable("slurmd"), "-D", "-N", node, "-f", conf]
        )


def nodes_idle(sinfo_output: str, nodes: Sequence[str]) -> bool:
    """True when `sinfo -h -N -o '%N %t'` shows every node in `nodes` idle (pure)."""
    states: dict[str, set[str]] = {}
    for line in sinfo_output.splitlines():
        if line.strip():
            name, node_state = line.split()[:2]
            states.setdefault(name, set()).add(node_state)
    return all(states.get(node) == {"idle"} for node in nodes)


def _sinfo(spec: ClusterSpec) -> str:
    cmd = [require_executable("sinfo"), "-h", "-N", "-o", "%N %t"]
    done = subprocess.run(
        cmd, env=client_env(spec), capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout if done.returncode == 0 else ""


def _wait(ready: Callable[[], bool], state: State, what: str, timeout_s: float) -> None:
    """Poll `ready()` until true; fail early if a started daemon died, late with its logs."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [n for n, pid in state.pids.items() if not pid_alive(pid, n)]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"not within {timeout_s:g} s"
            raise ClusterError(
                f"waiting for {what}: {why}. Daemon logs follow; fix what they name, or "
                f"raise --timeout if the machine is just slow.\n{logs_tail(state.spec)}"
            )
        time.sleep(0.5)


def is_running(state: State) -> bool:
    """True when every daemon in `state` runs and sinfo shows every node idle or busy."""
    if not all(pid_alive(pid, name) for name, pid in state.pids.items()):
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
        log(f"already up ({existing.spec.conf_path}); nothing to do")
        return existing
    if existing is not None:
        log("a previous cluster in this state dir is partly down: stopping its rest")
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
        add_hosts(state)
        link_site_conf(state)
        _start_slurm(state)
        _wait(
            lambda: nodes_idle(_sinfo(state.spec), state.spec.nodes),
            state,
            f"sinfo to show {', '.join(state.spec.nodes)} idle",
            timeout_s,
        )
    except BaseException:
        log("bring-up failed: stopping what it started")
        down(state.spec.state_dir)
        raise
    log(
        f"up in {time.monotonic() - start:.1f} s: nodes {', '.join(state.spec.nodes)} idle, "
        f"partitions {', '.join(state.spec.partitions)} (default {state.spec.partitions[0]})"
    )
    return state


# --- tear down ----------------------------------------------------------------------------


def _cancel_jobs(state: State) -> None:
    """Cancel every job of this cluster and give the nodes a moment to end their steps."""
    if not pid_alive(state.pids.get("slurmctld", -1), "slurmctld"):
        return
    env = client_env(state.spec)
    jobs = _job_ids(env)
    if not jobs:
        return
    log(f"cancelling {len(jobs)} job(s): {' '.join(jobs)}")
    subprocess.run([require_executable("scancel"), *jobs], env=env, timeout=30, check=False)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if not _job_ids(env):
            return
        time.sleep(0.5)


def _job_ids(env: dict[str, str]) -> list[str]:
    """The ids of the cluster's jobs, as ``squeue`` lists them."""
    squeue = [require_executable("squeue"), "-h", "-o", "%i"]
    listed = subprocess.run(
        squeue, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    return listed.stdout.split()


def _kill_job_leftovers(spec: ClusterSpec) -> None:
    """SIGKILL what this cluster's jobs left: its slurmstepd and every job process that
    escaped its step (`setsid`, a daemon), found by the cluster's SLURM_CONF and a job id in
    their environment. The calling process and its ancestors are never touched."""
    tag = f"SLURM_CONF={spec.conf_path}".encode()
    spared = _self_and_ancestors()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.name) in spared:
                continue
            environ = proc.joinpath("environ").read_bytes().split(b"\0")
            if tag not in environ:
                continue
            is_step = proc.joinpath("comm").read_text().strip() == "slurmstepd"
            if not is_step and not any(var.startswith(b"SLURM_JOB_ID=") for var in environ):
                continue
            os.kill(int(proc.name), signal.SIGKILL)
            what = "slurmstepd" if is_step else "job process"
            log(f"killed a leftover {what} (pid {proc.name})")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


def _self_and_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def down(state_dir: Path) -> None:
    """Stop exactly what `up` started in `state_dir` and remove what it added (idempotent)."""
    state = State.load(state_dir)
    if state is None:
        log(f"no cluster in {state_dir}; nothing to stop")
        return
    with contextlib.suppress(subprocess.TimeoutExpired, ClusterError):
        _cancel_jobs(state)
    for name, pid in reversed(state.pids.items()):
        stop_pid(pid, name)
    _kill_job_leftovers(state.spec)
    if state.hosts_added:
        edit_hosts(lambda text: hosts_without_nodes(text, hosts_marker(state.spec.state_dir)))
        log(f"removed this cluster's line from {HOSTS_FILE}")
    if state.site_conf_linked:
        unlink_site_conf(state)
    shutil.rmtree(state.spec.state_dir, ignore_errors=True)
    log(f"down; removed {state.spec.state_dir}")


def status(state_dir: Path) -> int:
    """Print the daemons and `sinfo`; 0 when the cluster is up, 1 when it is not."""
    state = State.load(state_dir)
    if state is None:
        print(f"down: no cluster in {state_dir}")
        return 1
    for name, pid in state.pids.items():
        print(f"{name:12} pid {pid:<8} {'running' if pid_alive(pid, name) else 'NOT running'}")
    print(f"export SLURM_CONF={state.spec.conf_path}")
    print(_sinfo(state.spec) or "sinfo: no answer", end="")
    return 0 if is_running(state) else 1
