"""``python -m palaestra`` runs the ``palaestra`` command (``torchrun -m palaestra train ...`` too)."""

import os
import sys

from palaestra.cli import main

code = main()
if "TORCHELASTIC_RUN_ID" in os.environ:
    # A rank of torchrun's has left its process group and said what it had to: it ends here, without
    # the interpreter's teardown, in which gloo's threads can abort the process (SIGABRT) after a
    # clean run or refusal, and the launcher then reports a signal instead of the rank's status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
