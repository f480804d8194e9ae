"""The local Slurm cluster: its config and hosts edits (pure), and real daemons end to end.

The end-to-end tests install `slurm-wlm` and `munge` when missing (as root), start the
cluster through `cluster run`, and check that nothing it started outlives the call.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments import cluster
from experiments.cluster import (
    SITE_CONF,
    ClusterSpec,
    State,
    hosts_marker,
    hosts_with_nodes,
    hosts_without_nodes,
    nodes_idle,
    slurm_conf,
)
from experiments.cluster import host as cluster_host
from experiments.cluster.host import link_site_conf
from harness.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="starts Slurm daemons and edits /etc/hosts: run the suite as root (CI does)",
)

WORKER = """\
import os, sys
from pathlib import Path
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
Path(sys.argv[1], f"rank{rank}.txt").write_text(f"{os.environ['SLURMD_NODENAME']} {total.item()}")
dist.destroy_process_group()
"""

# The job runs the paper grid's own 2-node launcher (config/paper.yaml) in the
# environment a Snakemake rule gets inside its Slurm job: the job-step executor drops every
# SLURM_* variable but the job's identity (SLURM_CONF and SLURM_JOB_NODELIST included), so
# the launcher must find the cluster and the first node without them.
JOB = """\
#!/bin/bash
set -euo pipefail
setsid sleep 600 </dev/null >/dev/null 2>&1 &  # escapes its step: `down` must find it
keep=" SLURM_JOB_ID SLURM_JOBID SLURM_CLUSTER_NAME SLURM_SUBMIT_DIR SLURM_SUBMIT_HOST "
for var in $(compgen -e | grep '^SLURM_'); do
  [[ $keep == *" $var "* ]] || unset "$var"
done
{launcher} {worker} {out}
"""


def _paper_launcher(port: int) -> str:
    """config/paper.yaml's multinode launcher for 2 nodes x 1 rank, on a free port."""
    import yaml

    template = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["train"][
        "multinode_launcher"
    ]
    assert ":29500" in template
    launcher = template.format(nodes=2, procs=1, threads=1).replace(":29500", f":{port}")
    # a node left out of the rendezvous fails in a minute, not torchrun's ten
    return launcher.replace(
        "--rdzv_backend c10d", "--rdzv_backend c10d --rdzv_conf join_timeout=60"
    )


# The driver's last line exits 7 so the test also sees that `run` returns its command's code.
DRIVER = """\
set -euo pipefail
sbatch --wait -N 2 --ntasks-per-node 1 --partition gpu --time 10 -o {out}/job.log {job}
exit 7
"""


def _spec(**changes: object) -> ClusterSpec:
    fields: dict[str, object] = dict(
        state_dir=Path("/tmp/s"),
        hostname="box",
        ctld_port=17000,
        node_ports=(17001, 17002),
        cpus=2,
        memory_mb=10000,
    )
    return ClusterSpec(**{**fields, **changes})  # type: ignore[arg-type]


def test_slurm_conf_has_two_nodes_on_this_host_and_two_partitions() -> None:
    conf = slurm_conf(_spec())
    assert "SlurmctldHost=box(127.0.0.1)" in conf
    assert "SlurmctldPort=17000" in conf
    assert "NodeName=n1 NodeHostname=box NodeAddr=127.0.0.1 Port=17001 CPUs=2" in conf
    assert "NodeName=n2 NodeHostname=box NodeAddr=127.0.0.1 Port=17002 CPUs=2" in conf
    assert "PartitionName=gpu Nodes=n1,n2 Default=YES" in conf
    assert "PartitionName=cpu Nodes=n1,n2 Default=NO" in conf
    for setting in (
        "SlurmUser=root",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "MpiDefault=none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SlurmdSpoolDir=/tmp/s/spool/%n",
        "SlurmdPidFile=/tmp/s/slurmd-%n.pid",
        "StateSaveLocation=/tmp/s/ctld",
        "MinJobAge=300",
        "AuthInfo=socket=/tmp/s/munge/munge.socket",
    ):
        assert setting in conf.splitlines(), setting


@pytest.mark.parametrize(
    "changes",
    [
        dict(node_ports=(17001,)),
        dict(node_ports=(17000, 17002)),
        dict(cpus=0),
        dict(state_dir=Path("relative")),
    ],
)
def test_spec_rejects_bad_values(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _spec(**changes)


def test_hosts_lines_are_added_once_and_removed_byte_for_byte() -> None:
    original = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
    marker = hosts_marker(Path("/tmp/a"))
    added = hosts_with_nodes(hosts_with_nodes(original, ("n1", "n2"), marker), ("n1",), marker)
    assert added == original + f"127.0.0.1 n1 {marker}\n"
    other = hosts_with_nodes(added, ("n1", "n2"), hosts_marker(Path("/tmp/b")))
    assert hosts_without_nodes(other, marker).startswith(original)
    assert hosts_without_nodes(added, marker) == original
    assert hosts_with_nodes("x", ("n1",), marker) == f"x\n127.0.0.1 n1 {marker}\n"


def test_nodes_idle_needs_every_node_idle_in_every_partition() -> None:
    assert nodes_idle("n1 idle\nn1 idle\nn2 idle\nn2 idle\n", ("n1", "n2"))
    assert not nodes_idle("n1 idle\nn2 idle*\n", ("n1", "n2"))
    assert not nodes_idle("n1 idle\nn1 down\nn2 idle\n", ("n1", "n2"))
    assert not nodes_idle("n1 idle\n", ("n1", "n2"))
    assert not nodes_idle("", ("n1",))


def _recorded_cluster(state_dir: Path, pids: dict[str, int]) -> State:
    """A cluster's state in `state_dir` as `up` records it, naming `pids`."""
    state_dir.mkdir()
    state = State(_spec(state_dir=state_dir), pids)
    state.save()
    return state


def test_site_conf_link_replaces_a_dead_clusters_link_and_refuses_a_live_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site_conf = tmp_path / "etc" / "slurm.conf"
    monkeypatch.setattr(cluster_host, "SITE_CONF", site_conf)  # where the link is made
    site_conf.parent.mkdir()
    ours = _recorded_cluster(tmp_path / "ours", {})
    # a machine restarted under a cluster: its link stays, its daemons are gone
    dead = subprocess.Popen(["true"])
    dead.wait()
    _recorded_cluster(tmp_path / "dead", {"slurmctld": dead.pid})
    site_conf.symlink_to(tmp_path / "dead" / "slurm.conf")
    link_site_conf(ours)
    assert site_conf.readlink() == ours.spec.conf_path
    assert not (tmp_path / "ours" / "site-slurm.conf.saved").exists()  # nothing to restore

    site_conf.unlink()
    live = subprocess.Popen(["bash", "-c", "exec -a slurmctld sleep 60"])
    try:
        # Until the child has exec'd, its cmdline is this interpreter's (seen on a loaded
        # machine): the cluster is "up" only once the daemon's name shows.
        deadline = time.monotonic() + 30
        while b"slurmctld" not in Path(f"/proc/{live.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the stand-in slurmctld never started"
            time.sleep(0.01)
        _recorded_cluster(tmp_path / "live", {"slurmctld": live.pid})
        site_conf.symlink_to(tmp_path / "live" / "slurm.conf")
        with pytest.raises(cluster.ClusterError, match="another local cluster is up"):
            link_site_conf(ours)
        assert site_conf.readlink() == tmp_path / "live" / "slurm.conf"  # left as it was
    finally:
        live.kill()
        live.wait()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Under /tmp, not pytest's 0700 tmp_path: munged runs as the munge user and must reach it.
    path = Path(tempfile.mkdtemp(prefix="odb-slurm-", dir="/tmp"))
    yield path
    subprocess.run(
        [sys.executable, "-m", "experiments.cluster", "down", "--state-dir", str(path)],
        env=_env(),
        timeout=120,
        check=False,
    )
    shutil.rmtree(path, ignore_errors=True)  # a test that failed before `up` wrote its state


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # `python`
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    }


def _cluster_processes(state_dir: Path) -> list[str]:
    """Live (not zombie) processes whose command line names `state_dir`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode()
            zombie = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):
            continue
        if str(state_dir) in cmdline and not zombie and "experiments.rehearsal" not in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def _cluster_run(state_dir: Path, *command: str) -> list[str]:
    """`cluster run` of `command` on a cluster in `state_dir`."""
    return [
        sys.executable,
        "-m",
        "experiments.cluster",
        "run",
        "--state-dir",
        str(state_dir),
        "--",
        *command,
    ]


def _job_processes(state_dir: Path) -> list[str]:
    """Live processes whose environment names this cluster (a job's, or a daemon's)."""
    tag = f"SLURM_CONF={state_dir}/".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = proc.joinpath("environ").read_bytes().split(b"\0")
            zombie = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            cmdline = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if not zombie and any(var.startswith(tag) for var in environ):
            found.append(f"{proc.name}: {cmdline}")
    return found


def _assert_gone(state_dir: Path, hosts_before: str) -> None:
    assert _cluster_processes(state_dir) == []
    assert _job_processes(state_dir) == []
    hosts = Path("/etc/hosts").read_text()
    assert hosts_marker(state_dir) not in hosts
    assert set(hosts_before.splitlines()) <= set(hosts.splitlines())
    assert not state_dir.exists()
    assert not SITE_CONF.is_symlink()  # its link to the cluster's conf is gone


@needs_root
@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_two_node_torchrun_rendezvous_through_sbatch(tmp_path: Path, state_dir: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "job.sh").write_text(
        JOB.format(launcher=_paper_launcher(free_port()), worker=tmp_path / "worker.py", out=out)
    )
    (tmp_path / "driver.sh").write_text(DRIVER.format(out=out, job=tmp_path / "job.sh"))
    hosts_before = Path("/etc/hosts").read_text()

    done = subprocess.run(
        _cluster_run(state_dir, "bash", str(tmp_path / "driver.sh")),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )

    log = (out / "job.log").read_text() if (out / "job.log").exists() else "(no job log)"
    assert done.returncode == 7, f"{done.stdout}\n{done.stderr}\n{log}"
    ranks = {p.name: p.read_text().split() for p in out.glob("rank*.txt")}
    assert sorted(ranks) == ["rank0.txt", "rank1.txt"], log
    assert {node for node, _ in ranks.values()} == {"n1", "n2"}  # one task on each node
    assert {float(total) for _, total in ranks.values()} == {3.0}  # 1 + 2 over Gloo
    _assert_gone(state_dir, hosts_before)


@needs_root
@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_sigterm_stops_the_command_and_the_cluster(state_dir: Path) -> None:
    hosts_before = Path("/etc/hosts").read_text()
    proc = subprocess.Popen(
        _cluster_run(state_dir, "sleep", "600"),
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    state_file = state_dir / "state.json"
    deadline = time.monotonic() + 500
    while not (state_file.exists() and "slurmd-n2" in json.loads(state_file.read_text())["pids"]):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.5)
    time.sleep(1.0)  # let it pass the idle wait into the command, or not: both must clean up
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    _assert_gone(state_dir, hosts_before)
