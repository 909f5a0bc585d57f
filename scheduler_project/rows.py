"""Hot single-row reads whose SQL is built once per database, not compiled per request.

For a lookup by a unique key the ORM spends more of the web process's CPU
compiling the queryset (select list, joins, ordering, converters) than the
database spends answering it: about 0.4 ms of a 0.5 ms token lookup. The two
reads on every API request (the bearer token, a payment by id) use a
``RowReader`` instead. Its column list comes from the models' metadata, its
parameters are prepared by the fields as the ORM prepares them, and every
value passes through the converters the ORM applies (UUIDs, datetimes and
booleans on SQLite, JSON), so the instances are the ones a queryset returns.
The SQL runs on Django's cursor: query logging, ``CaptureQueriesContext``,
execute wrappers and database-error translation see it like any other query.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field, Model


class _Table:
    """In ``str.format``: ``{0}`` is the table, ``{0.name}`` the column of field ``name``
    (``{0.pk}``: of the primary key)."""

    def __init__(self, model: type[Model], quote: Callable[[str], str]):
        self._model = model
        self._quote = quote

    def __str__(self) -> str:
        return self._quote(self._model._meta.db_table)

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        meta = self._model._meta
        column = (meta.pk if name == "pk" else meta.get_field(name)).column
        return f"{self}.{self._quote(column)}"


@dataclass(frozen=True)
class _Prepared:
    sql: str
    params: list[Field]
    # (model, attnames, first column, end column) per model, in column order
    layout: list[tuple[type[Model], list[str], int, int]]
    # (column index, converter, expression) for the columns that have any
    converters: list[tuple[int, Callable, Any]]


class RowReader:
    """Whole rows of ``models``, one instance of each per row, from one fixed SELECT.

    ``sql`` is what follows the column list (``FROM … JOIN … WHERE …``) with
    ``{0}``, ``{1}`` … for the models' tables and ``{0.field}`` for their
    columns (``{0.pk}``: the primary key's), quoted for the database it runs
    on, and one ``%s`` per name in ``params``: fields of the first model, in
    order. ``one`` expects at most one matching row (a lookup by a unique key).
    """

    def __init__(self, *models: type[Model], sql: str, params: Sequence[str]):
        self.models = models
        self.sql = sql
        self.params = tuple(params)
        self._prepared: dict[str, _Prepared] = {}

    def _prepare(self, using: str) -> _Prepared:
        connection = connections[using]
        quote = connection.ops.quote_name
        tables = [_Table(model, quote) for model in self.models]
        columns: list[str] = []
        layout = []
        converters = []
        for model, table in zip(self.models, tables, strict=True):
            fields = model._meta.concrete_fields
            layout.append(
                (model, [f.attname for f in fields], len(columns), len(columns) + len(fields))
            )
            for field in fields:
                expression = field.get_col(model._meta.db_table)
                backend = connection.ops.get_db_converters(expression)
                for converter in backend + expression.get_db_converters(connection):
                    converters.append((len(columns), converter, expression))
                columns.append(getattr(table, field.name))
        prepared = _Prepared(
            sql=f"SELECT {', '.join(columns)} {self.sql.format(*tables)}",
            params=[self.models[0]._meta.get_field(name) for name in self.params],
            layout=layout,
            converters=converters,
        )
        self._prepared[using] = prepared
        return prepared

    def one(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> tuple[Model, ...] | None:
        """The instances of the matching row (one per model), or None if no row matches."""
        prepared = self._prepared.get(using) or self._prepare(using)
        connection = connections[using]
        params = [
            field.get_db_prep_value(value, connection)
            for field, value in zip(prepared.params, values, strict=True)
        ]
        with connection.cursor() as cursor:
            cursor.execute(prepared.sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        if prepared.converters:
            row = list(row)
            for index, converter, expression in prepared.converters:
                row[index] = converter(row[index], expression, connection)
        return tuple(
            model.from_db(using, names, row[start:end])
            for model, names, start, end in prepared.layout
        )
