"""``python -m bench.real_pipeline``: see :mod:`bench.real_pipeline`."""

from bench.real_pipeline.cli import main

main()
