"""Where the chaos run lives (its own database, Redis server and port) and how it logs."""

from __future__ import annotations

import time
from datetime import UTC, datetime

DATABASE = "scheduler_chaos"
REDIS_PORT = 6391
WEB_PORT = 8791
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
DRIVER_APP = "chaos-driver"  # application_name of this script's own connections: never killed
SERVICE_ENV = {
    "CELERY_BROKER_URL": REDIS_URL,
    "PAYMENT_LEASE_SECONDS": "5",
    "CELERY_VISIBILITY_TIMEOUT": "30",
}


def log(message: str, t0: float | None = None) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
    offset = f" +{time.monotonic() - t0:7.1f}s" if t0 is not None else ""
    print(f"[{stamp}{offset}] {message}", flush=True)
