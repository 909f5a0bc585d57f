"""Settings for every process (web, worker, beat, management commands).

All configuration comes from environment variables (see ``.env.example``).
With no ``DATABASE_URL`` / ``CELERY_BROKER_URL`` the service runs on the
embedded default: SQLite plus kombu's filesystem transport under ``var/``, so a
laptop with only Python can run web + worker + beat. Production and the test
suite use PostgreSQL and Redis.
"""

import ipaddress
from datetime import timedelta
from pathlib import Path

import environ
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from payments import routing

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
# ``.env`` (``scripts/dev`` writes one on its first run) fills in what the real
# environment leaves unset, so every ``manage.py`` command in a second terminal
# sees the same DEBUG and SECRET_KEY as the running service. ENV_FILE names
# another file; ENV_FILE="" reads none (the test settings).
ENV_FILE = env.str("ENV_FILE", default=str(BASE_DIR / ".env"))
if ENV_FILE:
    environ.Env.read_env(ENV_FILE, overwrite=False)
VAR_DIR = Path(env.str("VAR_DIR", default=str(BASE_DIR / "var")))

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

# --- HTTPS (manage.py check --deploy) ---------------------------------------
# TLS is terminated by a reverse proxy in production. Name the header it sets
# (e.g. X-Forwarded-Proto) so Django knows a request came over HTTPS; set it
# only behind a proxy that overwrites that header, or a client could claim
# HTTPS. Unset: no proxy header is trusted.
_proxy_ssl_header = env.str("SECURE_PROXY_SSL_HEADER", default="")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)
# Redirect plain HTTP to HTTPS. Off unless set: it needs the TLS proxy above
# (without it every request would redirect to an https:// nobody serves).
# Probes and Prometheus scrape over plain HTTP inside the network, so the
# operations endpoints are exempt.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# HSTS makes browsers refuse plain HTTP to this host for that long; it is
# sticky, so it is switched on deliberately (docker-compose sets a year).
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
# Session and CSRF cookies only over HTTPS, except in a DEBUG run on plain
# http://localhost. Browsers accept secure cookies from http://localhost, so
# a local non-DEBUG run still logs in there.
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not DEBUG)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.humanize",  # intcomma: counts on the operations page
    # runserver leaves static files to WhiteNoise too, so development serves
    # them the way production does (Cookiecutter Django's local settings).
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    # Installed, its middlewares not used: payments.middleware.HttpMetricsMiddleware
    # exports their request series under the same names (both at once would
    # register those names twice and fail at start).
    "django_prometheus",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "axes",
    "ledger",
    "payments",
]

MIDDLEWARE = [
    # Outermost: times every request with all the middleware below (the three
    # django-prometheus request series, without its other ten; see the class).
    "payments.middleware.HttpMetricsMiddleware",
    # Outermost of ours: Django's own 400/403/404 pages under /api/ become JSON
    # errors, with DEBUG on too.
    "payments.middleware.ApiJsonErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (admin CSS/JS, the API docs' Swagger UI bundle) from the web
    # process itself, as Cookiecutter Django does: right after SecurityMiddleware
    # (HTTPS redirect and headers first), before anything that needs a session.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before anything reads the body: an oversized API request is a 413 at once.
    "payments.middleware.ApiBodyLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Turns a lockout flagged by the axes backend into its 429 response.
    "axes.middleware.AxesMiddleware",
    # Views outside DRF (admin, health): database unavailable -> 503, not 500.
    "payments.middleware.DatabaseUnavailableMiddleware",
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
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        # A database host that vanishes (power, network) leaves an open socket
        # that the kernel gives up on only after ~2 hours. libpq's client-side
        # limits turn it into an OperationalError — a transient error to the
        # executor — within about a minute: connecting waits at most
        # DB_CONNECT_TIMEOUT s; an idle wait for an answer sends TCP keepalives
        # after 30 s, every 10 s, and gives up after 3 unanswered; data the
        # server never acknowledges fails after 60 s (tcp_user_timeout). None
        # limits a statement: a long one on a live server answers keepalives.
        # A solo payment worker also has its own task time limits
        # (scheduler_project.task_watchdog). DATABASE_URL's parameters win.
        _libpq_limits = {
            "connect_timeout": env.int("DB_CONNECT_TIMEOUT", default=10),
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
            "tcp_user_timeout": 60_000,
        }
        DATABASES["default"]["OPTIONS"] = _libpq_limits | DATABASES["default"].get("OPTIONS", {})
    # Bounded connection pool (Django's built-in psycopg pool) for the web
    # processes: gunicorn.conf.py sets DB_POOL=true. Each web process holds at
    # most DB_POOL_MAX_SIZE connections, so WEB_CONCURRENCY x DB_POOL_MAX_SIZE
    # bounds the web tier's share of PostgreSQL's max_connections; a request
    # that finds every connection busy (or PostgreSQL unreachable) waits up to
    # DB_POOL_TIMEOUT seconds, then answers 503 with Retry-After
    # (payments.api.errors) instead of opening one more backend until
    # PostgreSQL refuses ("too many clients"). A reachable server connects in
    # milliseconds, so the wait is short: a sync worker waiting is a worker
    # not serving. The pool retries a lost server with doubling delays and
    # starts afresh after DB_POOL_RECONNECT_TIMEOUT, so after an outage it
    # is back within seconds of the database, not minutes.
    # Off elsewhere: Celery's prefork children must not inherit a pool (and its
    # threads) created before the fork, and each child uses one connection.
    if env.bool("DB_POOL", default=False) and DATABASES["default"]["ENGINE"].endswith("postgresql"):
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps connections instead
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": env.int("DB_POOL_MIN_SIZE", default=1),
            "max_size": env.int("DB_POOL_MAX_SIZE", default=4),
            "timeout": env.float("DB_POOL_TIMEOUT", default=2.0),
            "reconnect_timeout": env.float("DB_POOL_RECONNECT_TIMEOUT", default=10.0),
        }
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

# Admin login lockout (django-axes): after AXES_FAILURE_LIMIT failed logins
# for one username from one address, that pair is refused (429) for
# AXES_COOLOFF_MINUTES. Attempts are rows in the database (admin: "Access
# attempts"; delete one to unlock early, or `manage.py axes_reset`). The
# address is the one the API throttles use (NUM_PROXIES), so behind a proxy
# one attacker cannot lock out everyone behind the same proxy address.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("AXES_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["ip_address", "username"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "payments.api.auth.client_ip"
# Failures are what the lockout needs; a row per successful login is not.
AXES_DISABLE_ACCESS_LOG = True

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
# Times in the admin and templates: "2026-11-23 21:13:29 UTC" (scheduler_project.formats).
FORMAT_MODULE_PATH = ["scheduler_project.formats"]

# Static files are served by WhiteNoise (middleware above) in every mode, so
# gunicorn with DEBUG off serves the admin's CSS and the API docs' bundle
# without a separate web server. Production (DEBUG off) serves what
# `manage.py collectstatic` gathered into STATIC_ROOT (the image runs it at
# build time), under content-hashed names with gzip/brotli copies and
# far-future cache headers; a template naming a file collectstatic did not
# see fails loudly. With DEBUG on (runserver, scripts/dev) files come straight
# from the apps and nothing needs collecting.
STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(VAR_DIR / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}


# --- API ------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["payments.api.auth.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["payments.api.auth.IsClient"],
    "DEFAULT_THROTTLE_CLASSES": ["payments.api.auth.ClientRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "client": env.str("API_THROTTLE_RATE", default="100/s"),
        # Per client address, for requests without valid credentials (no token,
        # a wrong or revoked one): only those count, so clients never meet it.
        "anonymous": env.str("API_ANON_THROTTLE_RATE", default="10/s"),
        # Per client address, checked before X-Internal-Auth: guessing the
        # operator token is throttled too.
        "internal": env.str("INTERNAL_API_THROTTLE_RATE", default="10/s"),
        # Per client, on top of "client": creating or changing a webhook endpoint
        # (each resolves its host in the request, up to
        # WEBHOOK_REGISTRATION_DNS_SECONDS), so no client can fill the web threads.
        "webhook_endpoint_writes": env.str("WEBHOOK_ENDPOINT_WRITE_RATE", default="10/min"),
    },
    # Reverse proxies in front of the web processes that append to
    # X-Forwarded-For. 0: the client address is REMOTE_ADDR and the header is
    # ignored (anyone can write it); behind one proxy (that appends), set 1.
    "NUM_PROXIES": env.int("NUM_PROXIES", default=0),
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # ?format=xml and an Accept no renderer meets get JSON, not DRF's
    # undeclared 404 / 406 (payments/api/negotiation.py).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "payments.api.negotiation.FirstRendererIfUnmet",
    # DRF's JSON parser plus a 400 for JSON that PostgreSQL or UTF-8 cannot carry.
    "DEFAULT_PARSER_CLASSES": ["payments.api.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "payments.api.errors.exception_handler",
    # Every timestamp in UTC with microseconds, always written out
    # (payments.clock.ISO_TIMESTAMP_FORMAT; TIME_ZONE is UTC and never switched).
    "DATETIME_FORMAT": "%Y-%m-%dT%H:%M:%S.%fZ",
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
    # Choice sets that share a field name ("status") get names of their own.
    "ENUM_NAME_OVERRIDES": {
        "PaymentStatusEnum": "payments.models.PaymentStatus",
        "OccurrenceStatusEnum": "payments.models.OCCURRENCE_OUTCOMES",
        "RecurringStatusEnum": "payments.models.RecurringStatus",
        "AccountStatusEnum": "ledger.models.AccountStatus",
        "WebhookDeliveryStatusEnum": "payments.models.DeliveryStatus",
        "WebhookEventTypeEnum": "payments.webhooks.EVENT_TYPES",
        "ErrorCodeEnum": "payments.api.errors.ERROR_CODES",
        "EntryKindEnum": "ledger.models.EntryKind",
        "AttemptOutcomeEnum": "payments.models.AttemptOutcome",
        "PaymentEventActorEnum": "payments.models.Actor",
        "PaymentEventTypeEnum": "payments.models.PAYMENT_EVENT_TYPES",
    },
    # The bearerAuth security scheme comes from payments.api.auth.BearerTokenScheme.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",  # the default
        "payments.api.schema.query_may_be_empty",
    ],
}

# --- Payments -------------------------------------------------------------
PAYMENT_MIN_DELAY_SECONDS = env.int("PAYMENT_MIN_DELAY_SECONDS", default=1)
PAYMENT_MAX_DELAY_SECONDS = env.int("PAYMENT_MAX_DELAY_SECONDS", default=365 * 24 * 3600)
IDEMPOTENCY_TTL_SECONDS = env.int("IDEMPOTENCY_TTL_SECONDS", default=24 * 3600)
# An IN_FLIGHT key older than this belongs to a request whose process died.
IDEMPOTENCY_IN_FLIGHT_TIMEOUT = env.int("IDEMPOTENCY_IN_FLIGHT_TIMEOUT", default=60)
# Largest API request body; bigger ones are refused (413 payload_too_large)
# before anything reads or writes. The largest real request (a payment with
# 4 KiB of metadata) is far below it.
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", default=64 * 1024)
# Seconds a client is told to wait (Retry-After) when the database is
# unavailable or saturated (503 service_unavailable).
SERVICE_UNAVAILABLE_RETRY_AFTER = env.int("SERVICE_UNAVAILABLE_RETRY_AFTER", default=2)

# --- Metrics ----------------------------------------------------------------
# /metrics answers requests carrying "Authorization: Bearer <METRICS_TOKEN>"
# (unset: no token is accepted) or coming from METRICS_ALLOWED_NETWORKS,
# judged by the connection's address (REMOTE_ADDR), never X-Forwarded-For.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", default=["127.0.0.0/8", "::1/128"])
try:
    for _network in METRICS_ALLOWED_NETWORKS:
        ipaddress.ip_network(_network)
except ValueError as exc:
    raise ImproperlyConfigured(f"METRICS_ALLOWED_NETWORKS: {exc}") from None
# The database-derived gauges (counts over all payments) are computed at most
# once per this many seconds per process, however often /metrics is scraped.
METRICS_DB_CACHE_SECONDS = env.float("METRICS_DB_CACHE_SECONDS", default=15.0)
# The whole rendered exposition is reused for this long per process, so the
# CPU /metrics costs is bounded whatever the scrape rate (24 scrapers back to
# back rendered ~350 times a second and took a core from the payment workers);
# Prometheus scrapes every 15 s and loses nothing.
METRICS_RENDER_CACHE_SECONDS = env.float("METRICS_RENDER_CACHE_SECONDS", default=1.0)

# --- Celery ---------------------------------------------------------------
_filesystem_broker = VAR_DIR / "broker"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://localhost//")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # Our atomic variant of kombu's filesystem transport (scheduler_project.broker):
    # the stock one hands readers half-written messages and killed the dev workers.
    from scheduler_project.broker import register as _register_embedded_broker

    _register_embedded_broker()
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
        # The filesystem transport polls its folder; 0.1 s keeps local
        # lateness low at negligible CPU.
        "polling_interval": 0.1,
    }
else:
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        # kombu's Redis transport with channels that survive the consumer's
        # close after a broker restart (scheduler_project.redis_transport):
        # the stock one killed busy workers when Redis restarted.
        from scheduler_project.redis_transport import register as _register_redis_transport

        _register_redis_transport()
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Redis re-delivers an unacked message only after the visibility
        # timeout. Our own lease reaper recovers lost work much sooner (see
        # PAYMENT_LEASE_SECONDS), so this only bounds how long a crashed
        # worker's message sits before Redis hands it out again; it must stay
        # longer than any ETA we publish with, or Redis would re-deliver
        # ETA'd messages early and repeatedly.
        "visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600),
    }
# --- Cache (API throttles) ---------------------------------------------------
# Throttle counters must be shared by every web process, or N processes allow
# N times the rate. CACHE_URL wins when set (a redis:// URL uses Django's
# built-in Redis backend); otherwise, when the broker is Redis (docker-compose,
# production), the cache lives there too under its own key prefix; otherwise
# (laptop: file broker) each process keeps its own, enough for one server.
# Short socket timeouts: the throttles let requests through (and log) when
# Redis does not answer, rather than hanging or failing the API.
_CACHE_REDIS_OPTIONS = {"socket_connect_timeout": 1, "socket_timeout": 1}
if env.str("CACHE_URL", default=""):
    CACHES = {"default": env.cache_url("CACHE_URL")}
    if CACHES["default"]["BACKEND"].endswith("RedisCache"):
        CACHES["default"]["BACKEND"] = "scheduler_project.cache.RedisCache"
        CACHES["default"].setdefault("KEY_PREFIX", "scheduler")
        CACHES["default"]["OPTIONS"] = _CACHE_REDIS_OPTIONS | CACHES["default"].get("OPTIONS", {})
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CACHES = {
        "default": {
            "BACKEND": "scheduler_project.cache.RedisCache",
            "LOCATION": CELERY_BROKER_URL,
            "KEY_PREFIX": "scheduler",
            "OPTIONS": _CACHE_REDIS_OPTIONS,
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

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

# Execution semantics (DESIGN §4.1). The database, not the broker, is what
# guarantees exactly-once: a message is only a hint "this chunk is due"; the
# executor re-checks status + fence under a row lock, and the journal entry's
# UNIQUE reference refuses a second posting. So the broker only needs
# at-least-once delivery, which these settings give:
# - acks_late: a message is acknowledged after the task ran, so a worker that
#   dies mid-task leaves it unacknowledged and it is delivered again;
CELERY_TASK_ACKS_LATE = True
# - reject_on_worker_lost: ...including when the pool child is SIGKILLed/OOMed
#   (without this Celery acks such a task as failed and it would be lost until
#   the lease reaper re-claims it);
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# - prefetch 1: each pool process reserves one message at a time, so a slow or
#   dying worker strands at most one chunk and others take the rest;
CELERY_WORKER_PREFETCH_MULTIPLIER = env.int("CELERY_WORKER_PREFETCH_MULTIPLIER", default=1)
# - time limits: a task normally takes milliseconds; a hung one is interrupted
#   (soft, 90 s: SoftTimeLimitExceeded, retried) or killed (hard, 120 s) and
#   its message redelivered. Celery applies them in prefork pools only; the
#   payment workers run the solo pool (Procfile; the process that takes a
#   chunk runs it, with no pool child to hand it to) and apply the same two
#   limits themselves (scheduler_project.task_watchdog). The executor's
#   transaction also carries a limit in PostgreSQL (PAYMENT_BATCH_TIMEOUT_SECONDS
#   below), and the database connection libpq's (DATABASES above).
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=90)
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=120)
# Database connections in workers: Celery's Django fixup closes every
# connection before and after every task unless CELERY_DB_REUSE_MAX is set, so
# each chunk paid a new PostgreSQL backend (fork, auth, cold catalog caches) —
# a measurable share of a small chunk's cost. We turn that off and instead
# apply Django's own per-request rule around each task
# (scheduler_project.celery: close_old_connections — a connection is closed
# when it saw an error and fails its health check, or is older than
# CONN_MAX_AGE), so a backend killed under us is replaced at the next task.
CELERY_DB_REUSE_MAX = 2**62
# The broker-level visibility timeout (Redis, above) only decides when Redis
# itself re-delivers an unacknowledged message; our lease
# (PAYMENT_LEASE_SECONDS) is the real recovery path and is much shorter.

# Queues and the process pools that consume them (DESIGN §2, §8). One queue
# per payment partition, so payments of one source account are always on one
# queue and workers can consume any subset
# (celery -A scheduler_project worker -Q payments.p00,payments.p01). Beside
# them, each kind of background work has a queue of its own, consumed by a
# worker of its own in production (Procfile, docker-compose.yml), so no kind
# can delay another by occupying its pool:
# - "timers": the durable timer (sweeper every second, lease reaper). A
#   one-process worker does nothing else: the sweep never waits behind
#   payment chunks, a materialiser run or a webhook.
# - "recurring": the recurring materialiser (time-boxed runs, 60 s ahead of
#   due) plus "default" maintenance (reconciliation, idempotency purge) on a
#   two-process worker, so an hour-long reconciliation cannot hold it up.
# - "webhooks": deliveries, on a threads-pool worker: a slow client endpoint
#   costs a thread for at most WEBHOOK_TIMEOUT_SECONDS, never a payment slot.
# Payment workers consume everything else (-X timers,recurring,webhooks,default).
# A worker started without -Q/-X consumes every queue, which still works (the
# process tests run so) but gives up that isolation.
PAYMENT_PARTITIONS = env.int("PAYMENT_PARTITIONS", default=16)
TIMER_QUEUE = routing.TIMER_QUEUE
RECURRING_QUEUE = routing.RECURRING_QUEUE
WEBHOOK_QUEUE = routing.WEBHOOK_QUEUE
CELERY_TASK_DEFAULT_QUEUE = routing.DEFAULT_QUEUE
CELERY_TASK_QUEUES = {
    TIMER_QUEUE: {"exchange": TIMER_QUEUE, "routing_key": TIMER_QUEUE},
    RECURRING_QUEUE: {"exchange": RECURRING_QUEUE, "routing_key": RECURRING_QUEUE},
    CELERY_TASK_DEFAULT_QUEUE: {
        "exchange": CELERY_TASK_DEFAULT_QUEUE,
        "routing_key": CELERY_TASK_DEFAULT_QUEUE,
    },
    **routing.payment_queues(PAYMENT_PARTITIONS),
    WEBHOOK_QUEUE: {"exchange": WEBHOOK_QUEUE, "routing_key": WEBHOOK_QUEUE},
}
CELERY_TASK_CREATE_MISSING_QUEUES = True
CELERY_TASK_ROUTES = {
    "payments.sweep": {"queue": TIMER_QUEUE},
    "payments.reap_leases": {"queue": TIMER_QUEUE},
    "payments.materialize_recurring": {"queue": RECURRING_QUEUE},
    "payments.dispatch_webhooks": {"queue": WEBHOOK_QUEUE},
    "payments.deliver_webhook": {"queue": WEBHOOK_QUEUE},
    "payments.retry_webhooks": {"queue": WEBHOOK_QUEUE},
    "payments.purge_webhooks": {"queue": WEBHOOK_QUEUE},
}

# --- Durable timer (DESIGN §4.1) -------------------------------------------
# Claim payments this far ahead of due and publish them with an ETA, so they
# fire at their due instant instead of up to one sweep interval late.
PAYMENT_LOOKAHEAD_SECONDS = env.float("PAYMENT_LOOKAHEAD_SECONDS", default=1.0)
# Rows claimed per sweep statement; the sweeper loops while batches are full.
PAYMENT_SWEEP_BATCH = env.int("PAYMENT_SWEEP_BATCH", default=2000)
# Payments per Celery message (one transaction in the executor).
PAYMENT_CHUNK_SIZE = env.int("PAYMENT_CHUNK_SIZE", default=200)
# The executor's collapse (engine.executor, step 3): besides its chunk's own
# payments a batch runs up to this many more of its partitions' due QUEUED
# backlog, oldest first. Under load the worker takes the partitions' queues in
# turn, so a queue that fell behind is served about as many messages as it
# receives, and each then runs its own (often already run by the message
# before) plus this many: the backlog shrinks by about (limit / chunk - 1)
# of its arrival rate. At one chunk (200), a group of partitions whose
# messages carried ~180 each caught up at a tenth of its arrival rate and
# ran 7-15 s late for minutes while the others were on time (bench,
# 2,250/s); at three chunks it catches up at about twice its arrival rate.
PAYMENT_COLLAPSE_LIMIT = env.int("PAYMENT_COLLAPSE_LIMIT", default=600)
# Payments of one chunk are due within one slot of this grid (counted from
# the Unix epoch); the chunk's ETA is its latest due time, so this bounds the
# lateness chunking adds. Within a slot the claims of every partition share
# chunks up to PAYMENT_CHUNK_SIZE, and a sweep claims whole slots (when the
# lookahead is at least a slot): the wider the slot, the fewer transactions a
# steady flow costs. 300 ms (bench, 2 cores, 60 s steps): at 100/s (137/s
# with the API's) worker CPU 0.389 ms per payment against 0.482 with 200 ms,
# lateness p50/p99 0.15/0.30 s against 0.10/0.19 s; at 2,000/s p99 0.96 s.
# 400 ms (session 32, 120 s steps, same host and day): at 100/s 0.275 ms per
# payment against 0.327 (57 payments a message against 43; drain 0.15), p50/p99
# 0.20/0.39 s against 0.15/0.29 s; at 2,000/s p50/p99 0.20/0.55 s
# (bench/results/2026-11-29-s32-spread400/, …-s32-base/).
# Back to 300 ms (session 42): lateness read to each payment's commit instead of
# its lock (bench/run.py --commit-timestamps) adds the batch's own duration,
# 50-150 ms on a slow host, and at 400 ms p50 missed the SLO's 250 ms at 100/s
# in three pairs (0.277-0.293 s against 0.202-0.214 s at 300 ms; 0.140 s at
# 200 ms), for 4 % more worker CPU a payment at 100/s in the same-hour pair
# (0.597 against 0.576 ms; 200 ms: 0.687) — bench/results/2026-11-30-s42-ab*/.
PAYMENT_CHUNK_SPREAD_MS = env.int("PAYMENT_CHUNK_SPREAD_MS", default=300)
# A sweeper's message whose payments another transaction holds (usually the
# other worker's collapse, which took them in) does not wait for it: it hands
# them back to run again after this long (engine.executor, step 1), doubled at
# each further hand-back; the fourth goes out as a message that waits for the
# rows (tasks.BUSY_HOPS). They are usually done by then; if the holder rolled
# back they run then, not after the lease. A batch holds its rows for tens to
# a few hundred milliseconds.
PAYMENT_BUSY_RETRY_MS = env.int("PAYMENT_BUSY_RETRY_MS", default=250)
# How long a QUEUED payment may wait for a worker before the reaper returns it
# to PENDING with a new fence (worker died, message lost, Redis flushed).
PAYMENT_LEASE_SECONDS = env.int("PAYMENT_LEASE_SECONDS", default=60)
# Backpressure: the sweeper stops claiming while this many are QUEUED, so a
# backlog waits in PostgreSQL (cheap, durable) rather than as leases that
# could expire in the broker.
# A few seconds of executor work: with the sweeper on its own worker, 50,000
# were claimed at once in a 100k drain, the leases outran the executors and
# 11,638 expired (bench, 2 cores); the executors' pace now sets the claiming.
PAYMENT_MAX_QUEUED = env.int("PAYMENT_MAX_QUEUED", default=10_000)
# The sweeper also holds back while QUEUED claims have waited more than half
# their lease. The oldest this-many claims are ignored for it: they may be
# lost messages (a killed worker's chunks) waiting for the reaper.
PAYMENT_LOST_CLAIMS_TOLERATED = env.int("PAYMENT_LOST_CLAIMS_TOLERATED", default=400)
# While it has work (it claimed something, or held back) one beat tick of the
# sweeper sweeps again every PAYMENT_SWEEP_TICK_MS for up to
# PAYMENT_SWEEP_WINDOW_SECONDS (under beat's 1 s interval); an idle one returns.
PAYMENT_SWEEP_TICK_MS = env.int("PAYMENT_SWEEP_TICK_MS", default=200)
PAYMENT_SWEEP_WINDOW_SECONDS = env.float("PAYMENT_SWEEP_WINDOW_SECONDS", default=0.9)
# Claims before a payment is dead-lettered (FAILED max_attempts_exceeded).
PAYMENT_MAX_ATTEMPTS = env.int("PAYMENT_MAX_ATTEMPTS", default=5)
# The executor's time limit per batch, in PostgreSQL (ledger.db.transaction_time_bound):
# no statement of its transaction runs longer, and the transaction does not sit
# idle longer (a stuck process's row locks are freed by the server). A batch
# takes milliseconds (an 800-payment one ~0.3 s on 2 cores); one that hits the
# limit fails with OperationalError, a transient error: retried with backoff,
# then split. It bounds each statement and each idle spell, not the batch as a
# whole, so a batch of several slow statements can outlast the lease; the
# reaper still never takes back a payment a live batch is running (it skips
# rows locked, and the batch holds its payments' rows from its first statement).
PAYMENT_BATCH_TIMEOUT_SECONDS = env.float("PAYMENT_BATCH_TIMEOUT_SECONDS", default=30.0)
# ...and no row lock of a batch is waited for longer than this (lock_timeout):
# an account another session keeps locked (a staff member's or an operator's
# open transaction, a stuck process) stalled every batch that collapsed one of
# its payments for up to the 30 s above, the other clients' payments in it with
# it. Past it the batch is retried with its own payments alone and what it
# collapsed stays out of that worker's collapses for a lease (executor.Quarantine).
# Batches hold account locks for their last statements only (milliseconds).
PAYMENT_LOCK_TIMEOUT_SECONDS = env.float("PAYMENT_LOCK_TIMEOUT_SECONDS", default=5.0)
# The lease reaper shares the timer worker with the sweeper: it starts no new
# dead letter (a transaction each) after this many seconds of a run; the next
# run, 5 s later, carries on, oldest lease first.
PAYMENT_REAPER_BUDGET_SECONDS = env.float("PAYMENT_REAPER_BUDGET_SECONDS", default=0.5)
# ...and no statement of a dead letter waits longer than this (statement_timeout,
# local to its transaction): one whose hold's account another session keeps
# locked is put off a minute instead of holding up the timer worker's sweeps.
PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS = env.float(
    "PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS", default=0.5
)
# Executor retries of a chunk on transient database errors before splitting it.
PAYMENT_CHUNK_RETRIES = env.int("PAYMENT_CHUNK_RETRIES", default=3)
# Recurring payments: occurrences are materialised (hold placed, payment
# created) this long before they are due; an occurrence whose time passed more
# than the grace ago when it is first handled was missed (service down) and
# follows the schedule's missed-run policy.
RECURRING_MATERIALIZE_AHEAD_SECONDS = env.int("RECURRING_MATERIALIZE_AHEAD_SECONDS", default=60)
RECURRING_MISSED_GRACE_SECONDS = env.int("RECURRING_MISSED_GRACE_SECONDS", default=60)
# The materialiser's work per run is bounded whatever clients schedule: it
# starts no new schedule after this many seconds (the next run, 5 s later,
# carries on), reads schedules this many at a time, and handles at most this
# many occurrence instants of one schedule per run (a long catch-up after
# downtime is spread over runs instead of holding one transaction).
RECURRING_MATERIALIZE_BUDGET_SECONDS = env.float(
    "RECURRING_MATERIALIZE_BUDGET_SECONDS", default=2.0
)
RECURRING_MATERIALIZE_BATCH = env.int("RECURRING_MATERIALIZE_BATCH", default=200)
# No statement of the materialiser's transactions waits or runs longer than this
# (PostgreSQL's statement_timeout, local to each): a schedule whose source account
# another session keeps locked is retried by a later run, after the others,
# instead of holding up every client's schedules for as long as the lock lasts.
RECURRING_STATEMENT_TIMEOUT_SECONDS = env.float("RECURRING_STATEMENT_TIMEOUT_SECONDS", default=1.0)
RECURRING_MAX_OCCURRENCES_PER_RUN = env.int("RECURRING_MAX_OCCURRENCES_PER_RUN", default=200)
# The occurrences of one schedule that run (a hold each) are committed this many
# at a time: a hold locks the source account until commit, and the payment
# workers' batches paying from or to it wait that long (at least 1).
RECURRING_OCCURRENCES_PER_TRANSACTION = max(
    1, env.int("RECURRING_OCCURRENCES_PER_TRANSACTION", default=20)
)
# Support staff's bulk actions (cancel, retry, freeze, unfreeze) refuse a
# selection larger than this: each item is a transaction in the web request.
ADMIN_ACTION_MAX_ITEMS = env.int("ADMIN_ACTION_MAX_ITEMS", default=500)
# An unfiltered admin list of a table PostgreSQL estimates at this many rows or
# more shows (and pages by) that estimate instead of a COUNT(*) of them all.
ADMIN_ESTIMATED_COUNT_FROM = env.int("ADMIN_ESTIMATED_COUNT_FROM", default=100_000)
# Per-client quota: active + paused schedules (422 limit_exceeded beyond it).
RECURRING_MAX_ACTIVE_PER_CLIENT = env.int("RECURRING_MAX_ACTIVE_PER_CLIENT", default=100)
# Webhooks: tries per delivery, first retry delay (doubling, capped at 1 h).
WEBHOOK_MAX_ATTEMPTS = env.int("WEBHOOK_MAX_ATTEMPTS", default=8)
# Finished deliveries (succeeded or failed) and their attempts are deleted this
# many days after they were made (hourly, payments.purge_webhooks; 0 keeps them):
# at 100 events/s an endpoint made ~8.6M rows a day, and deleting a busy
# endpoint took its whole history with it in one web request.
WEBHOOK_RETENTION_DAYS = env.int("WEBHOOK_RETENTION_DAYS", default=30)
WEBHOOK_BACKOFF_SECONDS = env.float("WEBHOOK_BACKOFF_SECONDS", default=5.0)
# Total wall-clock budget of one delivery request (DNS + connect + TLS + send +
# response status and headers), so a slow or drip-feeding endpoint holds a
# delivery thread at most this long.
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", default=5.0)
# The DNS lookup at registration (POST/PATCH of an endpoint) runs inside the
# web request: a name whose servers never answer holds a web thread this long,
# then the URL is refused. With WEBHOOK_ENDPOINT_WRITE_RATE (below) it bounds
# how much of the web tier one client's endpoint writes can hold.
WEBHOOK_REGISTRATION_DNS_SECONDS = env.float("WEBHOOK_REGISTRATION_DNS_SECONDS", default=2.0)
# Endpoint URLs must be https; plain http only for local development, because
# signed payment events would otherwise cross the network in clear text.
WEBHOOK_ALLOW_HTTP = env.bool("WEBHOOK_ALLOW_HTTP", default=False)
# Host names / IP literals exempt from the address rules (loopback, private,
# link-local, metadata...), matched against the URL's host as written, every
# port. Empty by default: a client must never make the service call its own
# network. For a receiver on the same host in development, or an internal relay.
WEBHOOK_ALLOWED_HOSTS = env.list("WEBHOOK_ALLOWED_HOSTS", default=[])
# Requests one webhook worker process makes at once for one client's endpoints
# (of its --concurrency threads, 16 as shipped): a slow but never failing
# endpoint cannot take every thread; a delivery over the share waits in the
# client's line (no attempt spent) until one of the client's requests ends.
WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT = max(1, env.int("WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT", default=4))
# Endpoints per client (active or not): bounds the fan-out one event can cause.
WEBHOOK_MAX_ENDPOINTS_PER_CLIENT = env.int("WEBHOOK_MAX_ENDPOINTS_PER_CLIENT", default=10)
# Circuit breaker per endpoint: this many consecutive failed attempts open it;
# while open, deliveries wait without a request (and without spending an
# attempt); after the cool-down one delivery probes. The cool-down doubles on
# each re-open, capped at one hour, so a dead endpoint costs almost nothing.
WEBHOOK_CIRCUIT_FAILURES = env.int("WEBHOOK_CIRCUIT_FAILURES", default=5)
WEBHOOK_CIRCUIT_COOLDOWN_SECONDS = env.float("WEBHOOK_CIRCUIT_COOLDOWN_SECONDS", default=60.0)
# Fernet keys (comma-separated, urlsafe base64 of 32 bytes) encrypting webhook
# signing secrets at rest: the first encrypts, all decrypt (rotation: put the new
# key first, run `manage.py rotate_webhook_secrets`, then drop the old one).
# Unset: one key derived from SECRET_KEY (HKDF), so rotating SECRET_KEY would
# make stored secrets unreadable; set a dedicated key in production.
WEBHOOK_SECRET_KEYS = env.list("WEBHOOK_SECRET_KEYS", default=[])
# A key that is not one failed every registration (500) and every delivery
# (retried for ever): refused at start instead, naming its position, not its value.
for _index, _key in enumerate(k.strip() for k in WEBHOOK_SECRET_KEYS):
    try:
        if _key:
            Fernet(_key)  # what payments.webhook_secrets builds from it
    except ValueError:
        raise ImproperlyConfigured(
            f"WEBHOOK_SECRET_KEYS: key {_index + 1} is not a Fernet key "
            "(32 bytes in URL-safe base64, e.g. from Fernet.generate_key())."
        ) from None
# Shared secret for POST /api/v1/internal/payments/{id}/execute (unset = disabled).
INTERNAL_API_TOKEN = env.str("INTERNAL_API_TOKEN", default="")

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
        # Quiet at idle: Celery logs every task received/succeeded and beat every
        # message it sends — a line per second for the sweeper alone. Our own
        # loggers report what matters (a sweep that claimed, a reaper that
        # requeued, every payment transition); Celery's warnings and errors
        # (a failed or retried task) still show.
        # LOG_CELERY_TASKS=true brings those lines back for debugging.
        **{
            name: {"level": "INFO" if env.bool("LOG_CELERY_TASKS", default=False) else "WARNING"}
            for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
        },
        # django-axes announces its version and mode at every process start and
        # every manage.py command; its lockouts are WARNINGs and still show.
        "axes": {"level": "WARNING"},
    },
}
