"""``manage.py sweep_due``: run the sweeper once, now (what beat does every second)."""

import json

from django.core.management.base import BaseCommand

from payments.tasks import sweep_once


class Command(BaseCommand):
    help = "Claim due payments and publish them to the partition queues."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        result = sweep_once()
        summary = {
            "claimed": result.claimed,
            "messages": result.messages,
            "batches": result.batches,
            "backpressure": result.backpressure,
            "work_ahead": result.work_ahead,
            "executor_lag_seconds": round(result.lag, 3),
            "seconds": round(result.seconds, 4),
        }
        if options["json"]:
            self.stdout.write(json.dumps(summary))
        else:
            self.stdout.write(
                f"Claimed {result.claimed} payments in {result.batches} batches, "
                f"published {result.messages} messages in {result.seconds:.3f}s"
                + (" (stopped: executors behind or too many QUEUED)" if result.backpressure else "")
                + (f" (executors {result.lag:.2f}s behind)" if round(result.lag, 2) > 0 else "")
                + (" (the next slot is still filling)" if result.work_ahead else "")
            )
