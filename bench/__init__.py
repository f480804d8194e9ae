"""Benchmarks that print JSON; run on demand, not part of the timed test suite.

Each module is one benchmark (`python -m bench.<name> --out F`); the commands, the
machine and the results are in `docs/benchmarks.md`.
"""
