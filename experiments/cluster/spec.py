"""What the local cluster is: its settings (:class:`ClusterSpec`), its ``slurm.conf``,
its ``/etc/hosts`` line, and the free ports it listens on. Pure text and arithmetic,
nothing started."""

from __future__ import annotations

import os
import random
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
STOP_GRACE_S = 10.0


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
        "# Written by python -m experiments.cluster; removed by its `down`.",
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


def log(message: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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
