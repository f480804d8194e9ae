"""Real multi-rank runs on one machine, shared by the tests, the benchmarks and the
examples' checks: nothing here is a test, and nothing here imports the tests.

- :mod:`harness.ranks`: ``run_ranks`` runs a function on ``W`` local rank processes over
  Gloo on loopback (a warm pool, a hard timeout, every hung rank's stack), and
  ``run_torchrun`` a script or module under ``torchrun``;
- :mod:`harness.rank_process`: what runs inside such a rank process;
- :mod:`harness.scenarios`: seeded loader scenarios (datasets, set-ups, checks) the
  randomized tests and the soak both draw.
"""
