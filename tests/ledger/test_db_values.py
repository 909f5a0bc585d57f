"""The values ``ledger.db``'s bulk writers send per column: what Django would save.

No database: ``_column_values`` reads the objects only. Its fast path (the
attribute as it is) must give way wherever ``save()`` would compute the value.
"""

from datetime import UTC, datetime

import pytest
from django.db import models

from ledger.db import _column_value, _column_values, _read_as_is
from ledger.models import EntryKind, JournalEntry, Posting

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def field(cls, **options):
    made = cls(**options)
    made.set_attributes_from_name("stamp")
    return made


@pytest.mark.parametrize(
    ("made", "add", "as_is"),
    [
        (field(models.CharField, max_length=8), True, True),
        (field(models.BigIntegerField), False, True),
        (field(models.DateTimeField), True, True),
        (field(models.DateTimeField, auto_now=True), True, False),
        (field(models.DateTimeField, auto_now=True), False, False),
        (field(models.DateTimeField, auto_now_add=True), True, False),
        (field(models.DateTimeField, auto_now_add=True), False, True),
        (field(models.DateField, auto_now=True), False, False),
        (field(models.JSONField), False, False),
    ],
)
def test_only_fields_saved_as_they_are_take_the_fast_path(made, add, as_is):
    assert _read_as_is(made, add) is as_is


def test_a_relation_never_takes_the_fast_path():
    assert _read_as_is(Posting._meta.get_field("entry"), True) is False


class Stamped:
    """An object with one attribute, ``stamp``, for fields named so (``field``)."""

    def __init__(self, value):
        self.stamp = value


@pytest.mark.parametrize("add", [True, False])
def test_a_self_stamping_field_is_stamped_for_every_object(add):
    auto_now = field(models.DateTimeField, auto_now=True)
    objs = [Stamped(WHEN), Stamped(WHEN)]
    values = _column_values(objs, auto_now, add=add)
    assert all(value > WHEN for value in values)
    assert [obj.stamp for obj in objs] == values


def test_auto_now_add_stamps_on_insert_only():
    auto_now_add = field(models.DateTimeField, auto_now_add=True)
    assert _column_values([Stamped(WHEN)], auto_now_add, add=False) == [WHEN]
    assert _column_values([Stamped(WHEN)], auto_now_add, add=True) != [WHEN]


def test_json_is_sent_as_its_text():
    assert _column_values(
        [Stamped({"a": 1}), Stamped(None)], field(models.JSONField), add=True
    ) == [
        '{"a": 1}',
        None,
    ]


def test_a_relation_takes_the_id_of_an_object_saved_after_assignment():
    """As ``_column_value``: set by id where given, else the related object's pk
    (which is then written back to the attribute)."""
    saved_later = JournalEntry(kind=EntryKind.TRANSFER, reference="later")
    postings = [
        Posting(entry_id=7, account_id=1, amount=1, balance_after=0),
        Posting(entry=saved_later, account_id=1, amount=-1, balance_after=0),
        Posting(account_id=1, amount=0, balance_after=0),
    ]
    saved_later.pk = 8
    entry_field = Posting._meta.get_field("entry")
    assert _column_values(postings, entry_field, add=True) == [7, 8, None]
    assert postings[1].entry_id == 8


@pytest.mark.parametrize("add", [True, False])
def test_every_column_matches_the_per_object_value(add):
    postings = [
        Posting(entry_id=i, account_id=i + 1, amount=i - 2, balance_after=i) for i in range(4)
    ]
    for column in Posting._meta.concrete_fields:
        assert _column_values(postings, column, add=add) == [
            _column_value(p, column, add=add) for p in postings
        ]
