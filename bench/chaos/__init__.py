"""Chaos run: random crashes under load, then prove nothing was lost or paid twice.

    nice -n 10 .venv/bin/python bench/chaos.py --seed 1 --minutes 10 [--rate 50] [--workers 2]
                                               [--api-share 0.2] [--settle 180] [--out PATH]
    .venv/bin/python bench/chaos.py --seed 1 --minutes 10 --print-schedule

Runs the real service — ``--workers`` Celery workers, Celery beat, gunicorn —
on its own database ``scheduler_chaos`` and its own Redis server
(``redis-server`` on 127.0.0.1:6391, no persistence, a child of this script),
with ``PAYMENT_LEASE_SECONDS=5`` and a 30 s Redis visibility timeout so that
recovery is fast. For ``--minutes`` it

- creates ``--rate`` payments per second: most inserted directly (PENDING
  with their holds, like ``bench/run.py``), due now, in a few seconds or in
  up to 45 s; ``--api-share`` of them through the HTTP API with an
  ``Idempotency-Key`` (also copied into ``metadata.chaos_key``), retried with
  the same key on connection errors, 5xx and ``idempotency_key_in_use`` —
  some later cancelled or rescheduled / re-amounted through the API, some
  from an account without funds (must be refused), some to an account that
  is frozen before they are due (must end FAILED ``account_not_active``);
  two recurring schedules (every minute; one runs out of funds);
- injects faults on a schedule drawn from ``random.Random(seed)`` before the
  run starts (``--print-schedule`` shows it): SIGKILL of a worker's process
  group (a payment worker or the timer worker), of beat, of a gunicorn
  worker; Redis SIGKILL + restart on the same port; Redis FLUSHALL;
  ``pg_terminate_backend`` of all or some of the
  service's PostgreSQL backends, or for 3 s of every one caught inside a
  statement or transaction (only ``scheduler_chaos``'s, never this script's
  own connections, never another database). Killed processes are
  restarted after the scheduled downtime; a process that exits on its own is
  reported (``unexpected_exits``) and restarted, as a supervisor would.

Then it stops injecting and creating, brings everything up, waits (bounded:
the last due time plus ``--settle`` seconds) until no payment is open, stops
the service and checks: every payment terminal; none executed twice (one
journal entry, one succeeded attempt, one ``executed`` event per COMPLETED
payment); none executed early; none lost (every payment inserted, every API
request answered 201, exists; no Idempotency-Key produced two payments; a
refused request produced none); cancel / reschedule answers agree with the
final state; no FAILED payment without an expected reason; no active hold
left, holds captured or released consistently; every account's balance equals
its deposits plus completed payments; every payment's last audit event names its
status; recurring occurrences unique and without
gaps; ``manage.py reconcile_ledger`` clean. Dead-lettered payments (FAILED
``max_attempts_exceeded``) are listed with their history and fail the run
unless ``--allow-dead-letters``.

Prints a summary and writes it as JSON and Markdown, one line per check
(``bench/results/<date>-chaos-<seed>/chaos-<seed>-<time>.{json,md}`` or
``--out``). Exit status 0 when every check passes, 1 otherwise. Service
logs: ``var/bench-logs/chaos-*.log``. Every child runs in its own process group
under ``setpriv --pdeathsig KILL``; all are stopped on exit (normal, error,
Ctrl-C, SIGTERM/SIGHUP) and even when this script is SIGKILLed.

The package: ``faults`` (the seeded schedule and every fault; the processes
they hit), ``workload`` (direct inserts, the API client streams, recurring
schedules, frozen accounts), ``checks`` (the registered checks, run and
reported one by one), ``run`` (the run itself and its summary).
"""
