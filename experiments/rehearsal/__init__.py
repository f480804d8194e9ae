"""The paper path rehearsed on this machine: a local Slurm cluster, a hub-layout mirror, the run."""
