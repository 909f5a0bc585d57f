"""Settings for the test suite: PostgreSQL and Redis, as in production.

``scripts/test`` exports ``DATABASE_URL`` and ``CELERY_BROKER_URL``; the
defaults below point at the local services so a bare ``pytest`` does the same.
"""

import os

# A developer's .env (DEBUG=true from scripts/dev) must not change the suite.
os.environ.setdefault("ENV_FILE", "")
os.environ.setdefault("SECRET_KEY", "test-only-secret-key")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/scheduler")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/9")
os.environ.setdefault("LOG_FORMAT", "text")

from .base import *  # noqa: F403

ALLOWED_HOSTS = ["*"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The suite runs with DEBUG off but never needs `collectstatic`: files are
# found in the apps, under their plain names, as in development. The
# production storage (hashed names from collectstatic's manifest) is tested by
# tests/scheduler_project/test_production_static.py, with the base settings.
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True

# The webhook tests' local receivers listen on 127.0.0.1 over plain http;
# every other address rule stays on (tests/payments/test_webhook_security.py).
WEBHOOK_ALLOW_HTTP = True
WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
# Each test reads the database gauges as they are now; the caching tests set
# their own window.
METRICS_DB_CACHE_SECONDS = 0
METRICS_RENDER_CACHE_SECONDS = 0
