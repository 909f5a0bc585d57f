"""gunicorn settings (picked up automatically from the working directory)."""

import os

# The web processes use Django's bounded connection pool (settings: DB_POOL).
# Set here, in the master, before any worker imports Django: each worker
# creates its own pool lazily after the fork. Celery workers never read this
# file, so their prefork children never inherit a pool. DB_POOL=false in the
# environment turns it off.
os.environ.setdefault("DB_POOL", "true")

# CPU priority: WEB_NICE (e.g. 6) lowers the web workers' priority below the
# timer and payment workers', so a flood of requests slows the API before it
# delays payments. It is set in each worker after the fork (post_fork), never
# in the master, so a reload (SIGHUP re-reads this file) does not add to it.
# A nice level acts only against processes of the same scheduling group: with
# the kernel's autogroups (on by default in desktop and many server kernels)
# every session is one group, and under systemd or in a container every
# cgroup is; there it takes the group's weight — docker-compose's
# cpu_shares: 256 for web, systemd's CPUWeight=, /proc/<pid>/autogroup — to
# rank the web below the workers (README, "Configuration"). 0: unchanged.
WEB_NICE = int(os.environ.get("WEB_NICE", "0"))

bind = os.environ.get("GUNICORN_BIND", f"0.0.0.0:{os.environ.get('PORT', '8000')}")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# Threads per worker process (gthread; 1 = the sync worker). 2 x 4 is what the
# benchmarks measure, and the best layout tried at 1,000 payments/s with the API
# load: schedule/status p95 79-87 / 49-61 ms, 4 sync workers 111 / 75, 4 x 2
# threads 100 / 71 (bench/results/2026-11-24-apidiag/). Keep
# DB_POOL_MAX_SIZE >= WEB_THREADS: each thread holds a connection per request.
threads = int(os.environ.get("WEB_THREADS", "4"))
accesslog = "-"


def post_fork(server, worker):
    """WEB_NICE, in each worker once (above)."""
    if WEB_NICE:
        os.nice(WEB_NICE)


def child_exit(server, worker):
    """Multiprocess Prometheus: drop a dead web worker's live gauges."""
    from scheduler_project.metrics_files import mark_process_dead

    mark_process_dead(worker.pid)
