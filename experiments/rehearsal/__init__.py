"""Rehearsal of the paper path on this machine: a hub mirror and a local Slurm cluster."""
