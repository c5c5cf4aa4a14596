"""``python -m palaestra`` runs the ``palaestra`` command (``torchrun -m palaestra train ...`` too)."""

import sys

from palaestra.cli import main

sys.exit(main())
