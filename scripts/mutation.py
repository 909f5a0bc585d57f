"""Mutation testing of the modules that guard money and time, with mutmut 3.

Run it through ``scripts/mutation`` (which installs the ``mutation`` extra and
points the tests at their own database). For each module in
``[tool.mutation.tests]`` of pyproject.toml, in that order, a ``mutmut run``
mutates that module alone against the test files listed for it: mutmut first
runs those files once to record which tests call which function, then tests
each mutant with just those tests (``-x``, one pytest session per mutant,
forked from a process that has already imported Django and the tests).

A module's run always tests all of its mutants again, so its score never mixes
old and new results. The runs use PostgreSQL; code that only runs on SQLite
(the embedded default) cannot fail there, so each survivor is then tested once
more against the same test files on SQLite (``settings.test_sqlite``, as the
suite's SQLite pass runs them): one a test fails on there is counted killed.
Surviving mutants listed as equivalent (with the reason) in
``docs/mutation-testing.md`` are reported apart; any other survivor needs a
test that kills it, or a line in that table.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "docs" / "mutation-testing.md"
RESULTS = ROOT / "mutants" / "scores.json"

# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into what we report.
KILLED = {1, 3}
TIMEOUT = {36, -24, 24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


@functools.cache  # read once per process: module_of asks it for every listed row
def test_map() -> dict[str, list[str]]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = pyproject["tool"]["mutation"]["tests"]
    only_mutate = pyproject["tool"]["mutmut"]["only_mutate"]
    if sorted(mapping) != sorted(only_mutate):
        sys.exit(
            "pyproject.toml: [tool.mutmut] only_mutate must list exactly the modules of "
            f"[tool.mutation.tests]\n  only_mutate: {sorted(only_mutate)}\n"
            f"  tests map:   {sorted(mapping)}"
        )
    return mapping


def dotted(module: str) -> str:
    """A module path as mutmut's mutant names start: ``payments.idempotency``."""
    return module.removesuffix(".py").replace("/", ".")


def pattern(module: str) -> str:
    """mutmut's mutant-name glob for a module path: ``payments.idempotency.*``."""
    return dotted(module) + ".*"


def run_one(module: str, tests: list[str], max_children: int) -> None:
    """Inside a fresh process: ``mutmut run`` on one module against its test files.

    mutmut reads its settings once from ``[tool.mutmut]``; only the test
    selection is replaced here (``mutmut.configuration`` caches the parsed
    config in ``_config``, hence the pinned mutmut version). Every guarded
    module stays mutated (a mutant is only active when named), so ``mutmut
    show`` works for all of them; the name pattern picks this module's mutants.
    """
    import mutmut.configuration

    os.environ["MUTATION_SESSION"] = "1"  # tests/conftest.py: a fresh database per session
    base = mutmut.configuration.config()
    mutmut.configuration._config = replace(base, pytest_add_cli_args_test_selection=list(tests))
    from mutmut.__main__ import _run

    _run([pattern(module)], max_children)


def meta_path(module: str) -> Path:
    return ROOT / "mutants" / f"{module}.meta"


def load_results() -> dict[str, dict[str, int | None]]:
    """Module → {mutant: exit code} of each module's last run.

    A change of test selection makes mutmut forget every module's results (it
    cannot tell which ones the new selection affects), so each module's are
    kept here after its run, and written back to the .meta files at the end
    for ``mutmut results`` and ``mutmut browse``.
    """
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def save_results(module: str, tests: list[str]) -> None:
    results = load_results()
    codes = json.loads(meta_path(module).read_text())["exit_code_by_key"]
    # "No tests" on PostgreSQL includes the SQLite-only branches (the embedded
    # default's), which only the SQLite pass reaches: judge those there too.
    survivors = [n for n, code in codes.items() if code in SURVIVED | NO_TESTS]
    # A test that fails on SQLite without any mutant would "kill" every
    # survivor there: only a selection that passes unmutated can judge them.
    if survivors and _fails_on_sqlite("", tests):
        print(f"{module}: its tests fail on SQLite without a mutant; no SQLite pass")
        survivors = []
    for name in survivors:
        if _fails_on_sqlite(name, tests):
            codes[name] = KILLED_ON_SQLITE
    results[module] = codes
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))


KILLED_ON_SQLITE = 3  # counted with the killed (mutmut's own 3 is a killed one too)


def _fails_on_sqlite(name: str, tests: list[str]) -> bool:
    """Does a test of ``tests`` fail with mutant ``name`` active on SQLite?

    ``name`` empty: with no mutant active (the baseline).
    """
    env = {**os.environ, "MUTANT_UNDER_TEST": name}
    cmd = [sys.executable, "-m", "pytest", "--ds", "scheduler_project.settings.test_sqlite"]
    cmd += ["-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", "--timeout=60", *tests]
    done = subprocess.run(cmd, cwd=ROOT / "mutants", env=env, capture_output=True, check=False)
    return done.returncode == 1  # 1: a test failed (5: none ran, 2-4: not the mutant's doing)


def restore_meta(results: dict[str, dict[str, int | None]]) -> None:
    for module, codes in results.items():
        meta = meta_path(module)
        if not meta.exists():
            continue
        data = json.loads(meta.read_text())
        known = data["exit_code_by_key"]
        known.update({name: code for name, code in codes.items() if name in known})
        meta.write_text(json.dumps(data, indent=4))


@dataclass(frozen=True)
class Listed:
    reason: str
    mutation: str  # digest of the changed lines the row was checked against


ROW = re.compile(r"^\|\s*`([^`]+__mutmut_\d+)`\s*\|(.*)\|\s*`([0-9a-f]{10})`\s*\|\s*$")


def listed_rows() -> dict[str, Listed]:
    """The rows of docs/mutation-testing.md: ``| `name` | change | why | `digest` |``."""
    if not EQUIVALENTS.exists():
        return {}
    found = {}
    for line in EQUIVALENTS.read_text().splitlines():
        if m := ROW.match(line):
            found[m.group(1)] = Listed(m.group(2).strip(), m.group(3))
    return found


def changed_lines(diff_text: str) -> list[str]:
    """The removed and added lines of a mutant's diff, without positions or context."""
    return [
        line[0] + line[1:].strip()
        for line in diff_text.splitlines()
        if line[:1] in ("-", "+") and not line.startswith(("---", "+++"))
    ]


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:10]


def module_of(name: str) -> str:
    """``payments.engine.sweeper.x_f__mutmut_3`` → ``payments/engine/sweeper.py``."""
    prefix = name.rpartition(".x")[0] if ".x" in name else name
    for module in test_map():
        if dotted(module) == prefix:
            return module
    raise KeyError(name)


def mutations(module: str) -> dict[str, list[str]]:
    """Every mutant of ``module`` as mutmut would make it from the source now:
    qualified name → its changed lines. From the source alone (no ``mutants/``
    tree, no test run): mutmut numbers a function's mutants in the order it
    generates them, so a name keeps its meaning only while its function's
    earlier mutations stay the same."""
    import libcst as cst
    from mutmut.mutation.diff_apply import read_mutant_function, read_original_function
    from mutmut.mutation.file_mutation import mutate_file_contents

    mutated = mutate_file_contents(module, (ROOT / module).read_text())
    tree = cst.parse_module(mutated.code)  # once: mutmut's own diff parses it per mutant

    def code(function) -> list[str]:
        return cst.Module([function]).code.strip().split("\n")

    prefix = dotted(module) + "."
    found = {}
    for name in mutated.mutant_names:
        before = code(read_original_function(tree, name))
        after = code(read_mutant_function(tree, name))
        diff = difflib.unified_diff(before, after, lineterm="")
        found[prefix + name] = changed_lines("\n".join(diff))
    return found


def moved_rows(
    rows: dict[str, Listed] | None = None, current: dict[str, dict] | None = None
) -> dict[str, str]:
    """Listed rows that no longer name the mutation they were checked against:
    name → what is wrong. A function's change renumbers its mutants, and a row
    keyed by number alone would go on excusing whatever mutant took its
    number — a real gap, once (README: Tests > Mutation testing, session 16).
    ``current`` (module → ``mutations(module)``) is filled as the modules are
    made, for a caller that shows them too."""
    rows = listed_rows() if rows is None else rows
    current = {} if current is None else current
    by_module: dict[str, list[str]] = {}
    problems = {}
    for name in rows:
        try:
            by_module.setdefault(module_of(name), []).append(name)
        except KeyError:
            problems[name] = "not a mutant of a module in [tool.mutation.tests]"
    for module, names in by_module.items():
        if module not in current:
            current[module] = mutations(module)
        now = current[module]
        for name in names:
            if name not in now:
                problems[name] = "no such mutant any more"
            elif digest(now[name]) != rows[name].mutation:
                problems[name] = "now: " + " / ".join(now[name])
    return problems


@dataclass
class Score:
    module: str
    total: int = 0
    killed: int = 0
    timeout: int = 0
    no_tests: int = 0
    other: int = 0
    survived: list[str] = field(default_factory=list)
    equivalent: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # listed as equivalent but killed

    @property
    def caught(self) -> int:
        return self.killed + self.timeout

    def percent(self, of: int) -> str:
        return f"{100 * self.caught / of:.1f}%" if of else "-"


def score(module: str, equivalent: dict[str, str]) -> Score | None:
    results = load_results().get(module)
    if results is None:
        return None
    s = Score(module)
    for name, code in sorted(results.items(), key=lambda kv: _natural(kv[0])):
        s.total += 1
        if code in KILLED:
            s.killed += 1
            if name in equivalent:
                s.stale.append(name)
        elif code in TIMEOUT:
            s.timeout += 1
        elif code in NO_TESTS and name in equivalent:  # survived the SQLite pass too
            s.equivalent.append(name)
        elif code in NO_TESTS:
            s.no_tests += 1
            s.survived.append(name)
        elif code in SURVIVED:
            (s.equivalent if name in equivalent else s.survived).append(name)
        else:  # not checked (an interrupted run), suspicious, segfault
            s.other += 1
            s.survived.append(name)
    return s


def _natural(name: str) -> tuple[str, int]:
    stem, _, n = name.rpartition("__mutmut_")
    return stem, int(n) if n.isdigit() else 0


def diff(module: str, name: str) -> str:
    """What the mutant changes (``mutmut show``), without its file header."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    lines = get_diff_for_mutant(name, path=module).splitlines()
    return "\n".join("    " + line for line in lines if not line.startswith(("---", "+++")))


def report(modules: list[str], *, diffs: bool = False) -> int:
    rows = listed_rows()
    moved = moved_rows(rows)
    equivalent = {name: row.reason for name, row in rows.items() if name not in moved}
    scores = [s for m in modules if (s := score(m, equivalent))]
    if not scores:
        print("No results yet: run scripts/mutation first.")
        return 1
    print()
    print(
        "| module | mutants | killed | timeout | survived | equivalent | no tests "
        "| killed % | killed % of non-equivalent |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for s in scores:
        survived = len(s.survived) - s.no_tests
        print(
            f"| {s.module} | {s.total} | {s.killed} | {s.timeout} | {survived} "
            f"| {len(s.equivalent)} | {s.no_tests} | {s.percent(s.total)} "
            f"| {s.percent(s.total - len(s.equivalent))} |"
        )
    failing = 0
    for s in scores:
        if s.survived:
            failing += 1
            print(f"\n{s.module}: {len(s.survived)} not killed and not listed as equivalent")
            for name in s.survived:
                print(f"  mutmut show {name}")
                if diffs:
                    print(diff(s.module, name))
        if s.stale:
            print(f"\n{s.module}: listed as equivalent in {EQUIVALENTS.name} but now killed")
            for name in s.stale:
                print(f"  {name}")
    if moved:
        print(f"\nrows of {EQUIVALENTS.name} that no longer name the mutation they were checked")
        print("against (not counted as equivalent; check the mutant, then its row):")
        for name, problem in sorted(moved.items(), key=lambda kv: _natural(kv[0])):
            print(f"  {name}: {problem}")
    return 1 if failing or moved else 0


def rows_check() -> int:
    """``--rows``: every listed row against the mutant its name gives now."""
    rows = listed_rows()
    current: dict[str, dict[str, list[str]]] = {}
    moved = moved_rows(rows, current)  # makes each module's mutants once, for both
    for name in sorted(rows, key=_natural):
        if name in moved and moved[name].startswith("not a mutant"):
            print(f"MOVED - {name}: {moved[name]}")
            continue
        lines = current[module_of(name)].get(name)
        mark = "MOVED" if name in moved else "ok"
        stamp = digest(lines) if lines is not None else "-"
        print(f"{mark:5} `{stamp}` {name}\n      row: {rows[name].reason}")
        for line in lines or []:
            print(f"      {line}")
    print(f"\n{len(rows)} rows, {len(moved)} not naming the mutation they were checked against")
    return 1 if moved else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module paths (default: all mapped)")
    parser.add_argument("--summary", action="store_true", help="report the last results only")
    parser.add_argument(
        "--max-children",
        type=int,
        default=int(os.environ.get("MUTATION_CHILDREN", "2")),
        help="mutants tested at once (default: $MUTATION_CHILDREN or 2)",
    )
    parser.add_argument("--diffs", action="store_true", help="show what each survivor changes")
    parser.add_argument(
        "--rows",
        action="store_true",
        help="check each row of docs/mutation-testing.md against the mutant its name "
        "gives now (from the source alone: no run needed) and print its digest",
    )
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    args = parser.parse_args()

    os.chdir(ROOT)
    mapping = test_map()
    if args.rows:
        return rows_check()
    if args.run_one:
        run_one(args.run_one, mapping[args.run_one], args.max_children)
        return 0

    if args.summary and not args.modules:
        return report(list(mapping), diffs=args.diffs)
    modules = args.modules or list(mapping)
    unknown = [m for m in modules if m not in mapping]
    if unknown:
        sys.exit(f"not in [tool.mutation.tests]: {', '.join(unknown)}")
    if not args.summary:
        for module in modules:
            print(f"=== {module} against {' '.join(mapping[module])}", flush=True)
            started = time.monotonic()
            cmd = [sys.executable, __file__, "--run-one", module]
            cmd += ["--max-children", str(args.max_children)]
            subprocess.run(cmd, check=True)
            save_results(module, mapping[module])
            print(f"=== {module}: {time.monotonic() - started:.0f} s", flush=True)
        restore_meta(load_results())
    return report(modules, diffs=args.diffs)


if __name__ == "__main__":
    sys.exit(main())
