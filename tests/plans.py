"""EXPLAIN helpers for plan-regression tests: run the query the code really sends."""

from collections.abc import Callable, Iterator

from django.db import connection
from django.test.utils import CaptureQueriesContext


def captured_sql(call: Callable[[], object]) -> str:
    """The last SQL statement ``call`` sent, with its parameters inlined."""
    with CaptureQueriesContext(connection) as ctx:
        call()
    return ctx.captured_queries[-1]["sql"]


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
