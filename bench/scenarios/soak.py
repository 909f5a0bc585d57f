"""Soak the embedded default: ``./scripts/dev`` for an hour under steady API load.

    .venv/bin/python bench/soak.py [--minutes 60] [--rate 10] [--port 8097]

Starts ``./scripts/dev`` exactly as a user would (SQLite + the embedded
broker, web + every worker + beat under honcho) with a fresh ``VAR_DIR``
(``var/soak-<timestamp>``, so your own dev data is untouched), reads the demo
token and accounts it prints, and schedules ``--rate`` payments per second
through the API (1 unit, due 1-10 s later, alternating direction between the
two demo accounts) for ``--minutes``. Then it waits for every payment to be
terminal, stops the service with Ctrl-C (SIGINT) like a user, and checks:

- no process exited on its own (honcho prints ``stopped (rc=…)`` and stops
  everything when one dies) and no ``Unrecoverable error`` in the output;
- every 201 answered exists, is COMPLETED, has exactly one journal entry and
  did not run before its scheduled time; no other payment exists;
- ``manage.py reconcile_ledger --json`` is clean.

Writes ``bench/results/<date>-soak/summary.json`` and the service output
``service.log``; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.harness.processes import ROOT
from bench.harness.report import results_dir


def start_dev(env: dict, log_path: Path) -> tuple[subprocess.Popen, list[str]]:
    log = open(log_path, "w")  # noqa: SIM115 - open for the life of the service
    proc = subprocess.Popen(
        ["./scripts/dev"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            log.flush()

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def demo_login(lines: list[str]) -> tuple[str, list[int]]:
    text = "".join(lines)
    token = re.search(r"Token:\s+(\S+)", text)
    accounts = [int(a) for a in re.findall(r"Account:\s+#(\d+)", text)]
    return (token.group(1), accounts) if token and len(accounts) >= 2 else None


def load(port: int, token: str, accounts: list[int], rate: float, seconds: float) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    rng = random.Random(3)
    created, statuses, latencies = [], {}, []
    start = time.monotonic()
    for i in range(int(rate * seconds)):
        slot = start + i / rate
        if (delay := slot - time.monotonic()) > 0:
            time.sleep(delay)
        source, target = (accounts[0], accounts[1]) if i % 2 == 0 else (accounts[1], accounts[0])
        body = json.dumps(
            {
                "from_account_id": source,
                "to_account_id": target,
                "amount": 1,
                "delay_seconds": rng.randint(1, 10),
            }
        )
        sent = time.monotonic()
        try:
            conn.request("POST", "/api/v1/payments/schedule", body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            status = response.status
        except OSError as exc:
            conn.close()
            status, data = type(exc).__name__, b""
        latencies.append(time.monotonic() - sent)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status == 201:
            created.append(json.loads(data)["payment_id"])
    return {"created": created, "statuses": statuses, "latencies": latencies}


def verify(env: dict, created: list[str]) -> dict:
    """Exactly-once checks against the soak's own SQLite database, in this process."""
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings.base")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db.models import Count, F

    from bench.harness.app import JournalEntry, Payment

    payments = Payment.objects.filter(pk__in=created)
    entries = dict(
        JournalEntry.objects.filter(reference__in=[f"payment:{p}" for p in created])
        .values_list("reference")
        .annotate(n=Count("pk"))
    )
    rows = list(payments.values_list("executed_at", "due_at"))
    lateness = sorted((e - d).total_seconds() for e, d in rows if e)

    def pct(p):
        return round(lateness[min(len(lateness) - 1, int(p * len(lateness)))], 3)

    return {
        "payments_created": len(created),
        "found": payments.count(),
        "statuses": dict(payments.values_list("status").annotate(n=Count("pk"))),
        "lost": len(created) - payments.count(),
        "with_exactly_one_entry": sum(1 for n in entries.values() if n == 1),
        "duplicates": sum(n - 1 for n in entries.values() if n > 1),
        "executed_early": payments.filter(executed_at__lt=F("due_at")).count(),
        "other_payments": Payment.objects.exclude(pk__in=created).count(),
        "lateness_seconds": {"p50": pct(0.5), "p99": pct(0.99), "max": lateness[-1]}
        if lateness
        else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=10)
    parser.add_argument("--port", type=int, default=8097)
    args = parser.parse_args()

    started = datetime.now(UTC)
    var_dir = ROOT / "var" / f"soak-{started:%Y%m%dT%H%M%S}"
    out = results_dir("soak", started)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")
    }
    env |= {
        "VAR_DIR": str(var_dir),
        # scripts/dev writes its .env (DEBUG, SECRET_KEY) there; the checks read it too
        "ENV_FILE": str(var_dir / ".env"),
        "WEB_PORT": str(args.port),
        "PYTHONUNBUFFERED": "1",
    }
    var_dir.mkdir(parents=True)
    proc, lines = start_dev(env, out / "service.log")
    token, accounts = wait_for(lambda: demo_login(lines), 600, "the demo token")
    wait_for(lambda: "Quit the server" in "".join(lines), 120, "the web server")
    time.sleep(5)  # workers and beat connect
    print(f"soak: {args.minutes} min at {args.rate}/s on port {args.port}, VAR_DIR {var_dir}")
    result = load(args.port, token, accounts, args.rate, args.minutes * 60)
    alive_after_load = proc.poll() is None
    # let the last payments run (due up to 10 s later), then stop like a user (Ctrl-C)
    time.sleep(30)
    alive_at_end = proc.poll() is None
    before_stop = "".join(lines)
    if alive_at_end:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(lines)
    reconcile = subprocess.run(
        [sys.executable, "manage.py", "reconcile_ledger", "--json", "--no-progress"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    checks = verify(env, result["created"])
    latencies = sorted(result["latencies"])
    summary = {
        "started_at": started.isoformat(timespec="seconds"),
        "minutes": args.minutes,
        "rate": args.rate,
        "var_dir": str(var_dir),
        "api_statuses": result["statuses"],
        "api_latency_ms_p99": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1),
        "service_alive_after_load": alive_after_load,
        "service_alive_at_end": alive_at_end,
        # honcho reports a process that ended, then stops all the others
        "process_exits": re.findall(r"\| (\S+) stopped \(rc=", before_stop),
        "unrecoverable_errors": output.count("Unrecoverable error"),
        "tracebacks": output.count("Traceback (most recent call last)"),
        "reconcile_ok": reconcile.returncode == 0,
        **checks,
    }
    summary["ok"] = (
        alive_after_load
        and alive_at_end
        and not summary["process_exits"]
        and summary["unrecoverable_errors"] == 0
        and checks["lost"] == 0
        and checks["duplicates"] == 0
        and checks["executed_early"] == 0
        and checks["statuses"] == {"COMPLETED": len(result["created"])}
        and checks["with_exactly_one_entry"] == len(result["created"])
        and checks["other_payments"] == 0
        and summary["reconcile_ok"]
        and set(result["statuses"]) == {"201"}
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
