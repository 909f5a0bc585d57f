"""gunicorn settings (picked up automatically from the working directory)."""

import os

# The web processes use Django's bounded connection pool (settings: DB_POOL).
# Set here, in the master, before any worker imports Django: each worker
# creates its own pool lazily after the fork. Celery workers never read this
# file, so their prefork children never inherit a pool. DB_POOL=false in the
# environment turns it off.
os.environ.setdefault("DB_POOL", "true")

# CPU priority on a shared host: the web processes run at nice WEB_NICE
# (default 6), below the timer and payment workers, so when the host's cores
# are contended a flood of requests slows the API before it delays payments.
# The master sets it and every worker it forks inherits it; idle CPU is still
# all the web's to use. docker-compose gives web the same 1:4 weight as
# cpu_shares. Measured with the capacity scenario (README, "Performance and
# reliability"): at 1,500 payments/s with the API load, on a host 90 % busy,
# nice 0 missed the SLO in 2 runs of 2 (p99 16.8 s, 6.9 s: the web's CPU rose
# for some seconds and took the payment worker's share) and nice 6 met it
# (p99 0.545 s, schedule / status p95 64 / 20 ms). 0: unchanged.
WEB_NICE = int(os.environ.get("WEB_NICE", "6"))
if WEB_NICE:
    os.nice(WEB_NICE)

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
