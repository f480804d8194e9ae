"""Rehearsal of the paper path on this machine: a local two-node Slurm cluster and its users."""
