"""The load of a chaos run: its accounts and API client, direct inserts, API client
streams (with retries and follow-ups) and the recurring schedules."""

from __future__ import annotations

import heapq
import http.client
import json
import random
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from bench.chaos.config import WEB_PORT
from bench.harness.api_load import create_client
from bench.harness.clock import db_now
from bench.harness.load import bulk_schedule, fund_accounts


# ---------------------------------------------------------------- the API client
class Api:
    """One keep-alive connection; ``call`` retries until the answer is definite."""

    def __init__(self, token: str, budget: float, rng: random.Random) -> None:
        self.token = token
        self.budget = budget
        self.rng = rng
        self.conn: http.client.HTTPConnection | None = None

    def _send(self, method: str, path: str, body, key: str | None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", WEB_PORT, timeout=20)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if key:
            headers["Idempotency-Key"] = key
        try:
            self.conn.request(
                method, path, body=None if body is None else json.dumps(body), headers=headers
            )
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()
            self.conn = None
            return None, {"transport_error": type(exc).__name__}, False
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"raw": data[:200].decode(errors="replace")}
        return response.status, parsed, response.getheader("Idempotent-Replayed") == "true"

    def call(self, method: str, path: str, body=None, key: str | None = None) -> dict:
        started = time.monotonic()
        deadline = started + self.budget
        retried: list = []
        while True:
            status, parsed, replayed = self._send(method, path, body, key)
            error = parsed.get("error") if isinstance(parsed, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            again = status is None or status >= 500 or status == 429
            again = again or code == "idempotency_key_in_use"
            if not again:
                return {
                    "status": status,
                    "code": code,
                    "body": parsed,
                    "outcome": "ok" if status < 300 else "refused",
                    "replayed": replayed,
                    "retried": retried,
                    "seconds": round(time.monotonic() - started, 3),
                }
            retried.append(status or parsed.get("transport_error", "error"))
            if time.monotonic() > deadline:
                return {
                    "status": status,
                    "code": code,
                    "outcome": "unknown",
                    "retried": retried,
                    "seconds": round(time.monotonic() - started, 3),
                }
            time.sleep(min(0.1 * 2 ** min(len(retried), 6), 5.0) * (0.5 + self.rng.random()))


class ApiLoad(threading.Thread):
    """One stream of API traffic: schedules, and follow-up cancels / changes."""

    def __init__(self, index: int, seed: int, rate: float, setup: dict, shared: dict, stop):
        super().__init__(daemon=True, name=f"api-{index}")
        self.index = index
        self.rng = random.Random(f"{seed}:api:{index}")
        self.api = Api(
            setup["token"], setup["retry_budget"], random.Random(f"{seed}:retry:{index}")
        )
        self.interval = 1.0 / rate if rate > 0 else None
        self.setup = setup
        self.shared = shared
        self.stop = stop
        self.seed = seed
        self.ops: list[dict] = []
        self.followups: list = []
        self.n = 0
        self.error: str | None = None

    def key(self) -> str:
        self.n += 1
        return f"chaos-{self.seed}-{self.index}-{self.n}"

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported in the summary: a crashed stream is a finding
            self.error = f"{type(exc).__name__}: {exc}"
            raise

    def _run(self) -> None:
        if self.interval is None:
            return
        next_slot = time.monotonic() + self.rng.uniform(0, self.interval)
        while not self.stop.is_set():
            now = time.monotonic()
            if self.followups and self.followups[0][0] <= now:
                _, _, action, payment_id = heapq.heappop(self.followups)
                self.follow_up(action, payment_id)
                continue
            if now >= next_slot:
                self.schedule()
                next_slot = max(next_slot + self.interval, time.monotonic() - 5)
                continue
            wake = min(next_slot, self.followups[0][0] if self.followups else next_slot)
            self.stop.wait(max(0.0, min(wake - now, 0.5)))

    def schedule(self) -> None:
        rng, setup = self.rng, self.setup
        kind = rng.choices(
            ["plain", "at_time", "cancel", "change", "insufficient", "doomed"],
            [60, 5, 12, 12, 5, 6],
        )[0]
        source, target = rng.sample(setup["rich"], 2)
        if rng.random() < 0.5:
            target = rng.choice(setup["api_targets"])
        body: dict = {"from_account_id": source, "to_account_id": target}
        body["amount"] = rng.randint(1, 50)
        delay = rng.randint(1, 30)
        if kind == "at_time":
            when = datetime.now(UTC) + timedelta(seconds=rng.uniform(3, 20))
            body["scheduled_time"] = when.isoformat()
        elif kind in ("cancel", "change"):
            delay = rng.randint(5, 40)
        elif kind == "insufficient":
            body["from_account_id"] = setup["poor"]
            body["amount"] = 1000
        elif kind == "doomed":
            doomed = self.shared.get("doomed")
            if doomed is None:
                kind = "plain"
            else:
                body["to_account_id"] = doomed
                delay = rng.randint(25, 40)
        if "scheduled_time" not in body:
            body["delay_seconds"] = delay
        key = self.key()
        body["metadata"] = {"chaos_key": key, "kind": kind}
        result = self.api.call("POST", "/api/v1/payments/schedule", body, key)
        payment_id = (
            (result.get("body") or {}).get("payment_id") if result["status"] == 201 else None
        )
        self.ops.append(
            {"op": "schedule", "kind": kind, "key": key, "payment_id": payment_id, **brief(result)}
        )
        if payment_id and kind in ("cancel", "change"):
            after = rng.uniform(1, delay + 10) if kind == "cancel" else rng.uniform(1, delay + 5)
            heapq.heappush(self.followups, (time.monotonic() + after, self.n, kind, payment_id))

    def follow_up(self, action: str, payment_id: str) -> None:
        key = self.key()
        if action == "cancel":
            result = self.api.call(
                "POST", f"/api/v1/payments/{payment_id}/cancel", {"reason": "chaos"}, key
            )
            body = result.get("body") or {}
            self.ops.append(
                {
                    "op": "cancel",
                    "key": key,
                    "payment_id": payment_id,
                    "answer_status": body.get("status"),
                    **brief(result),
                }
            )
            return
        change: dict = {}
        if self.rng.random() < 0.7:
            change["delay_seconds"] = self.rng.randint(1, 30)
        if not change or self.rng.random() < 0.5:
            change["amount"] = self.rng.randint(1, 80)
        result = self.api.call("PATCH", f"/api/v1/payments/{payment_id}", change, key)
        body = result.get("body") or {}
        self.ops.append(
            {
                "op": "change",
                "key": key,
                "payment_id": payment_id,
                "change": change,
                "answer_scheduled_time": body.get("scheduled_time"),
                "answer_amount": body.get("amount"),
                **brief(result),
            }
        )


def brief(result: dict) -> dict:
    return {
        "status": result["status"],
        "code": result.get("code"),
        "outcome": result["outcome"],
        "replayed": result.get("replayed", False),
        "retries": len(result["retried"]),
        "seconds": result["seconds"],
        "retried_on": sorted({str(r) for r in result["retried"]}),
    }


# ---------------------------------------------------------------- data and direct load
def load_data(retry_budget: float) -> dict:
    """The run's API client, accounts rich and poor, direct-insert accounts."""
    from django.contrib.auth import get_user_model

    from bench.harness.app import account_create, deposit

    client = create_client("chaos-api", accounts=8, balance=10**9)
    user = get_user_model().objects.get(username="chaos-api")
    poor = account_create(owner=user, name="chaos poor")
    deposit(account_id=poor.pk, amount=5)
    poor_recurring = account_create(owner=user, name="chaos poor recurring")
    deposit(account_id=poor_recurring.pk, amount=4)
    return {
        "token": client["token"],
        "rich": client["account_ids"],
        "poor": poor.pk,
        "poor_recurring": poor_recurring.pk,
        "api_targets": fund_accounts(10, 0, name="chaos api target"),
        "direct_sources": fund_accounts(40, 10**9, name="chaos source"),
        "direct_targets": fund_accounts(40, 0, name="chaos target"),
        "retry_budget": retry_budget,
    }


def direct_load(rng: random.Random, setup: dict, count: int, ids: list[str]) -> None:
    """Insert ``count`` payments directly (due now, in 1-10 s or in 10-45 s); add their
    ids to ``ids``."""
    if count <= 0:
        return
    now = db_now()
    classes = [(0.0, 0.0), (1.0, 10.0), (10.0, 45.0)]
    picks = Counter(rng.choices(range(3), [30, 50, 20], k=count))
    for cls, n in sorted(picks.items()):
        low, high = classes[cls]
        sources = rng.sample(setup["direct_sources"], min(n, 8))
        targets = rng.sample(setup["direct_targets"], min(n, 8))
        ids += bulk_schedule(
            sources=sources,
            targets=targets,
            count=n,
            amount=rng.randint(1, 20),
            due_at=now + timedelta(seconds=rng.uniform(low, high)),
        )


def create_recurring(setup: dict, schedules: list[dict]) -> None:
    """Two recurring schedules through the API (every minute, and one that runs out of
    funds), each added to ``schedules`` as it is created."""
    api = Api(setup["token"], 60, random.Random(0))
    for label, body in (
        (
            "every_minute",
            {
                "from_account_id": setup["rich"][0],
                "to_account_id": setup["api_targets"][0],
                "amount": 3,
                "cron": "* * * * *",
                "timezone": "Europe/Paris",
                "missed_run_policy": "run_all",
                "max_catch_up": 5,
                "description": "chaos recurring",
            },
        ),
        (
            "underfunded",
            {
                "from_account_id": setup["poor_recurring"],
                "to_account_id": setup["api_targets"][1],
                "amount": 2,
                "interval_seconds": 60,
                "description": "chaos recurring, runs out of funds",
            },
        ),
    ):
        result = api.call("POST", "/api/v1/recurring-payments", body, f"chaos-rec-{label}")
        if result["status"] != 201:
            raise RuntimeError(f"recurring create failed: {result}")
        schedules.append({"label": label, "id": result["body"]["recurring_payment_id"]})
