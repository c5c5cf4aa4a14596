"""Helpers for tests that start palaestra in a child process and signal it."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """``preexec_fn`` for a child that a test stops with Ctrl-C (SIGINT): the default action, as a
    terminal delivers it, even where the suite was started in the background by a shell, which
    starts its children with SIGINT ignored (Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
