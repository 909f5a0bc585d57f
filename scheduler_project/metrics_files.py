"""Prometheus multiprocess files that stay apart across containers.

In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) every process writes its
samples to files named after its process identifier, and ``/metrics`` adds up
every file in the directory. prometheus_client's identifier is the PID, which
is unique only within one PID namespace: docker-compose shares one metrics
volume between containers, and there the payment worker's replicas are both
PID 1 (as are timers, recurring and webhooks), their pool children and the web
workers have the same small PIDs in every container. Two processes with one
identifier write one file — the later overwrites the earlier's counts, and
concurrent appends corrupt it. So the identifier is ``<host>-<pid>``: the host
name is the container's own (its id), the PID is unique inside it.

``-`` separates the two, never ``_``: prometheus_client splits file names on
``_`` and reads a gauge's ``pid`` label from the third part.
"""

from __future__ import annotations

import os
import socket


def _file_safe(host: str) -> str:
    return host.replace("_", "-") or "host"


_HOST = _file_safe(socket.gethostname())


def process_identifier(pid: int | None = None) -> str:
    """This process's identifier in metric file names (or that of ``pid`` on this host)."""
    return f"{_HOST}-{os.getpid() if pid is None else pid}"


def use_host_scoped_files() -> None:
    """Name this process's metric files by ``process_identifier``; call before any
    metric is created (``scheduler_project/__init__.py``). A no-op outside
    multiprocess mode."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue(process_identifier)


def mark_process_dead(pid: int) -> None:
    """Drop a dead process's live gauges (run by its parent or itself, on its host)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(process_identifier(pid))
