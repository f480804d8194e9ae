"""What the local cluster changes on the host, and puts back: the Debian packages and
the munge key (installed once, kept), the ``/etc/hosts`` line and the
``/etc/slurm/slurm.conf`` link (removed by ``down``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from experiments.cluster.daemons import State, pid_alive
from experiments.cluster.spec import (
    EXECUTABLES,
    HOSTS_FILE,
    MUNGE_KEY,
    PACKAGES,
    SITE_CONF,
    ClusterError,
    ClusterSpec,
    hosts_marker,
    hosts_with_nodes,
    log,
)

# --- packages and munge -------------------------------------------------------------


def _executable(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/usr/bin", "/sbin"):
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return None


def require_executable(name: str) -> str:
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
    log(f"installing {' '.join(PACKAGES)} (missing: {', '.join(missing)}; about a minute)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with _services_blocked():
        for cmd in (
            ["apt-get", "-q", "update"],
            ["apt-get", "-q", "install", "-y", "--no-install-recommends", *PACKAGES],
        ):
            log(" ".join(cmd))
            done = subprocess.run(cmd, env=env, stdout=sys.stderr, check=False)
            if done.returncode != 0:
                raise ClusterError(f"`{' '.join(cmd)}` failed (exit {done.returncode})")
    log("packages installed")


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
    log(f"wrote a munge key to {key}")


def edit_hosts(edit: Callable[[str], str]) -> None:
    """Rewrite /etc/hosts in place (it may be a bind mount) under an exclusive lock."""
    with HOSTS_FILE.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read()
        new = edit(text)
        if new != text:
            f.seek(0)
            f.write(new)
            f.truncate()


def add_hosts(state: State) -> None:
    marker = hosts_marker(state.spec.state_dir)
    edit_hosts(lambda text: hosts_with_nodes(text, state.spec.nodes, marker))
    state.hosts_added = True
    state.save()
    log(f"added `127.0.0.1 {' '.join(state.spec.nodes)}` to {HOSTS_FILE}")


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
        pid_alive(pid, name) for name, pid in other.pids.items()
    )


def link_site_conf(state: State) -> None:
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
                f"experiments.cluster down --state-dir {other}`"
            )
        SITE_CONF.unlink()
        log(f"removed a stale {SITE_CONF} link to {other} (no cluster runs there)")
    if SITE_CONF.exists() or SITE_CONF.is_symlink():
        shutil.move(str(SITE_CONF), _saved_site_conf(state.spec))
        log(f"kept the existing {SITE_CONF} aside; `down` puts it back")
    SITE_CONF.parent.mkdir(parents=True, exist_ok=True)
    SITE_CONF.symlink_to(state.spec.conf_path)
    state.site_conf_linked = True
    state.save()
    log(f"linked {SITE_CONF} -> {state.spec.conf_path}")


def unlink_site_conf(state: State) -> None:
    if SITE_CONF.is_symlink() and SITE_CONF.readlink() == state.spec.conf_path:
        SITE_CONF.unlink()
    saved = _saved_site_conf(state.spec)
    if saved.exists() or saved.is_symlink():
        shutil.move(str(saved), SITE_CONF)
    log(f"restored {SITE_CONF}")
