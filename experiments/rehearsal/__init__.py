"""The paper path rehearsed on this machine: a local Slurm cluster, a hub-layout mirror, the run;
and LLaMA-Factory's SFT stage run with ODB at W=2 in its own venv (``llamafactory_check``:
not ``llamafactory.py``, which, run as a script, would import itself for the package)."""
