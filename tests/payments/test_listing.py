"""A client's payment listing: ``Payment.owner`` and the plans that read it.

Plan regression: the listing is an index range, not a join and a sort.

``GET /api/v1/payments?limit=100`` took 0.61 s for a client with 1M payments:
the listing joined every payment to its source account to filter on the
owner, then sorted. Each filter combination now reads one index in page
order starting at the cursor, so page 1 and page 1,000 read the same number
of rows. Real rows and fresh statistics, no planner switches.
"""

import json
import uuid
from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone
from urllib.parse import quote

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from payments.exceptions import InvalidRequest
from payments.models import Payment
from payments.selectors import (
    decode_cursor,
    decode_id_cursor,
    encode_cursor,
    payment_list,
)
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import bulk_schedule
from tests.plans import captured_sql, explain, index_scan, node_types

pytestmark = pytest.mark.django_db

ROWS = 20_000  # per client
LIMIT = 100


def _insert_history(owner, accounts, target) -> None:
    """``ROWS`` old payments, one a second: every 10th from ``accounts[1]``, the
    rest from ``accounts[0]``; every 500th FAILED, the rest CANCELLED (no hold
    or entry needed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO payments_payment
                   (id, from_account_id, to_account_id, owner_id, amount, description,
                    metadata, status, due_at, run_at, partition, fence, attempts,
                    error_code, error_message, created_at, updated_at)
            SELECT gen_random_uuid(), (%(accounts)s::bigint[])[1 + (g %% 10 = 0)::int], %(target)s,
                   %(owner)s, 1, '', '{}',
                   CASE WHEN g %% 500 = 0 THEN 'FAILED' ELSE 'CANCELLED' END,
                   now(), now(), 0, 0, 0, '', '',
                   now() - g * interval '1 second', now()
              FROM generate_series(1, %(rows)s) AS g
            """,
            {
                "accounts": [a.pk for a in accounts],
                "target": target.pk,
                "owner": owner.pk,
                "rows": ROWS,
            },
        )


@pytest.fixture
def histories():
    """Two clients with ``ROWS`` payments each; returns the first client and accounts."""
    target = AccountFactory()
    clients = []
    for name in ("heavy", "neighbour"):
        user = UserFactory(username=name)
        accounts = [AccountFactory(owner=user), AccountFactory(owner=user)]
        _insert_history(user, accounts, target)
        clients.append((user, accounts))
    return clients[0]


def _cursor_at(owner, position: int, **filters) -> str:
    """The cursor ``payment_list`` would hand out after ``position`` rows."""
    where = " AND ".join(f"{column} = %s" for column in filters) or "TRUE"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT created_at, id FROM payments_payment WHERE owner_id = %s AND {where}"
            " ORDER BY created_at DESC, id DESC OFFSET %s LIMIT 1",
            [owner.pk, *filters.values(), position - 1],
        )
        return encode_cursor(*cursor.fetchone())


def _plan(**kwargs) -> dict:
    sql = captured_sql(lambda: payment_list(limit=LIMIT, **kwargs))
    return explain(sql, "payments_payment")


def _assert_reads_one_page(plan: dict, index: str) -> None:
    assert "Sort" not in node_types(plan), json.dumps(plan, indent=1)
    scan = index_scan(plan, index)
    assert scan is not None, json.dumps(plan, indent=1)
    assert scan["Node Type"] == "Index Scan", scan
    # Rows read: the page (+1 to know there is a next one), nothing skipped.
    assert scan["Actual Rows"] == LIMIT + 1, scan
    assert scan.get("Rows Removed by Filter", 0) == 0, scan


@pytest.mark.postgres
def test_listing_page_1_and_deep_page_read_one_page_from_the_owner_index(histories):
    owner, _ = histories
    _assert_reads_one_page(_plan(client=owner), "payments_by_owner")
    deep = _plan(client=owner, cursor=_cursor_at(owner, 15_000))
    _assert_reads_one_page(deep, "payments_by_owner")
    assert "created_at" in index_scan(deep, "payments_by_owner")["Index Cond"]


@pytest.mark.postgres
def test_status_filter_reads_only_that_status(histories):
    """FAILED is 1 in 500: without its own index a page of them scans 50,000 rows."""
    owner, _ = histories
    sql = captured_sql(lambda: payment_list(client=owner, status="FAILED", limit=10))
    plan = explain(sql, "payments_payment")
    assert "Sort" not in node_types(plan), plan
    scan = index_scan(plan, "payments_by_owner_status")
    assert scan is not None and scan["Actual Rows"] == 11, plan
    assert scan.get("Rows Removed by Filter", 0) == 0, scan
    cursor = _cursor_at(owner, 25, status="FAILED")
    sql = captured_sql(lambda: payment_list(client=owner, status="FAILED", limit=10, cursor=cursor))
    deep = explain(sql, "payments_payment")
    scan = index_scan(deep, "payments_by_owner_status")
    assert scan is not None and "Sort" not in node_types(deep), deep
    assert scan["Actual Rows"] == 11 and scan.get("Rows Removed by Filter", 0) == 0, scan


@pytest.mark.postgres
def test_account_filter_reads_one_page_from_the_account_index(histories):
    owner, accounts = histories
    account_id = accounts[1].pk  # a tenth of the client's payments
    _assert_reads_one_page(_plan(client=owner, account_id=account_id), "payments_by_account")
    cursor = _cursor_at(owner, 1_500, from_account_id=account_id)
    deep = _plan(client=owner, account_id=account_id, cursor=cursor)
    _assert_reads_one_page(deep, "payments_by_account")


@pytest.mark.postgres
def test_another_clients_account_as_the_filter_reads_no_payment(histories):
    """Account ids are sequential: filtered on the owner's index, a neighbour's
    busy account read all 20,000 of the caller's payments to return an empty
    page (a review, session 42). Not the caller's: an empty page, one lookup."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ledger.models import Account

    owner, _ = histories
    neighbours = Account.objects.filter(owner__username="neighbour").values_list("pk", flat=True)
    for account_id in [*neighbours, 10**12]:
        with CaptureQueriesContext(connection) as queries:
            assert payment_list(client=owner, account_id=account_id, limit=LIMIT) == ([], None)
        assert not [q for q in queries if "payments_payment" in q["sql"]], queries.captured_queries


@pytest.mark.postgres
def test_deep_pages_are_the_same_rows_as_walking_the_pages(histories):
    """The cursor condition is exact: no row is skipped or repeated at a page edge."""
    owner, _ = histories
    seen, cursor = [], None
    for _ in range(3):
        page, cursor = payment_list(client=owner, limit=LIMIT, cursor=cursor)
        seen += [p.pk for p in page]
    with connection.cursor() as c:
        c.execute(
            "SELECT id FROM payments_payment WHERE owner_id = %s"
            " ORDER BY created_at DESC, id DESC LIMIT %s",
            [owner.pk, 3 * LIMIT],
        )
        assert seen == [row[0] for row in c.fetchall()]


@pytest.mark.postgres
def test_every_payment_carries_its_source_accounts_owner(alice, bob):
    """Set by each creation path; the trigger payments_payment_owner refuses a
    row whose owner is missing or wrong, so no path can list a payment to the
    wrong client or hide it from the right one."""
    payment_id = alice.schedule(to_account_id=bob.account.pk).json()["payment_id"]
    assert Payment.objects.get(pk=payment_id).owner_id == alice.user.pk
    payment = Payment.objects.get(pk=payment_id)
    for wrong in (bob.user.pk, None):
        with (
            pytest.raises(IntegrityError, match="not the owner of its source account"),
            transaction.atomic(),
        ):
            Payment.objects.filter(pk=payment_id).update(owner_id=wrong)
    with (
        pytest.raises(IntegrityError, match="not the owner of its source account"),
        transaction.atomic(),
    ):
        Payment.objects.create(
            from_account_id=bob.account.pk,
            to_account_id=alice.account.pk,
            owner_id=alice.user.pk,
            amount=1,
            due_at=payment.due_at,
            run_at=payment.due_at,
            partition=0,
        )
    assert [p["payment_id"] for p in bob.api.get("/api/v1/payments").json()["payments"]] == []


def _walk(client, limit: int, **filters) -> tuple[list[str], int]:
    """Every page of ``payment_list``: the ids in order and the number of pages."""
    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = payment_list(client=client, limit=limit, cursor=cursor, **filters)
        pages += 1
        seen += [str(p.pk) for p in page]
        if cursor is None:
            return seen, pages


@pytest.mark.parametrize("count", [4, 5])
def test_payments_created_together_page_by_id(count):
    """A bulk insert is one statement: on PostgreSQL its rows share ``created_at``
    (STATEMENT_TIMESTAMP), to the microsecond. Pages then go by id, and a page
    edge inside the tie neither skips nor repeats a row; a last full page says
    there is no next one."""
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=10_000)
    ids = bulk_schedule(
        sources=[source.pk],
        targets=[AccountFactory().pk],
        count=count,
        amount=1,
        due_at=timezone.now() + timedelta(minutes=1),
    )
    newest_first = sorted(ids, key=uuid.UUID, reverse=True)
    assert _walk(owner, limit=2) == (newest_first, (count + 1) // 2)
    if connection.vendor == "postgresql":
        # The order is the query's, not an index's: the same pages from a
        # sequential scan and a sort.
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_indexscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
        assert _walk(owner, limit=2) == (newest_first, (count + 1) // 2)


def test_default_page_is_20(alice):
    bulk_schedule(
        sources=[alice.account.pk],
        targets=[alice.other_account.pk],
        count=21,
        amount=1,
        due_at=timezone.now() + timedelta(minutes=1),
    )
    page, cursor = payment_list(client=alice.user)
    assert len(page) == 20 and cursor is not None


def test_cursors_round_trip_and_need_no_escaping():
    moment = datetime(2024, 3, 10, 7, 30, 0, 123456, tzinfo=UTC)
    for parts in ([moment.isoformat(), str(uuid.uuid4())], ["1234567"], ["1"], ["12"], ["x|"]):
        cursor = encode_cursor(*parts)
        assert quote(cursor, safe="") == cursor  # a query-string value as it is
        assert decode_cursor(cursor, parts[0].count("|") + len(parts)) == "|".join(parts).split("|")
    assert decode_id_cursor(encode_cursor(1_234_567)) == 1_234_567  # ledger posting ids grow


def _invalid_cursor(call) -> None:
    with pytest.raises(InvalidRequest) as raised:
        call()
    assert raised.value.message == "Invalid cursor."
    assert raised.value.details == {"fields": {"cursor": "not a cursor from this API"}}


def test_every_malformed_cursor_is_the_same_400(alice):
    moment = timezone.now()
    for cursor in (
        "garbage",
        "!!",
        encode_cursor(moment, uuid.uuid4(), "extra"),
        encode_cursor("not a time", uuid.uuid4()),
        encode_cursor(moment, "not-a-uuid"),
    ):
        _invalid_cursor(lambda c=cursor: payment_list(client=alice.user, cursor=c))
    for cursor in ("!!", encode_cursor("abc"), encode_cursor(1, 2)):
        _invalid_cursor(lambda c=cursor: decode_id_cursor(c))


# Cursor parts as a client could forge them: any text, and the shapes ours
# have at their edges (times of every offset and range, naive ones, uuids, ints).
CURSOR_PART = st.one_of(
    st.text(),
    st.datetimes(
        timezones=st.none()
        | st.timedeltas(min_value=-timedelta(hours=23), max_value=timedelta(hours=23)).map(
            dt_timezone
        )
    ).map(datetime.isoformat),
    st.uuids().map(str),
    st.integers().map(str),
    st.text(alphabet="0123456789²³¹٣۴", min_size=1),  # digits int() does and does not read
)


@hypothesis_settings(max_examples=150, deadline=None)
@given(first=CURSOR_PART, second=CURSOR_PART, raw=st.text())
def test_any_forged_cursor_is_a_page_or_the_same_400(first, second, raw):
    """Property: whatever a client puts in a cursor, the answer is a page or the
    invalid-cursor 400, never an exception (the kind of test that was missing
    for "²" in an id cursor and year 1 at +14:00 on SQLite, both a 500)."""
    user = UserFactory()
    for call in (
        lambda: payment_list(client=user, cursor=encode_cursor(first, second)),
        lambda: payment_list(client=user, cursor=raw) if raw else None,
        lambda: decode_id_cursor(encode_cursor(first)),
        lambda: decode_id_cursor(raw),
    ):
        try:
            call()
        except InvalidRequest as refused:
            assert refused.message == "Invalid cursor."


def test_pages_are_stable_whatever_format_each_time_was_written_in():
    """On SQLite a ``created_at`` is text in the format its writer chose: the
    database's default (``….fff``), Django for a Python datetime (``….ffffff``, or
    no fraction on a whole second). Rows of one millisecond, written each way, are
    paged by id: none skipped, none repeated (on PostgreSQL they are plain
    timestamps and the same holds)."""
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=10_000)
    ids = bulk_schedule(
        sources=[source.pk],
        targets=[AccountFactory().pk],
        count=4,
        amount=1,
        due_at=timezone.now() + timedelta(minutes=1),
    )
    if connection.vendor == "sqlite":
        # the database's default, Django's whole second and microseconds, and
        # two that SQLite's %f rounds to the same millisecond from either side
        written = ["2024-03-10 08:30:05.000", "2024-03-10 08:30:05", "2024-03-10 08:30:05.000000"]
        written.append("2024-03-10 08:30:04.999600")
        with connection.cursor() as cursor:
            for pid, text in zip(ids, written, strict=True):
                cursor.execute(
                    "UPDATE payments_payment SET created_at = %s WHERE id = %s",
                    [text, uuid.UUID(pid).hex],
                )
    else:
        moment = datetime(2024, 3, 10, 8, 30, 5, tzinfo=UTC)
        Payment.objects.filter(pk__in=ids).update(created_at=moment)
    newest_first = sorted(ids, key=uuid.UUID, reverse=True)
    assert _walk(owner, limit=1) == (newest_first, 4)
    assert _walk(owner, limit=3) == (newest_first, 2)
