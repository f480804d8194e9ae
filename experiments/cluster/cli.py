"""Run a command on the cluster (``run``: up, the command, down, whatever happens) and
the command line ``python -m experiments.cluster up|status|down|run``."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.cluster.daemons import State, client_env, signals_deferred
from experiments.cluster.lifecycle import down, is_running, status, up
from experiments.cluster.spec import DEFAULT_STATE_DIR, ClusterError, log

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
            log(f"signal {signum} during teardown: finishing the teardown first")
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
            log(f"running {' '.join(command)} with SLURM_CONF={state.spec.conf_path}")
            with signals_deferred():  # so that a signal always finds the child recorded
                signals.child = subprocess.Popen(list(command), env=client_env(state.spec))
            code = signals.child.wait()
            log(f"command exited with {code}")
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
        prog="python -m experiments.cluster", description=__doc__.split("\n\n")[0]
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
