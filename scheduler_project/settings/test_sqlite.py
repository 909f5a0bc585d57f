"""The test settings on SQLite: the embedded default's database.

``scripts/test`` runs the API and engine test modules a second time with these
settings (``pytest --ds scheduler_project.settings.test_sqlite``), so what
``scripts/dev`` runs on is tested too. Tests that need PostgreSQL (query plans,
triggers, ``pg_terminate_backend``, real concurrent writers) carry the
``postgres`` marker and are skipped here.
"""

from .test import *  # noqa: F403
from .test import VAR_DIR

# per checkout: two checkouts' runs never share it. VAR_DIR is not in git, so a
# fresh clone (CI) has none until something creates it.
VAR_DIR.mkdir(parents=True, exist_ok=True)
_path = VAR_DIR / "test.sqlite3"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _path,
        # a file, not pytest-django's default in-memory database: the code under
        # test opens its own connections (threads) as the service does
        "TEST": {"NAME": _path},
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
}
