"""``python -m palaestra.cli`` runs the ``palaestra`` command."""

import sys

from palaestra.cli import main

sys.exit(main())
