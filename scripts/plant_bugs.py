"""Plant each bug of docs/planted-bugs.md, run the test meant to catch it, restore.

    .venv/bin/python scripts/plant_bugs.py

For each bug: apply it (one textual replacement), run its test with
``scripts/test`` (PostgreSQL) and expect a failure, put the file back, run
the test again and expect a pass. Exit 1 if any bug got through or any test
fails on the clean code. Run it from a clean working tree: the planted file is
restored even when a run is interrupted by an exception, not by SIGKILL.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANTS = [
    (
        "1 payee reads a payment into its account",
        "payments/selectors.py",
        "return Payment.objects.filter(owner=client)",
        "from django.db.models import Q\n"
        "    return Payment.objects.filter(Q(owner=client) | Q(to_account__owner=client))",
        [
            "tests/payments/test_isolation.py::test_a_payee_cannot_reach_a_payment_made_into_its_account"
        ],
    ),
    (
        "2 fingerprint ignores method and path",
        "payments/idempotency.py",
        'return hashlib.sha256(f"{method} {path}\\n{canonical}".encode()).hexdigest()',
        "return hashlib.sha256(canonical.encode()).hexdigest()",
        [
            "tests/payments/test_idempotency.py::TestSemantics::test_key_used_on_one_payment_is_refused_on_another"
        ],
    ),
    (
        "3 a 500 does not free the key",
        "payments/idempotency.py",
        "IdempotencyKey.objects.filter(pk=record.pk, status=IdempotencyStatus.IN_FLIGHT).delete()",
        "return None",
        ["tests/payments/test_idempotency.py", "-k", "frees_the_key"],
    ),
    (
        "4 dst_policy does not reach the calendar",
        "payments/calendar.py",
        "        nonexistent=schedule.dst_nonexistent,\n"
        "        ambiguous=schedule.dst_ambiguous,\n",
        "",
        ["tests/payments/test_recurring.py", "-k", "dst_policy_reaches"],
    ),
    (
        "5a resume runs what fell due while paused",
        "payments/services/recurring.py",
        "                schedule.last_occurrence_at = now\n",
        "                pass\n",
        ["tests/payments/test_recurring.py", "-k", "resume_does_not_run"],
    ),
    (
        "5b max_occurrences counts skipped occurrences",
        "payments/engine/materializer.py",
        "        and schedule.occurrences_run >= schedule.max_occurrences",
        "        and schedule.occurrences_run"
        ' + schedule.occurrences.filter(status="skipped").count()'
        " >= schedule.max_occurrences",
        ["tests/payments/test_recurring.py", "-k", "max_occurrences_does_not_count"],
    ),
    (
        "6a verify accepts stale timestamps",
        "payments/webhooks.py",
        "    if abs(time.time() - int(timestamp)) > tolerance:\n        return False\n",
        "",
        ["tests/payments/test_webhooks.py", "-k", "stale_or_future"],
    ),
    (
        "6b reconcile's payment-entry check cannot fail",
        "payments/reconciliation.py",
        '        if reference != f"{PREFIX}{pid}":',
        "        if False:",
        ["tests/payments/test_reconciliation.py", "-k", "entry_is_not_its_own"],
    ),
]
ok = True
for name, path, old, new, test in PLANTS:
    f = ROOT / path
    src = f.read_text()
    assert src.count(old) == 1, (name, src.count(old))
    f.write_text(src.replace(old, new))
    try:
        planted = subprocess.run(
            ["./scripts/test", *test, "-q", "-p", "no:randomly"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    finally:
        f.write_text(src)
    clean = subprocess.run(
        ["./scripts/test", *test, "-q"], cwd=ROOT, capture_output=True, text=True
    )
    lp = planted.stdout.strip().splitlines()[-1]
    lc = clean.stdout.strip().splitlines()[-1]
    good = planted.returncode != 0 and clean.returncode == 0
    ok &= good
    print(f"{'OK ' if good else 'BAD'} {name}: planted → {lp} | main → {lc}")
sys.exit(0 if ok else 1)
