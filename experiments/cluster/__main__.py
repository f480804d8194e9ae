"""``python -m experiments.cluster``: the command line of :mod:`experiments.cluster.cli`."""

import sys

from experiments.cluster.cli import main

sys.exit(main())
