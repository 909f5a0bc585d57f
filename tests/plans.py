"""EXPLAIN helpers for plan-regression tests: run the query the code really sends."""

from collections.abc import Callable, Iterator

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.db import binary_cursor


def captured_sql(call: Callable[[], object]) -> str:
    """The last SQL statement ``call`` sent, with its parameters inlined."""
    with CaptureQueriesContext(connection) as ctx:
        call()
    return ctx.captured_queries[-1]["sql"]


def explain_call(call: Callable[[], object], *tables: str) -> dict:
    """``EXPLAIN ANALYZE`` of the last statement ``call`` sent, as it was sent:
    its SQL and parameters as given to the cursor, on a cursor of the same kind
    (a server-binding one for ``ledger.db.binary_cursor``'s ``%b`` statements,
    whose captured text has no parameters inlined), after ``ANALYZE`` of
    ``tables``."""
    sent = []

    def record(execute, sql, params, many, context):
        sent.append((sql, params, type(context["cursor"].cursor).__name__))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        call()
    sql, params, kind = sent[-1]
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ANALYZE {table}")
    opened = binary_cursor() if kind == "ServerBindingCursor" else connection.cursor()
    with opened as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        return cursor.fetchone()[0][0]["Plan"]


def explain(sql: str, *tables: str, params: dict | None = None) -> dict:
    """``EXPLAIN ANALYZE`` of ``sql`` (with ``params``) after ``ANALYZE`` of ``tables``
    (fresh statistics)."""
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ANALYZE {table}")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        return cursor.fetchone()[0][0]["Plan"]


def nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def index_scan(plan: dict, index: str) -> dict | None:
    return next((n for n in nodes(plan) if n.get("Index Name") == index), None)


def node_types(plan: dict) -> set[str]:
    return {n["Node Type"] for n in nodes(plan)}
