"""The bench suite's shared harness.

- ``processes``  the service as real processes (gunicorn, celery workers, beat)
  and their environment;
- ``db``         a scenario's own database and Redis db, Django set up in-process;
- ``load``       funded accounts and PENDING payments inserted fast;
- ``api_load``   API clients and open-loop HTTP request streams;
- ``clock``      the database clock (due times, lateness);
- ``metrics``    process-tree CPU and RSS, PostgreSQL backend CPU, percentiles;
- ``lockwaits``  lock waits sampled from ``pg_stat_activity`` over a window;
- ``checks``     exactly-once counts against the ledger;
- ``report``     ``bench/results/<date>-<name>/`` and Markdown; ``charts`` its PNGs;
- ``app``        every name bench takes from the service's apps, in one place;
- ``bare_wsgi``  a WSGI app that does nothing (``api_latency --bare``: gunicorn's own cost).

Nothing here imports Django or the apps at import time: ``app`` is imported
inside functions, after ``db.prepare`` has set Django up.
"""
