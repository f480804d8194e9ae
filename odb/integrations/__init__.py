"""Adapters that run ODB loaders inside training frameworks, each importing its framework lazily.

``import odb`` and ``import odb.integrations`` stay torch-only; a framework is imported
when its adapter module is:

- :mod:`odb.integrations.hf_trainer`: :class:`~odb.integrations.hf_trainer.ODBTrainer`, a
  ``transformers.Trainer`` fed by an ODB loader (DDP or DeepSpeed through the Trainer).
- :mod:`odb.integrations.trl`: :class:`~odb.integrations.trl.ODBSFTTrainer`, TRL's
  ``SFTTrainer`` fed by an ODB loader over the dataset TRL prepared (the same code as
  ``ODBTrainer``, :class:`~odb.integrations.hf_trainer.ODBTrainerMixin`).
- :mod:`odb.integrations.accelerate`: ``prepare`` that leaves ODB loaders untouched, and
  ``windows`` for an Accelerate loop.
- :mod:`odb.integrations.deepspeed`: ``windows`` for a DeepSpeed engine loop.
- :mod:`odb.integrations.ddp`: ``windows`` for a plain ``DistributedDataParallel`` loop
  (torch-only).
- :mod:`odb.integrations.fsdp`: ``windows`` for a ``fully_shard`` (FSDP2) loop, and
  ``save_checkpoint`` / ``load_checkpoint``: the sharded model and optimizer through
  ``torch.distributed.checkpoint`` beside every rank's loader piece (torch-only; the
  one reader of FSDP's private state is ``_fsdp_state``).

Shared, torch-only pieces: :mod:`odb.integrations.window` (gradient-accumulation windows
of a loader, the step info popped) and :mod:`odb.integrations.schedule` (a learning-rate
scheduler driven by training progress instead of a step count). Usage:
``docs/integrations.md``.
"""

from odb.integrations.schedule import ProgressLR
from odb.integrations.window import Window, adapt_windows, iter_windows

__all__ = ["ProgressLR", "Window", "adapt_windows", "iter_windows"]
