"""ODB's pure logic and the data contracts every layer shares.

Deterministic and single-process: no processes, threads, sockets, pickling, signals,
``os`` or ``torch.distributed`` (checked by the import contracts in ``pyproject.toml``),
so everything here is tested without spawning anything. The process machinery in
:mod:`odb._process` drives it; nothing here imports that, :mod:`odb.integrations` or
the public modules.

- budget, grouping, buffer: what a step costs, how a buffer is grouped into steps, the
  buffer itself;
- alignment, rounds, lockstep: a round's plan from all ranks' statuses, one rank's round
  state, the round driver;
- steps, step_info, loss, metrics: batches with their step info, the loss normaliser,
  the figures of ``stats()``;
- sharding, detect, resume, ledger, progress: per-epoch views and the shard decision,
  resume state, the exactly-once ledger, progress for schedulers;
- config, checks: the validated configs and the argument checks.
"""
