"""ODB's process machinery and I/O: the collate side, its transports, the hand-off.

Private: nothing outside ``odb`` imports it (checked by the import contracts in
``pyproject.toml``). The module names say where the code runs:

- ``collate_*`` runs on the collate side (a collate process per loader and rank, or a
  thread in ``collate_mode="thread"``): ``collate_process`` (its life across epochs),
  ``collate_body`` (the body that runs there, one epoch a call), ``collate_epoch`` (the
  epoch driver on real collectives), ``collate_sources`` (the DataLoader workers' view
  of the dataset);
- ``trainer_*`` runs in the trainer: ``trainer_runner`` (deadlines and the error
  contract), ``trainer_transport`` (process or thread, one interface),
  ``trainer_startup`` (the main-guard check and the start-up handshake);
- the rest serves both sides: ``messages`` (what crosses: the collate spec, jobs, results),
  ``handoff`` (batches in shared-memory blocks), ``batch_pool`` (the pool collate
  functions build big fields in), ``pickling``, ``comm`` (rendezvous and the alignment
  group), ``forking``, ``torch_shm``, ``diagnostics``.
"""
