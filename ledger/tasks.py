from celery import shared_task

from .reconciliation import reconcile_and_record


@shared_task(name="ledger.reconcile", ignore_result=True)
def reconcile() -> dict:
    report = reconcile_and_record(trigger="beat")
    return {"ok": report.ok, "mismatches": report.mismatch_count}
