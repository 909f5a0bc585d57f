"""``manage.py reap_leases``: return expired QUEUED payments to PENDING (or dead-letter them)."""

import dataclasses
import json

from django.core.management.base import BaseCommand, CommandError

from payments import metrics
from payments.engine.reaper import reap_leases


class Command(BaseCommand):
    help = "Requeue payments whose lease expired; dead-letter those out of attempts."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        result = reap_leases()
        metrics.record_reap(result)  # the same counters as the beat's runs
        if options["json"]:
            self.stdout.write(json.dumps(dataclasses.asdict(result)))
        else:
            line = f"Requeued {result.requeued}, dead-lettered {result.dead_lettered} payments."
            if result.timed_out:
                line += (
                    f" {result.timed_out} waited too long for a row locked elsewhere"
                    " and were put off a minute."
                )
            if result.budget_exhausted:
                line += " Stopped at the time budget: run again for the rest."
            self.stdout.write(line)
        if result.errors:  # exit 1: a script sees it (the numbers are printed above)
            raise CommandError(
                f"{result.errors} payment(s) could not be dead-lettered (put off a minute; "
                "the log has each payment's id and traceback)."
            )
