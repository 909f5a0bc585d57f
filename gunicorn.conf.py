"""gunicorn settings (picked up automatically from the working directory)."""

import os

# The web processes use Django's bounded connection pool (settings: DB_POOL).
# Set here, in the master, before any worker imports Django: each worker
# creates its own pool lazily after the fork. Celery workers never read this
# file, so their prefork children never inherit a pool. DB_POOL=false in the
# environment turns it off.
os.environ.setdefault("DB_POOL", "true")

bind = os.environ.get("GUNICORN_BIND", f"0.0.0.0:{os.environ.get('PORT', '8000')}")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
accesslog = "-"


def child_exit(server, worker):
    """Multiprocess Prometheus: drop a dead web worker's live gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
