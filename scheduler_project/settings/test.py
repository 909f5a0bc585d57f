"""Settings for the test suite: PostgreSQL and Redis, as in production.

``scripts/test`` exports ``DATABASE_URL`` and ``CELERY_BROKER_URL``; the
defaults below point at the local services so a bare ``pytest`` does the same.
"""

import os

os.environ.setdefault("SECRET_KEY", "test-only-secret-key")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/scheduler")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/9")
os.environ.setdefault("LOG_FORMAT", "text")

from .base import *  # noqa: F403

ALLOWED_HOSTS = ["*"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The webhook tests' local receivers listen on 127.0.0.1 over plain http;
# every other address rule stays on (tests/payments/test_webhook_security.py).
WEBHOOK_ALLOW_HTTP = True
WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
# Each test reads the database gauges as they are now; the caching tests set
# their own window.
METRICS_DB_CACHE_SECONDS = 0
METRICS_RENDER_CACHE_SECONDS = 0
