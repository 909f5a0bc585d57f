"""``manage.py reconcile_ledger``: audit every ledger invariant.

Exit status 0 when the books are clean, 1 on any mismatch (each one named), so
cron, CI or an on-call runbook can act on it. ``--json`` prints one JSON
object on stdout; the progress bar goes to stderr and only to a terminal.
"""

import json
import sys

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from ledger.reconciliation import Progress, reconcile, reconcile_and_record


class TqdmProgress(Progress):
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: tqdm | None = None

    def start(self, name: str, total: int) -> None:
        if self.enabled:
            self.bar = tqdm(total=total, desc=name, unit="row", file=sys.stderr, leave=False)

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Command(BaseCommand):
    help = "Check every ledger invariant; exit non-zero naming each mismatch."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
        parser.add_argument(
            "--no-progress", action="store_true", help="Never draw the progress bar."
        )
        parser.add_argument(
            "--no-record",
            action="store_true",
            help="Do not keep the result as a reconciliation run (operations page, metrics).",
        )

    def handle(self, *args, **options):
        show_progress = not options["no_progress"] and sys.stderr.isatty()
        progress = TqdmProgress(show_progress)
        if options["no_record"]:
            report = reconcile(progress=progress)
        else:
            report = reconcile_and_record(trigger="command", progress=progress)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), default=str))
        else:
            for check in report.checks:
                status = self.style.SUCCESS("ok") if check.ok else self.style.ERROR("MISMATCH")
                self.stdout.write(
                    f"{status:>10}  {check.name:<24} {check.rows_checked:>10} rows  "
                    f"{check.mismatch_count} mismatches"
                )
                for mismatch in check.mismatches:
                    self.stdout.write(f"            - {mismatch.message}")
                if check.mismatch_count > len(check.mismatches):
                    self.stdout.write(
                        f"            … and {check.mismatch_count - len(check.mismatches)} more"
                    )
            summary = (
                f"{len(report.checks)} checks, {report.mismatch_count} mismatches "
                f"in {report.duration_seconds:.2f}s"
            )
            self.stdout.write(
                self.style.SUCCESS(f"Ledger reconciled: {summary}")
                if report.ok
                else self.style.ERROR(f"Ledger NOT reconciled: {summary}")
            )
        if not report.ok:
            # Printed on stderr, so --json output on stdout stays one JSON object.
            raise CommandError(f"{report.mismatch_count} ledger mismatches", returncode=1)
