"""Sandboxes for code the gateway runs on a model's behalf (``code_interpreter``, issue 34).

:mod:`security.sandbox.base` is the interface (containers, runs, failures, limits);
:mod:`security.sandbox.local` the embedded backend (bubblewrap namespaces on this host).
"""

from security.sandbox.base import Availability, Container, Failure, FileChange, FileEntry, Limits, RunResult, Sandbox

__all__ = ["Availability", "Container", "FileChange", "FileEntry", "Failure", "Limits", "RunResult", "Sandbox"]
