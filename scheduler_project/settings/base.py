"""Settings for every process (web, worker, beat, management commands).

All configuration comes from environment variables (see ``.env.example``).
With no ``DATABASE_URL`` / ``CELERY_BROKER_URL`` the service runs on the
embedded default: SQLite plus kombu's filesystem transport under ``var/``, so a
laptop with only Python can run web + worker + beat. Production and the test
suite use PostgreSQL and Redis.
"""

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(environ.Env().str("VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)

# A fixed key is acceptable only for a local DEBUG run; anything else must set
# SECRET_KEY so sessions and signatures cannot be forged.
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("Set SECRET_KEY (or DEBUG=true for a local run).")
    SECRET_KEY = "insecure-dev-only-key-do-not-use-in-production"  # noqa: S105

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "ledger",
    "payments",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "scheduler_project.urls"
WSGI_APPLICATION = "scheduler_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
# PostgreSQL is the one source of truth and the one clock. SQLite is the
# embedded default for a laptop: WAL lets readers run beside the single writer,
# IMMEDIATE transactions take the write lock up front (no lock-upgrade
# deadlocks between web, worker and beat), and the timeout waits out a busy
# writer instead of failing.
if env.str("DATABASE_URL", default=""):
    DATABASES = {"default": env.db("DATABASE_URL")}
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "db.sqlite3",
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- Cache (API throttling) ---------------------------------------------
# Throttle counters must be shared by every web process: set CACHE_URL to
# Redis in production (e.g. redis://127.0.0.1:6379/1). The default keeps them
# per process, which is enough for one local server.
CACHES = {"default": env.cache("CACHE_URL", default="locmemcache://")}

# --- API ------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["payments.api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["payments.api.auth.ClientRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"client": env.str("API_THROTTLE_RATE", default="100/s")},
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "payments.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Delayed payment scheduler API",
    "DESCRIPTION": (
        "Schedule payments to run after a delay or at an instant; exactly once, "
        'with a double-entry ledger. Errors: {"error": {"code", "message", "details"}}.'
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    # Swagger UI served from the sidecar package: the docs page needs no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SECURITY": [{"bearerAuth": []}],
    "APPEND_COMPONENTS": {"securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
}

# --- Payments -------------------------------------------------------------
PAYMENT_PARTITIONS = env.int("PAYMENT_PARTITIONS", default=16)
PAYMENT_MIN_DELAY_SECONDS = env.int("PAYMENT_MIN_DELAY_SECONDS", default=1)
PAYMENT_MAX_DELAY_SECONDS = env.int("PAYMENT_MAX_DELAY_SECONDS", default=365 * 24 * 3600)
IDEMPOTENCY_TTL_SECONDS = env.int("IDEMPOTENCY_TTL_SECONDS", default=24 * 3600)
# An IN_FLIGHT key older than this belongs to a request whose process died.
IDEMPOTENCY_IN_FLIGHT_TIMEOUT = env.int("IDEMPOTENCY_IN_FLIGHT_TIMEOUT", default=60)

# --- Celery ---------------------------------------------------------------
_filesystem_broker = VAR_DIR / "broker"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://localhost//")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("data", "processed", "control"):
        (_filesystem_broker / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # One folder for in and out: every process publishes and consumes there.
        "data_folder_in": str(_filesystem_broker / "data"),
        "data_folder_out": str(_filesystem_broker / "data"),
        "processed_folder": str(_filesystem_broker / "processed"),
        # Exchange/queue bindings shared between web, beat and worker processes.
        "control_folder": str(_filesystem_broker / "control"),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Redis re-delivers an unacked message only after the visibility
        # timeout. Our own lease reaper recovers lost work much sooner (see
        # PAYMENT_LEASE_SECONDS), so this only bounds how long a crashed
        # worker's message sits before Redis hands it out again; it must stay
        # longer than any ETA we publish with, or Redis would re-deliver
        # ETA'd messages early and repeatedly.
        "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
    }
# Payment outcomes live in PostgreSQL; task results are never read back.
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# JSON only: messages carry ids, never pickled objects or money state.
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_ENABLE_UTC = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Logging --------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOG_FORMAT = env.str("LOG_FORMAT", default="text" if DEBUG else "json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {"asctime": "ts", "levelname": "level", "name": "logger"},
        },
        "text": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
    },
}
