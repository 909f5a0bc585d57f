"""Each row of docs/mutation-testing.md still names the mutation it was checked against.

mutmut numbers a function's mutants in the order it makes them, so editing a
guarded function renumbers them. A row excusing ``…__mutmut_26`` as
equivalent then excuses whatever mutant took number 26: in session 16 a
listed row had come to name a real gap (a read that dropped its client
scope), hidden from ``scripts/mutation``'s report. Each row carries a digest
of the changed lines it was judged on; here the mutants are made again from
today's source (no mutation run needed) and compared.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import mutation  # noqa: E402  (scripts/mutation.py)


def test_every_listed_row_names_the_mutation_it_was_checked_against():
    rows = mutation.listed_rows()
    assert len(rows) > 100  # the table parsed: every row, with its digest column
    moved = mutation.moved_rows(rows)
    assert moved == {}, (
        "rows of docs/mutation-testing.md whose mutant changed (re-run scripts/mutation on "
        "the module, check each survivor, then `scripts/mutation --rows` gives the digests): "
        f"{moved}"
    )


def test_every_row_naming_a_mutant_parses():
    """A row the parser skips (a missing digest cell, a typo) would be checked by
    nothing and excuse nothing: each line naming a mutmut mutant must parse."""
    named = [
        line
        for line in mutation.EQUIVALENTS.read_text().splitlines()
        if line.startswith("| `") and "__mutmut_" in line.split("|")[1]
    ]
    assert len(named) == len(mutation.listed_rows())


def test_a_renumbered_row_is_caught():
    rows = mutation.listed_rows()
    name, row = next(iter(rows.items()))
    wrong = mutation.Listed(row.reason, mutation.digest(["-a", "+b"]))
    assert mutation.moved_rows({name: row}) == {}
    assert mutation.moved_rows({name: wrong})[name].startswith("now: ")
    gone = name.rpartition("__mutmut_")[0] + "__mutmut_99999"
    assert mutation.moved_rows({gone: row}) == {gone: "no such mutant any more"}


def test_changed_lines_ignore_positions_and_context():
    diff = "--- a\n+++ b\n@@ -3,7 +3,7 @@\n     x = 1\n-    y = f(a)\n+    y = f(b)\n"
    assert mutation.changed_lines(diff) == ["-y = f(a)", "+y = f(b)"]
