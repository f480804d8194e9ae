"""Test suite; mirrors the package layout. `harness.ranks` is the helper for distributed tests.

This file makes `tests` a package so spawned rank processes can import test modules
by their dotted name (`tests.test_x`) when unpickling module-level functions.
"""
