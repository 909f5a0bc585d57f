"""Database helpers shared by the ledger and the payment engine.

The executor writes hundreds of rows per transaction. Django's
``bulk_create`` / ``bulk_update`` spend more Python time building one
placeholder per value (and psycopg more time parsing them) than PostgreSQL
spends writing the rows. On PostgreSQL these helpers send one array per
column instead — ``INSERT … SELECT FROM unnest(…)`` and
``UPDATE … FROM unnest(…)`` — a statement of fixed size whatever the row
count. Other backends (SQLite, the embedded default) use Django's bulk
methods.

The arrays go out in PostgreSQL's binary format over a server-side-binding
cursor (``binary_cursor``): Django's default psycopg cursor binds on the
client, quoting every element of every array into the SQL text in Python —
measured at 3.2 ms of CPU for six 200-element arrays, against 0.32 ms
binary, and about a sixth of the executor's CPU.
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
from collections.abc import Collection, Iterator, Sequence

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models.expressions import DatabaseDefault
from django.db.models.fields import AutoFieldMixin
from psycopg.pq import Format

BINARY = Format.BINARY


def _column_value(obj: models.Model, field: models.Field, *, add: bool):
    """The value to write for ``field``, as Django would compute it on save."""
    if field.is_relation:
        value = getattr(obj, field.attname)
        if value is None and field.is_cached(obj):
            # As bulk_create/update do: take the pk of a related object
            # saved after assignment (e.g. an entry bulk-inserted a moment ago).
            related = field.get_cached_value(obj)
            if related is not None:
                value = related.pk
                setattr(obj, field.attname, value)
        return value
    value = field.pre_save(obj, add)  # auto_now(_add) fields stamp themselves
    if isinstance(field, models.JSONField):
        return None if value is None else json.dumps(value, cls=field.encoder)
    return value


@functools.cache
def _read_as_is(field: models.Field, add: bool) -> bool:
    """Whether saving writes ``field``'s attribute unchanged: its ``pre_save`` is
    ``Field``'s own (a date field's too, unless it stamps itself on this save),
    and it is neither a relation nor JSON. Cached per field like ``_array_type``."""
    if field.is_relation or isinstance(field, models.JSONField):
        return False
    if isinstance(field, models.DateField):
        return not (field.auto_now or (add and field.auto_now_add))
    return type(field).pre_save is models.Field.pre_save


def _column_values(objs, field: models.Field, *, add: bool) -> list:
    """``_column_value`` of every object: one C-level attribute read per object
    where the value is the attribute itself (``_read_as_is``), as a relation's
    is unless it is unset. The 9 columns of 200 attempts: 0.43 ms of CPU object
    by object (``_column_value``), 0.08 ms so."""
    if _read_as_is(field, add):
        return list(map(operator.attrgetter(field.attname), objs))
    if field.is_relation:
        values = map(operator.attrgetter(field.attname), objs)
        return [
            _column_value(obj, field, add=add) if value is None else value
            for obj, value in zip(objs, values, strict=True)
        ]
    return [_column_value(obj, field, add=add) for obj in objs]


@functools.cache
def _array_type(field: models.Field) -> tuple[str, str]:
    """(array parameter type, cast applied to the unnested column).

    Cached per field: ``db_type`` is rebuilt on every call and showed up as a
    tenth of a one-payment chunk's CPU; a field's type never changes at run time.
    """
    if isinstance(field, models.JSONField):
        return "text[]", "::jsonb"
    db_type = field.db_type(connection)
    if db_type.startswith("varchar("):
        # Not to varchar(n): an explicit cast cuts an over-long value short
        # without a word, where the column's own (assignment) cast refuses it
        # — a DataError, as save() raises.
        db_type = "varchar"
    return f"{db_type}[]", ""


@contextlib.contextmanager
def binary_cursor(*, binary_results: bool = False) -> Iterator[CursorWrapper]:
    """A cursor of the default connection that binds on the server (PostgreSQL only).

    Its statements take ``%b`` placeholders: the value travels in binary, dumped
    by psycopg's C adapters, not quoted into the SQL text. It is Django's own
    wrapper over it — errors come out as ``django.db`` errors, and
    ``CaptureQueriesContext`` sees the statement — inside the caller's
    transaction, on the same connection.

    ``binary_results``: rows come back in binary too, loaded by psycopg's C
    loaders — Django registers a Python loader for text timestamps (parsing
    one cost ~5 µs, four a payment in the executor's reads). For statements
    whose columns are plain values (no JSON: Django expects JSON as text),
    which ``select_list`` checks.
    """
    from django.db.backends.postgresql.base import ServerBindingCursor

    # The connection itself, not the ``connection`` proxy: every attribute
    # read through the proxy looks the connection up again in a context-local
    # (asgiref), and the cursor wrapper reads several per statement — ~120
    # lookups in a one-payment chunk.
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    db.validate_no_broken_transaction()
    wrapper = CursorDebugWrapper if db.queries_logged else CursorWrapper
    with db.wrap_database_errors:
        raw = ServerBindingCursor(db.connection)
        if binary_results:
            raw.format = BINARY
    with wrapper(raw, db) as cursor:
        yield cursor


@contextlib.contextmanager
def pipelined() -> Iterator[None]:
    """Send the statements run within in as few round trips as their results
    allow (PostgreSQL's pipeline mode): a statement whose result is read —
    a fetch — waits for everything sent before it; the others go out together
    at the next such read, or when the block ends. Elsewhere it does nothing.

    Inside, nothing may depend on a row count: psycopg knows it only once the
    pipeline has synced, and reports -1 before — Django's ``save()`` (which
    tells an UPDATE that matched nothing from one that did by it), ``update()``
    and ``delete()`` would be misled. Errors come out as ``django.db`` errors,
    possibly at a later statement than the one that failed (the end of the
    outermost block at the latest); the transaction is aborted either way.
    """
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    if connection.connection.pgconn.pipeline_status:
        # within a pipeline already: a nested one would sync as it opens and
        # as it closes — two round trips for nothing
        yield
        return
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield


# Within the executor's transaction, plan as if the data were in memory
# (``set_local(CACHED_DATA_PLAN)``: ``random_page_cost = 1.1``).
#
# A batch's ``UPDATE … FROM unnest(…)`` joins its rows to the table by primary
# key. Costed with the default random_page_cost (4, a spinning disk's), a batch
# of a few hundred rows against a table of some 100,000 is planned as a
# sequential scan of the whole table into a hash: the executor's hold UPDATE of
# an 800-payment batch took 26-29 ms that way against 6.5-7 ms by the primary
# key (100,000 holds, analysed or not; ``bench/results/…-s19-*``). The
# executor's statements all fetch rows by key or a short index range, so for
# its transaction the cheaper random fetch is the truer cost. ``LOCAL``: it ends
# with the transaction, so a connection the pool hands on is as it was.
CACHED_DATA_PLAN = {"random_page_cost": "1.1"}


def transaction_time_bound(seconds: float) -> dict[str, str]:
    """The settings that, given to ``set_local`` within the caller's
    transaction, let no statement run, and the transaction not sit idle,
    longer than ``seconds`` (``statement_timeout`` and
    ``idle_in_transaction_session_timeout``, in whole milliseconds, at least 1:
    0 would mean no limit).

    A statement past it is cancelled (``OperationalError``, so the caller's
    transaction rolls back); a session idle in the transaction past it is
    ended by the server, which frees its row locks even if the process that
    holds them is stuck: the database's own bound, beneath whatever limits the
    process applies (a solo-pool Celery worker's watchdog). ``LOCAL``, like
    ``CACHED_DATA_PLAN``: it ends with the transaction.
    """
    milliseconds = str(max(int(seconds * 1000), 1))
    return {
        "statement_timeout": milliseconds,
        "idle_in_transaction_session_timeout": milliseconds,
    }


def set_local(values: dict[str, str]) -> None:
    """``SET LOCAL`` each of ``values`` (setting name -> value) within the
    caller's transaction, in one statement (``set_config(…, true)``; PostgreSQL
    only, else nothing): the executor sets three per batch, and each statement
    costs a batch's fixed share of CPU again (Django's cursor, psycopg's
    pipeline; ~0.1-0.2 ms each in a one-payment chunk, ``bench/executor_cost.py``).
    """
    if connection.vendor != "postgresql" or not values:
        return
    calls = ", ".join(["set_config(%s, %s, true)"] * len(values))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {calls}", [v for item in values.items() for v in item])


def _unnest(objs, columns, *, add: bool) -> tuple[str, list[str], list[list]]:
    params = [_column_values(objs, f, add=add) for f in columns]
    types = [_array_type(f) for f in columns]
    unnest = "unnest(" + ", ".join(f"%b::{array}" for array, _ in types) + ")"
    selects = [f"v._c{i}{cast}" for i, (_, cast) in enumerate(types)]
    return unnest, selects, params


def bulk_insert_rows(objs: Sequence[models.Model], *, read_back: bool = True) -> None:
    """Insert ``objs`` (all of one model, not yet saved) in one statement.

    As ``bulk_create`` does, the objects come back saved: primary keys set
    (an auto pk from the INSERT's RETURNING, where a text column tells the
    rows apart, ``_returning_key``; else taken
    from the table's sequence first — so rows inserted afterwards can refer
    to it) and database defaults read back.

    ``read_back=False`` is for rows nothing refers to afterwards (postings,
    attempts, events): the database assigns auto pks and defaults itself and
    nothing is read back, saving the sequence round trip; the objects' auto
    pks stay ``None``.
    """
    if not objs:
        return
    model = type(objs[0])
    meta = model._meta
    pk = meta.pk
    db_defaults = _db_defaults(objs)
    if connection.vendor != "postgresql" or db_defaults is None:
        model.objects.bulk_create(objs)
        return
    if not read_back:
        _execute(_insert_statement(objs, db_defaults))
        return
    auto_pk = isinstance(pk, AutoFieldMixin) and any(obj.pk is None for obj in objs)
    key = _returning_key(objs) if auto_pk else None
    if auto_pk and key is None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
                [meta.db_table, pk.column, len(objs)],
            )
            for obj, (value,) in zip(objs, cursor.fetchall(), strict=True):
                obj.pk = value
    # With a key the database assigns the pks in the INSERT itself, without a
    # sequence round trip first; each row RETURNING gives back is matched to
    # its object by the key's value (for the executor's journal entries their
    # reference), else by the pk the object already has — the order of
    # RETURNING's rows is not promised.
    match = pk if key is None else key
    skipped = db_defaults if key is None else [*db_defaults, pk]
    columns = [f for f in meta.concrete_fields if f not in skipped]
    returned = _insert(meta.db_table, columns, objs, returning=[match, pk, *db_defaults])
    by_match = {row[0]: row[1:] for row in returned}
    for obj in objs:
        obj.pk, *values = by_match[getattr(obj, match.attname)]
        for field, value in zip(db_defaults, values, strict=True):
            setattr(obj, field.attname, value)
        obj._state.adding = False
        obj._state.db = connection.alias


def _returning_key(objs: Sequence[models.Model]) -> models.Field | None:
    """A text column by which the rows RETURNING gives back can be matched to
    ``objs``: one whose value every object gives as a string, written as it
    is (``Field.pre_save``), and no two share — a journal entry's
    ``reference``. Text comes back as it went in; a value too long for its
    column is refused (``_array_type``), never cut short. None if there is
    none: the pks are then taken from the sequence first."""
    for field in objs[0]._meta.concrete_fields:
        if isinstance(field, models.CharField) and type(field).pre_save is models.Field.pre_save:
            values = [getattr(obj, field.attname) for obj in objs]
            if all(isinstance(v, str) for v in values) and len(set(values)) == len(values):
                return field
    return None


def _db_defaults(objs: Sequence[models.Model]) -> list[models.Field] | None:
    """The fields ``objs`` leave to their database default, as the first object
    has them; None when the objects disagree (one gives a value the next
    leaves to the default, either way round): ``bulk_create`` handles that."""
    first = objs[0]
    defaulted = [f for f in first._meta.concrete_fields if f.db_default is not models.NOT_PROVIDED]
    db_defaults = [f for f in defaulted if isinstance(getattr(first, f.attname), DatabaseDefault)]
    mixed = any(
        isinstance(getattr(obj, f.attname), DatabaseDefault) != (f in db_defaults)
        for f in defaulted
        for obj in objs
    )
    return None if mixed else db_defaults


def _insert_statement(objs, db_defaults) -> tuple[str, list]:
    """``bulk_insert_rows(objs, read_back=False)``'s statement: the database
    assigns an unset auto pk and the ``db_defaults``."""
    meta = objs[0]._meta
    pk = meta.pk
    auto_pk = isinstance(pk, AutoFieldMixin) and any(obj.pk is None for obj in objs)
    skipped = [*db_defaults, pk] if auto_pk else db_defaults
    columns = [f for f in meta.concrete_fields if f not in skipped]
    return _insert_sql(meta.db_table, columns, objs, returning=None)


def _execute(statement: tuple[str, list]) -> None:
    with binary_cursor() as cursor:
        cursor.execute(*statement)


def _insert(table: str, columns, objs, *, returning) -> list[tuple]:
    """Insert and read back the ``returning`` columns of every row."""
    sql, params = _insert_sql(table, columns, objs, returning=returning)
    with binary_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _insert_sql(table: str, columns, objs, *, returning) -> tuple[str, list]:
    qn = connection.ops.quote_name
    names = ", ".join(qn(f.column) for f in columns)
    if len(objs) == 1:
        # One row (a schedule's payment, event and hold): bound values, each
        # cast to its column's type as the arrays are. PostgreSQL spent 0.29 ms
        # of CPU on a payment's INSERT from one-element arrays against 0.16 ms
        # from values (bench/results/2026-11-27-s21-insert/).
        (obj,) = objs
        params = [_column_value(obj, f, add=True) for f in columns]
        values = ", ".join(f"%b::{array[:-2]}{cast}" for array, cast in map(_array_type, columns))
        # Identifiers come from model metadata; every value is bound.
        sql = f"INSERT INTO {qn(table)} ({names}) VALUES ({values})"  # noqa: S608
    else:
        unnest, selects, params = _unnest(objs, columns, add=True)
        aliases = ", ".join(f"_c{i}" for i in range(len(columns)))
        # Identifiers come from model metadata; every value is a bound array.
        sql = (
            f"INSERT INTO {qn(table)} ({names}) "  # noqa: S608
            f"SELECT {', '.join(selects)} FROM {unnest} AS v({aliases})"
        )
    if returning:
        sql += " RETURNING " + ", ".join(qn(f.column) for f in returning)
    return sql, params


def bulk_update_rows(objs: Sequence[models.Model], fields: Sequence[str]) -> None:
    """Write ``fields`` of ``objs`` (all of one model) in one statement.

    Caller holds the row locks (the values are written as given).
    """
    if not objs:
        return
    model = type(objs[0])
    if connection.vendor != "postgresql":
        model.objects.bulk_update(objs, fields)
        return
    _execute(_update_statement(objs, fields))


def _update_statement(objs: Sequence[models.Model], fields: Sequence[str]) -> tuple[str, list]:
    meta = objs[0]._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields)]
    unnest, selects, params = _unnest(objs, columns, add=False)
    qn = connection.ops.quote_name
    aliases = ", ".join(f"_c{i}" for i in range(len(columns)))
    assignments = ", ".join(
        f"{qn(field.column)} = {select}"
        for field, select in zip(columns[1:], selects[1:], strict=True)
    )
    # Identifiers come from model metadata; every value is a bound array.
    sql = (
        f"UPDATE {qn(meta.db_table)} AS t SET {assignments} "  # noqa: S608
        f"FROM {unnest} AS v({aliases}) WHERE t.{qn(meta.pk.column)} = v._c0"
    )
    return sql, params


def write_rows(
    *,
    updates: Sequence[tuple[Sequence[models.Model], Sequence[str]]] = (),
    inserts: Sequence[Sequence[models.Model]] = (),
) -> None:
    """``bulk_update_rows(objs, fields)`` of each of ``updates``, then
    ``bulk_insert_rows(objs, read_back=False)`` of each of ``inserts`` — on
    PostgreSQL as one statement (the first ones as data-modifying ``WITH``
    queries of the last), not one each: a statement's own cost, client and
    server, was most of what a small batch's writes cost
    (``bench/executor_cost.py``). Elsewhere one at a time.

    As one statement they share a snapshot and none sees another's rows, so
    no two may write the same row, nor one read what another writes —
    triggers' reads included (an insert's foreign key to a row the same call
    inserts is fine: the constraints are deferred to COMMIT). An insert whose
    objects disagree on a database default goes to ``bulk_create`` on its
    own, before the rest.
    """
    updates = [(objs, fields) for objs, fields in updates if objs]
    inserts = [objs for objs in inserts if objs]
    if connection.vendor != "postgresql":  # Django's bulk methods, as the two above
        for objs, fields in updates:
            type(objs[0]).objects.bulk_update(objs, fields)
        for objs in inserts:
            type(objs[0]).objects.bulk_create(objs)
        return
    statements = [_update_statement(objs, fields) for objs, fields in updates]
    for objs in inserts:
        db_defaults = _db_defaults(objs)
        if db_defaults is None:  # the objects disagree on a default: on its own
            type(objs[0]).objects.bulk_create(objs)
        else:
            statements.append(_insert_statement(objs, db_defaults))
    if not statements:
        return
    *leading, (last_sql, last_params) = statements
    sql = ", ".join(f"w{i} AS ({q})" for i, (q, _) in enumerate(leading))
    params = [value for _, values in leading for value in values]
    _execute((f"WITH {sql} {last_sql}" if sql else last_sql, [*params, *last_params]))


@functools.cache
def _columns(model: type[models.Model], attnames: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """(SELECT list, attribute names) of ``attnames`` of ``model``, in the
    order of its concrete fields (the order ``Model.from_db`` takes values
    in): what ``SQLCompiler`` works out for every query, once per model and
    set of columns. Only columns whose values psycopg's loaders give as the
    model stores them: a field with converters (JSON, which Django also
    expects as text, binary rows parse it) is refused rather than converted
    here."""
    meta = model._meta
    qn = connection.ops.quote_name
    fields = [f for f in meta.concrete_fields if f.attname in attnames]
    if len(fields) != len(attnames):
        unknown = attnames - {f.attname for f in fields}
        raise ValueError(f"{model.__name__} has no column {sorted(unknown)}")
    for field in fields:
        col = field.get_col(meta.db_table)
        if connection.ops.get_db_converters(col) + col.get_db_converters(connection):
            raise ValueError(f"{model.__name__}.{field.name} needs a converter")
    select = ", ".join(f"{qn(meta.db_table)}.{qn(f.column)}" for f in fields)
    return select, tuple(f.attname for f in fields)


def select_list(model: type[models.Model], attnames: Collection[str]) -> str:
    """The SELECT list of ``attnames`` (attribute names: ``account_id``, not
    ``account``) of ``model``'s table, table-qualified, in the order
    ``instances`` reads them."""
    return _columns(model, frozenset(attnames))[0]


def instances(model: type[models.Model], attnames: Collection[str], rows) -> list:
    """Model instances from rows (text or binary) whose columns are
    ``select_list(model, attnames)``, built as the ORM builds them
    (``Model.from_db``: fields not read are deferred, the instances are "in
    the database") — without compiling a queryset for every query. For hot
    paths on PostgreSQL, where that compiling showed in the profile; a
    queryset is the readable form everywhere else."""
    names = _columns(model, frozenset(attnames))[1]
    alias = connection.alias
    return [model.from_db(alias, names, row) for row in rows]
