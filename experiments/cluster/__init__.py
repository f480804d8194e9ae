"""A real two-node Slurm cluster on this machine, started and stopped by pid.

The paper path (`snakemake --profile slurm`) needs `sbatch`, `srun` and two nodes whose
names resolve for torchrun's c10d rendezvous. This module brings up exactly that with
Debian's `slurm-wlm` 22.05 and `munge`, as root:

    python -m experiments.cluster run -- snakemake --profile slurm ...
    python -m experiments.cluster up        # prints `export SLURM_CONF=...`
    python -m experiments.cluster status
    python -m experiments.cluster down

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

Modules: ``spec`` (settings, conf text, hosts line, ports), ``host`` (packages, munge
key, ``/etc/hosts``, the site conf link), ``daemons`` (pids, start, stop, logs),
``lifecycle`` (up, status, down), ``cli`` (run, the command line).
"""

from experiments.cluster.cli import main, run
from experiments.cluster.daemons import State, client_env
from experiments.cluster.lifecycle import down, is_running, nodes_idle, status, up
from experiments.cluster.spec import (
    DEFAULT_STATE_DIR,
    SITE_CONF,
    ClusterError,
    ClusterSpec,
    hosts_marker,
    hosts_with_nodes,
    hosts_without_nodes,
    slurm_conf,
)

__all__ = [
    "DEFAULT_STATE_DIR", "SITE_CONF", "ClusterError", "ClusterSpec", "State", "client_env",
    "down", "hosts_marker", "hosts_with_nodes", "hosts_without_nodes", "is_running", "main",
    "nodes_idle", "run", "slurm_conf", "status", "up",
]  # fmt: skip
