"""Benchmarks that print JSON; run on demand, not part of the timed test suite.

Nothing is implemented yet.
"""
