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

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["bench.harness", "bench.chaos", "bench.scenarios"]


def bench_modules():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        yield pkg
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name != "__main__":
                yield importlib.import_module(f"{package}.{info.name}")


def overrides():
    seen = set()
    for module in bench_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not cls.__module__.startswith("bench.") or cls in seen:
                continue
            seen.add(cls)
            for name, method in vars(cls).items():
                if not inspect.isfunction(method):
                    continue
                for base in cls.__mro__[1:]:
                    replaced = vars(base).get(name)
                    if inspect.isfunction(replaced) and base.__module__.startswith("bench."):
                        yield f"{cls.__qualname__}.{name}", method, replaced
                        break


def missing(method, replaced) -> list[str]:
    """Parameters of ``replaced`` a call could pass that ``method`` refuses."""
    mine = inspect.signature(method).parameters
    takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in mine.values())
    takes_var_pos = any(p.kind is p.VAR_POSITIONAL for p in mine.values())
    gaps = []
    for name, param in inspect.signature(replaced).parameters.items():
        if param.kind is param.VAR_KEYWORD:
            if not takes_var_kw:
                gaps.append(f"**{name}")
        elif param.kind is param.VAR_POSITIONAL:
            if not takes_var_pos:
                gaps.append(f"*{name}")
        elif name not in mine and not takes_var_kw:
            gaps.append(name)
        elif (
            name in mine and param.default is not param.empty and mine[name].default is param.empty
        ):
            gaps.append(f"{name} (optional in the base, required here)")
    return gaps


def test_the_checker_sees_the_override_that_broke_the_chaos_command():
    def base(self, role, args, nice=0, **env): ...

    def before_the_fix(self, role, args): ...

    def after(self, role, args, nice=0, **env): ...

    assert missing(before_the_fix, base) == ["nice", "**env"]
    assert missing(after, base) == []


def test_some_overrides_are_found():
    names = {name for name, _, _ in overrides()}
    assert "ChaosService.start" in names


@pytest.mark.parametrize(
    ("name", "method", "replaced"), list(overrides()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_an_override_accepts_whatever_its_base_accepts(name, method, replaced):
    assert missing(method, replaced) == [], name
