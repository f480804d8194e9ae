"""``python -m odb.planning``: the command of :mod:`odb.planning.cli`."""

import sys

from odb.planning.cli import main

main(sys.argv[1:])
