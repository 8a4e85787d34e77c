"""Signals a test sends to its own process."""

from __future__ import annotations

import signal
import threading


def send_ctrl_c() -> None:
    """A real SIGINT to the main thread: unlike ``_thread.interrupt_main()`` it also breaks a
    blocking read (a pipe, a watch stream) the main thread is waiting in."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
