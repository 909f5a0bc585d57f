"""RowReader: the hot reads' fixed SELECT returns what the ORM returns (PostgreSQL and SQLite)."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.db.models.functions import Now

from payments import services
from payments.models import ApiToken, ApiTokenVia, Payment
from payments.tokens import api_token_issue, hash_token
from scheduler_project.rows import RowReader
from tests.factories import AccountFactory, UserFactory

pytestmark = pytest.mark.django_db

User = get_user_model()

PAYMENT = RowReader(
    Payment, sql="FROM {0} WHERE {0.pk} = %s AND {0.owner} = %s", params=["id", "owner"]
)
TOKEN_AND_USER = RowReader(
    ApiToken,
    User,
    sql="FROM {0} INNER JOIN {1} ON {1.pk} = {0.user} WHERE {0.key_hash} = %s",
    params=["key_hash"],
)


def same_row(got, expected):
    """Every concrete field equal, and of the same type (UUID, aware datetime, bool, dict)."""
    assert type(got) is type(expected)
    assert got._state.adding is False and got._state.db == "default"
    for field in type(expected)._meta.concrete_fields:
        mine, theirs = getattr(got, field.attname), getattr(expected, field.attname)
        assert (field.name, mine) == (field.name, theirs)
        assert type(mine) is type(theirs), field.name


@pytest.fixture
def payment():
    owner = UserFactory(username="rows")
    source = AccountFactory(owner=owner, funded=1_000)
    return services.payment_schedule(
        client=owner,
        from_account_id=source.pk,
        to_account_id=AccountFactory(owner=owner).pk,
        amount=7,
        delay_seconds=3600,
        description="Miete \u00e9",
        metadata={"nested": {"list": [1, 2.5, None, True]}, "none": None},
    )


def test_a_payment_row_is_the_orm_instance(payment):
    (got,) = PAYMENT.one(payment.pk, payment.owner_id)
    same_row(got, Payment.objects.get(pk=payment.pk))
    assert got.metadata == {"nested": {"list": [1, 2.5, None, True]}, "none": None}
    assert got.due_at == payment.due_at and got.due_at.tzinfo is not None
    got.refresh_from_db()  # a saved instance like any other
    got.description = "changed"
    got.save(update_fields=["description"])
    assert Payment.objects.get(pk=payment.pk).description == "changed"


def test_parameters_are_prepared_by_their_fields(payment):
    """A UUID as text or as UUID, an owner as id: the ORM's preparation (hex on SQLite)."""
    (by_text,) = PAYMENT.one(str(payment.pk), payment.owner_id)
    assert by_text.pk == payment.pk


def test_no_row_is_none(payment):
    assert PAYMENT.one(uuid.uuid4(), payment.owner_id) is None
    other = UserFactory(username="someone-else")
    assert PAYMENT.one(payment.pk, other.pk) is None  # the WHERE is the whole condition
    assert PAYMENT.one(payment.pk, None) is None  # never "owner IS NULL"


def test_a_joined_row_is_one_instance_per_model():
    user = UserFactory(username="joined", is_staff=True)
    record, token = api_token_issue(user=user, name="laptop", actor=None, via=ApiTokenVia.CLI)
    got_token, got_user = TOKEN_AND_USER.one(hash_token(token))
    same_row(got_token, ApiToken.objects.get(pk=record.pk))
    same_row(got_user, User.objects.get(pk=user.pk))
    assert got_user.is_active is True and got_user.is_staff is True  # bools, on SQLite too
    ApiToken.objects.filter(pk=record.pk).update(revoked_at=Now())
    got_token, _ = TOKEN_AND_USER.one(hash_token(token))
    same_row(got_token, ApiToken.objects.get(pk=record.pk))
    assert got_token.revoked_at is not None


def test_the_sql_is_built_from_the_models():
    """Every concrete column, quoted for the database, in field order."""
    PAYMENT.one(uuid.uuid4(), 1)
    (prepared,) = PAYMENT._prepared.values()
    select = prepared.sql.split(" FROM ")[0]
    assert select.count(",") == len(Payment._meta.concrete_fields) - 1
    assert '"payments_payment"."metadata"' in select
    assert prepared.sql.endswith(
        'FROM "payments_payment" WHERE "payments_payment"."id" = %s '
        'AND "payments_payment"."owner_id" = %s'
    )
