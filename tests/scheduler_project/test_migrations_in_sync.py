"""The models and the migrations describe one schema.

A model change without its migration ships a schema the code does not expect
(or, as with ledger 0006's hand-written operations, a migration whose model
state drifts from the model): ``makemigrations --check`` finds either, here
rather than on a deployment's first ``migrate``.
"""

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_need_no_new_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:  # --check exits 1 when a migration would be written
        pytest.fail("models and migrations differ:\n" + out.getvalue())
    assert "No changes detected" in out.getvalue()
