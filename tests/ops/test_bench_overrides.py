"""The benchmark and chaos commands' subclasses still take what their bases pass.

``bench/chaos.py`` crashed at start from session 16 to 18: the harness's
``Service.start`` gained a ``nice`` argument (and ``celery()`` passed it), and
``ChaosService.start``, which overrides it, did not — a ``TypeError`` before
any fault ran, in a command the README documents and nothing in the suite
ran. This checks every class under ``bench/`` against the classes it
overrides: an override must accept every parameter of the method it
replaces, by the same name and kind, so the base's own callers still work.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Signature:
    """The parameters of a function definition, read from its source (the
    bench's modules need its extra's packages to import; the suite has not)."""

    def __init__(self, node: ast.FunctionDef):
        a = node.args
        positional = [*a.posonlyargs, *a.args]
        first_default = len(positional) - len(a.defaults)
        self.params = {arg.arg: i >= first_default for i, arg in enumerate(positional)}
        for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            self.params[arg.arg] = default is not None
        self.var_pos = a.vararg.arg if a.vararg else None
        self.var_kw = a.kwarg.arg if a.kwarg else None


def classes():
    """Every class defined under bench/: name -> (base names, {method: Signature})."""
    found = {}
    for path in sorted((ROOT / "bench").rglob("*.py")):
        if "results" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                ]
                methods = {
                    f.name: Signature(f)
                    for f in node.body
                    if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                }
                found.setdefault(node.name, []).append((bases, methods))
    return found


def overrides():
    found = classes()
    for name, definitions in found.items():
        for bases, methods in definitions:
            for base in bases:
                for _, base_methods in found.get(base, []):
                    for method, signature in methods.items():
                        if method in base_methods:
                            yield f"{name}.{method}", signature, base_methods[method]


def missing(method: Signature, replaced: Signature) -> list[str]:
    """Parameters of ``replaced`` a call could pass that ``method`` refuses."""
    gaps = []
    for name, optional in replaced.params.items():
        if name not in method.params and not method.var_kw:
            gaps.append(name)
        elif name in method.params and optional and not method.params[name]:
            gaps.append(f"{name} (optional in the base, required here)")
    if replaced.var_pos and not method.var_pos:
        gaps.append(f"*{replaced.var_pos}")
    if replaced.var_kw and not method.var_kw:
        gaps.append(f"**{replaced.var_kw}")
    return gaps


def signature(source: str) -> Signature:
    return Signature(ast.parse(inspect.cleandoc(source)).body[0])


def test_the_checker_sees_the_override_that_broke_the_chaos_command():
    base = signature("def start(self, role, args, nice=0, **env): ...")
    before_the_fix = signature("def start(self, role, args): ...")
    after = signature("def start(self, role, args, nice=0, **env): ...")
    assert missing(before_the_fix, base) == ["nice", "**env"]
    assert missing(after, base) == []
    required = signature("def start(self, role, args, nice, **env): ...")
    assert missing(required, base) == ["nice (optional in the base, required here)"]


def test_some_overrides_are_found():
    names = {name for name, _, _ in overrides()}
    assert "ChaosService.start" in names


@pytest.mark.parametrize(
    ("name", "method", "replaced"), list(overrides()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_an_override_accepts_whatever_its_base_accepts(name, method, replaced):
    assert missing(method, replaced) == [], name
