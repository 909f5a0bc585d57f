"""gunicorn settings (picked up automatically from the working directory)."""

import os

# The web processes use Django's bounded connection pool (settings: DB_POOL).
# Set here, in the master, before any worker imports Django: each worker
# creates its own pool lazily after the fork. Celery workers never read this
# file, so their prefork children never inherit a pool. DB_POOL=false in the
# environment turns it off.
os.environ.setdefault("DB_POOL", "true")

# CPU priority on a shared host: WEB_NICE (e.g. 6) lowers the web processes'
# priority below the timer and payment workers', so a flood of requests (the
# only load that reaches web) slows the API before it delays payments; the
# master sets it and every worker it forks inherits it. docker-compose gives
# web a quarter of the CPU weight instead (cpu_shares). 0: unchanged.
if int(os.environ.get("WEB_NICE", "0")):
    os.nice(int(os.environ["WEB_NICE"]))

bind = os.environ.get("GUNICORN_BIND", f"0.0.0.0:{os.environ.get('PORT', '8000')}")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# Threads per worker process (gthread; 1 = the sync worker). 2 x 4 is what the
# benchmarks measure, and the best layout tried at 1,000 payments/s with the API
# load: schedule/status p95 79-87 / 49-61 ms, 4 sync workers 111 / 75, 4 x 2
# threads 100 / 71 (bench/results/2026-11-24-apidiag/). Keep
# DB_POOL_MAX_SIZE >= WEB_THREADS: each thread holds a connection per request.
threads = int(os.environ.get("WEB_THREADS", "4"))
accesslog = "-"


def child_exit(server, worker):
    """Multiprocess Prometheus: drop a dead web worker's live gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
