"""Effectgate settings.

Every value that differs between a laptop and production is read from the environment
here, and only here. The defaults run locally with no other server: SQLite under
``var/``, background work in-process, a secret key generated once and kept in ``var/``.
README.md lists each variable.
"""

import ipaddress
import json
import os
import re
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

# console/ holds the templates and static files (package data of the wheel).
PACKAGE_DIR = Path(__file__).resolve().parent
BASE_DIR = PACKAGE_DIR.parent


def _default_var_dir() -> Path:
    """Where local state lives (the SQLite database without DATABASE_URL, the secret key
    generated without SECRET_KEY, static files collected without STATIC_ROOT): in a
    checkout, var/ beside manage.py; installed from the wheel, one folder per user
    (``$XDG_DATA_HOME/effectgate``), the same for every process whatever folder it
    starts in, so that they all share one key and one database."""
    if (BASE_DIR / "manage.py").is_file():
        return BASE_DIR / "var"
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "effectgate"


VAR_DIR = Path(os.environ.get("EFFECTGATE_VAR_DIR") or _default_var_dir())


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _local_secret(name: str) -> str:
    """Read a secret kept in var/, creating it on first use (local mode only)."""
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    path = VAR_DIR / name
    if not path.exists():
        # Written with a restrictive mode so other local users cannot read it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    # A key another local user could have written (or can read) signs nothing here.
    info = path.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise ImproperlyConfigured(
            f"{path} must belong to this user and be readable by nobody else "
            f"(chmod 600), or set SECRET_KEY."
        )
    return path.read_text().strip()


DEBUG = _env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY") or _local_secret("secret_key")
ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS")

# The key that turns "x-sensitive" argument values into HMAC digests. Rotating it
# changes the digests (and so the intent hashes) of new registrations only; the key id
# is stored in every digest so that old ones stay attributable.
SENSITIVE_ARGUMENT_KEY = os.environ.get("SENSITIVE_ARGUMENT_KEY") or SECRET_KEY
SENSITIVE_ARGUMENT_KEY_ID = os.environ.get("SENSITIVE_ARGUMENT_KEY_ID", "k1")

# The key of every event's MAC (operations/eventmac.py, docs/security.md §4): HMAC-SHA256
# of the event's hash, written as "<key id>:<hex>". Held by the application alone (the
# environment or a file, never the database), so credentials to the database alone
# cannot write an event that `audit verify` accepts. At least 32 random bytes, in hex.
# After a rotation the old keys stay listed in AUDIT_EVENT_OLD_KEYS ("id:hex,id:hex")
# to verify the events they signed. Unset: events carry no MAC and verify says so.
_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,15}$")
EVENT_KEY_MIN_BYTES = 32


def _event_key(name: str, text: str) -> str:
    """A MAC key given in hex, at least EVENT_KEY_MIN_BYTES bytes; lower-case hex."""
    text = text.strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name} is not hex; make one with "
            "python -c 'import secrets; print(secrets.token_hex(32))'"
        ) from None
    if len(key) < EVENT_KEY_MIN_BYTES:
        raise ImproperlyConfigured(
            f"{name} holds {len(key)} bytes; an event key needs at least "
            f"{EVENT_KEY_MIN_BYTES} (64 hex digits)"
        )
    return key.hex()


def _event_key_id(name: str, text: str) -> str:
    if not _KEY_ID.match(text):
        raise ImproperlyConfigured(
            f"{name}: {text!r} is not a key id (1 to 15 letters, digits, '.', '_' or '-')"
        )
    return text


def _event_key_setting() -> str:
    value = os.environ.get("AUDIT_EVENT_KEY", "")
    path = os.environ.get("AUDIT_EVENT_KEY_FILE", "").strip()
    if value.strip() and path:
        raise ImproperlyConfigured("Set AUDIT_EVENT_KEY or AUDIT_EVENT_KEY_FILE, not both")
    if path:
        try:
            value = Path(path).read_text()
        except OSError as exc:
            raise ImproperlyConfigured(f"AUDIT_EVENT_KEY_FILE: cannot read {path}: {exc}") from exc
        return _event_key(f"AUDIT_EVENT_KEY_FILE ({path})", value)
    return _event_key("AUDIT_EVENT_KEY", value) if value.strip() else ""


def _event_old_keys(text: str) -> dict[str, str]:
    keys = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key_id, colon, key = item.partition(":")
        if not colon:
            raise ImproperlyConfigured(
                "AUDIT_EVENT_OLD_KEYS takes id:hex pairs, comma-separated (k1:ab12...,k2:...)"
            )
        key_id = _event_key_id("AUDIT_EVENT_OLD_KEYS", key_id.strip())
        keys[key_id] = _event_key(f"AUDIT_EVENT_OLD_KEYS ({key_id})", key)
    return keys


AUDIT_EVENT_KEY = _event_key_setting()
AUDIT_EVENT_KEY_ID = _event_key_id(
    "AUDIT_EVENT_KEY_ID", os.environ.get("AUDIT_EVENT_KEY_ID", "k1").strip() or "k1"
)
AUDIT_EVENT_OLD_KEYS = _event_old_keys(os.environ.get("AUDIT_EVENT_OLD_KEYS", ""))
if AUDIT_EVENT_KEY and AUDIT_EVENT_KEY_ID in AUDIT_EVENT_OLD_KEYS:
    raise ImproperlyConfigured(
        f"AUDIT_EVENT_OLD_KEYS lists {AUDIT_EVENT_KEY_ID}, the id of the current key: "
        "give the new key a new AUDIT_EVENT_KEY_ID"
    )

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
    "django_htmx",
    "template_partials",
    "guardian",
    "pgtrigger",
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "csp",
    "approvals",
    "operations",
    "console",
]

MIDDLEWARE = [
    # Before all: the runner API's hot endpoints take API_MIDDLEWARE instead of the rest
    # of this list (console.middleware.ApiStackMiddleware; docs/benchmarks.md says why).
    "console.middleware.ApiStackMiddleware",
    # First: every answer gets its X-Request-Id, whichever layer below answers.
    "console.middleware.RequestIdMiddleware",
    # Then: it times everything below it (effectgate_http_request_duration_seconds).
    "console.middleware.RequestMetricsMiddleware",
    # Before anything reads the request (sessions look their cookie up in the database).
    "console.middleware.RefuseNulMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # After authentication, messages and htmx: it signs idle or old sessions out.
    "console.middleware.SessionTimeoutMiddleware",
    # After the session timeout and the CSRF check: counts a signed-in person's POSTs.
    "console.middleware.PersonThrottleMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: it answers locked-out sign-ins.
    "axes.middleware.AxesMiddleware",
]

# The middleware of the runner API's hot endpoints (register, claim, heartbeat, outcome
# and their batches: ``console.middleware.API_HOT_PATH``, POST only): what an answer to a
# runner token needs of the list above. No session, CSRF, person, OTP, message, htmx,
# static-file or CSP layer: these endpoints take a bearer token and answer JSON, never a
# page. Empty: they take MIDDLEWARE like every other request.
API_MIDDLEWARE = [
    "console.middleware.RequestIdMiddleware",
    "console.middleware.RequestMetricsMiddleware",
    "console.middleware.RefuseNulMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
if not _env_bool("API_LEAN_MIDDLEWARE", True):
    API_MIDDLEWARE = []
# The hot endpoints' POSTs through operations.http.hot's lean views; off: through their
# DRF views (the same answers; tests/operations/test_lean_views.py compares the two).
API_LEAN_VIEWS = _env_bool("API_LEAN_VIEWS", True)

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # First, so that our drf_spectacular templates replace the package's own.
        "DIRS": [PACKAGE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.search",
            ],
        },
    },
]


def _database(url: str | None) -> dj_database_url.DBConfig:
    if not url:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{VAR_DIR / 'effectgate.sqlite3'}"
    config = dj_database_url.parse(
        url,
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
    engine = config["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        # SQLite ignores SELECT ... FOR UPDATE, so every transaction takes the write lock
        # when it begins (IMMEDIATE) and waits for it instead of failing at once.
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        config["CONN_MAX_AGE"] = 0
        # A file, not shared-cache memory, so that concurrent test clients get real
        # SQLite locking (with the busy timeout) instead of "table is locked" errors;
        # one per process, so that two test runs on one checkout do not collide.
        config["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
    elif engine == "django.db.backends.postgresql":
        options = config.setdefault("OPTIONS", {})
        # Parameters bound by PostgreSQL, not spliced into the text by the client, and
        # a statement the connection has run ``DB_PREPARE_THRESHOLD`` times is prepared:
        # PostgreSQL stops parsing and planning the hot path's statements again.
        options["server_side_binding"] = True
        threshold = os.environ.get("DB_PREPARE_THRESHOLD", "2")
        options["prepare_threshold"] = None if threshold in ("", "off") else int(threshold)
        # A pool per process (psycopg_pool): connections are reused across requests and
        # threads without the health check's round trip on each request. 0 turns it
        # off (then DB_CONN_MAX_AGE applies, with health checks).
        pool_size = int(os.environ.get("DB_POOL_MAX_SIZE", "16"))
        if pool_size > 0:
            options["pool"] = {
                "min_size": 1,
                "max_size": pool_size,
                "timeout": float(os.environ.get("DB_POOL_TIMEOUT_S", "10")),
            }
            config["CONN_MAX_AGE"] = 0
            # Checked when taken from the pool (one round trip per request) only if asked:
            # without it, after a PostgreSQL restart each pooled connection fails one
            # request before the pool replaces it.
            config["CONN_HEALTH_CHECKS"] = os.environ.get("DB_POOL_CHECK", "") == "1"
        config["TEST"] = (
            {"NAME": os.environ.get("TEST_DATABASE_NAME")}
            if os.environ.get("TEST_DATABASE_NAME")
            else {}
        )
    else:
        raise ImproperlyConfigured(f"Effectgate runs on PostgreSQL or SQLite, not {engine}.")
    return config


# Two PostgreSQL roles in production (docs/deployment.md §1, docs/security.md §4):
# DATABASE_URL's user runs the application (the runtime role: it owns no table and may
# only read and insert the audit tables); DATABASE_OWNER_URL's owns the tables and runs
# what changes them (migrate, archive, audit mac --backfill, db roles --apply:
# operations/dbroles.py, as_owner). Without DATABASE_OWNER_URL, one login does both.
DATABASES = {"default": _database(os.environ.get("DATABASE_URL"))}


def _database_owner(url: str) -> dict[str, Any] | None:
    if not url:
        return None
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            "DATABASE_OWNER_URL needs DATABASE_URL on PostgreSQL (SQLite has no roles)"
        )
    config = dict(_database(url))
    if config["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_OWNER_URL must be a postgres:// URL")
    if config["NAME"] != DATABASES["default"]["NAME"]:
        raise ImproperlyConfigured(
            f"DATABASE_OWNER_URL names the database {config['NAME']!r}, DATABASE_URL "
            f"{DATABASES['default']['NAME']!r}: the owner's login must be to the same one"
        )
    # One connection for one command: no pool, closed at the end.
    options: Any = config.get("OPTIONS") or {}
    config["OPTIONS"] = {key: value for key, value in options.items() if key != "pool"}
    config["CONN_MAX_AGE"] = 0
    return config


DATABASE_OWNER = _database_owner(os.environ.get("DATABASE_OWNER_URL", "").strip())
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: refuses sign-ins of a locked-out username and address before any password check.
    "console.auth_backends.SignInThrottleBackend",
    # Django's password check, refusing non-superusers when PASSWORD_LOGIN=superusers.
    "console.auth_backends.PasswordBackend",
    # Single sign-on's code flow (console/sso.py); it answers nothing while OIDC_ISSUER is unset.
    "console.sso.OIDCBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # django-guardian: no anonymous user row, nobody anonymous decides.
GUARDIAN_RAISE_403 = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:inbox"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# console/static is found as the console app's static folder.
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = DEBUG

# Each process remembers authenticated runner tokens this many seconds (0: never), so a
# request costs no token lookup; a revocation still takes effect on every process's next
# request (operations/tokencache.py). PostgreSQL only: on SQLite every request looks up.
RUNNER_TOKEN_CACHE_S = float(os.environ.get("RUNNER_TOKEN_CACHE_S", "30"))

# Request bodies larger than this are refused with 413 before they are parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("MAX_REQUEST_BYTES", str(1024 * 1024)))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["operations.http.authentication.RunnerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["operations.http.authentication.IsRunner"],
    "DEFAULT_PARSER_CLASSES": ["operations.http.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "operations.http.problems.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DATETIME_FORMAT": "iso-8601",
    "COERCE_DECIMAL_TO_STRING": False,
    # The rate is THROTTLE_RUNNER_RATE, below; the count is kept in CACHES.
    "DEFAULT_THROTTLE_CLASSES": ["operations.http.throttling.RunnerRateThrottle"],
    # There is one API version. drf-spectacular writes a ?version= parameter into the
    # document's info.version and its Content-Disposition file name unless it is one of
    # these: any text was echoed into the document, and a newline answered 500.
    "ALLOWED_VERSIONS": ["1"],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Effectgate runner API",
    "DESCRIPTION": (
        "The contract agent runners program against: tool contracts, runs, operations, "
        "attempts, outcomes, reconciliation and compensation. Errors are RFC 9457 problem "
        "details with a stable `code`."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI is served from our own static files (drf-spectacular-sidecar): no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # operations.http.converters.CountConverter: the path integers (attempt numbers), at most
    # 2^53-1 like every integer of the API.
    "PATH_CONVERTER_OVERRIDES": {
        "count": {"type": "integer", "minimum": 0, "maximum": 2**53 - 1},
    },
}

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    # Each line names the request it was written in (``-`` outside one): the id the
    # answer's X-Request-Id header and problem body carry (operations/requestids.py).
    "filters": {"request_id": {"()": "operations.requestids.RequestIdFilter"}},
    "formatters": {
        "plain": {
            "format": "%(asctime)s %(levelname)s %(name)s request_id=%(request_id)s %(message)s"
        }
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"django.server": {"level": "WARNING"}},
}

# Background work (console/celery.py). Without a broker the same task functions run in
# the calling process (eagerly), and `manage.py runlocal` runs the beat schedule on a
# thread: no other server is needed locally.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
if CELERY_TASK_ALWAYS_EAGER:
    # In-process, the beat's every-second tasks would log each run: only what goes wrong.
    LOGGING["loggers"]["celery.app.trace"] = {"level": "WARNING"}
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "effectgate")
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# One beat at a time: it holds a PostgreSQL advisory lock while it runs (console/beat.py).
CELERY_BEAT_SCHEDULER = "console.beat:LeaderScheduler"
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "expire-leases": {"task": "operations.tasks.expire_leases", "schedule": 2.0},
    "expire-approvals": {"task": "operations.tasks.expire_approvals", "schedule": 5.0},
    "enforce-deadlines": {"task": "operations.tasks.enforce_deadlines", "schedule": 5.0},
    "run-probes": {"task": "operations.tasks.run_probes", "schedule": 5.0},
    "deliver-webhooks": {"task": "operations.tasks.deliver_webhooks", "schedule": 1.0},
    "apply-inbound": {"task": "operations.tasks.apply_inbound", "schedule": 10.0},
    "prune-deliveries": {"task": "operations.tasks.prune_deliveries", "schedule": 3600.0},
    "deliver-notices": {"task": "operations.tasks.deliver_notices", "schedule": 1.0},
    "remind-approvers": {"task": "operations.tasks.remind_approvers", "schedule": 30.0},
    "prune-notices": {"task": "operations.tasks.prune_notices", "schedule": 3600.0},
}
# The sealer (operations/services/seal.py) appends new events to the transparency log and
# signs a checkpoint this often; 0 leaves it to `manage.py audit seal` (cron, by hand).
AUDIT_SEAL_EVERY_S = float(os.environ.get("AUDIT_SEAL_EVERY_S", "10"))
if AUDIT_SEAL_EVERY_S < 0:
    raise ImproperlyConfigured(f"AUDIT_SEAL_EVERY_S: {AUDIT_SEAL_EVERY_S} is negative")
if AUDIT_SEAL_EVERY_S:
    CELERY_BEAT_SCHEDULE["seal-audit-log"] = {
        "task": "operations.tasks.seal_audit_log",
        "schedule": AUDIT_SEAL_EVERY_S,
    }
# Beat intervals are short and every task is idempotent: a late copy only finds nothing.
for _entry in CELERY_BEAT_SCHEDULE.values():
    _entry["options"] = {"expires": max(_entry["schedule"], 10.0)}

# The cache every process shares: request throttling counts in it (operations/http/
# throttling.py). Redis when one is configured: CACHE_URL, or else the Celery broker when
# it is Redis (its keys carry the prefix "effectgate"; nothing here empties the cache,
# which would empty the broker's queues too). Without Redis, a table in the database
# that migrate creates, and the throttle's counters in a table of their own (UNLOGGED on
# PostgreSQL, migration 0021): one more statement per throttled request, without WAL.
CACHE_URL = os.environ.get("CACHE_URL") or (
    CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else ""
)
CACHES: dict[str, dict[str, Any]] = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "KEY_PREFIX": "effectgate",
            # A Redis that does not answer costs a request half a second, then the request
            # goes on unthrottled (and logged): Redis must not take the API down.
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
        if CACHE_URL
        else {
            "BACKEND": "operations.http.throttling.DatabaseCache",
            "LOCATION": "effectgate_cache",
            # Culling deletes expired entries first; only beyond this many live ones does
            # it drop some (the throttle's counters are not entries: their own table).
            "OPTIONS": {"MAX_ENTRIES": 10000},
        }
    )
}

_RATE = re.compile(r"^[1-9][0-9]*/(s|sec|m|min|h|hour|d|day)$")


def _rate(name: str, default: str) -> str:
    """A throttle rate, ``<requests>/<s|min|hour|day>``; ``off`` (or empty) for none."""
    value = os.environ.get(name, default).strip()
    if value.lower() in ("", "off"):
        return ""
    if not _RATE.match(value):
        raise ImproperlyConfigured(f"{name}: {value!r} is not a rate such as 600/min, or off")
    return value


# Requests one runner token may send per period, whatever the endpoint, and POSTs one
# signed-in person may send to the console; beyond them, 429 with Retry-After. The
# defaults are far above what a runner or a person does (make chaos sends about 20,000 a
# minute with one token on two cores): they stop floods, not work.
THROTTLE_RUNNER_RATE = _rate("THROTTLE_RUNNER_RATE", "60000/min")
THROTTLE_SESSION_RATE = _rate("THROTTLE_SESSION_RATE", "600/min")

# Webhooks to runners (Standard Webhooks). Private, loopback and link-local targets are
# refused unless listed here (host names or CIDR ranges, comma-separated).
WEBHOOK_ALLOWED_HOSTS = _env_list("WEBHOOK_ALLOWED_HOSTS")

# One heartbeat event per this many heartbeats of an attempt (the first always): the
# lease lives on the attempt row, and a long call must not grow its history unbounded.
HEARTBEAT_EVENT_EVERY = max(1, int(os.environ.get("HEARTBEAT_EVENT_EVERY", "10")))

# GET /metrics (Prometheus): allowed with "Authorization: Bearer <METRICS_TOKEN>" or from
# an address in METRICS_ALLOWED_HOSTS (IP addresses and CIDR ranges, comma-separated;
# the address the process sees: behind a proxy, the proxy's). Neither set: nobody.
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
METRICS_ALLOWED_HOSTS = _env_list("METRICS_ALLOWED_HOSTS")


def _networks(name: str, entries: list[str]) -> list[Any]:
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{name}: {entry!r} is not an IP address or a CIDR range"
            ) from exc
    return networks


METRICS_ALLOWED_NETWORKS = _networks("METRICS_ALLOWED_HOSTS", METRICS_ALLOWED_HOSTS)
WEBHOOK_TIMEOUT_S = float(os.environ.get("WEBHOOK_TIMEOUT_S", "10"))
WEBHOOK_DELIVERY_LEASE_S = int(os.environ.get("WEBHOOK_DELIVERY_LEASE_S", "60"))
WEBHOOK_RETENTION_DAYS = int(os.environ.get("WEBHOOK_RETENTION_DAYS", "30"))
FIELD_ENCRYPTION_KEY = os.environ.get("FIELD_ENCRYPTION_KEY", "")

# Email to approvers. Locally mail is printed to the console.
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = _env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "effectgate@localhost")
# Well under a notice delivery's lease (60 s): a mail server that hangs never makes a
# second dispatcher send the same mail.
EMAIL_TIMEOUT = float(os.environ.get("EMAIL_TIMEOUT", "10"))
CONSOLE_BASE_URL = os.environ.get("CONSOLE_BASE_URL", "http://127.0.0.1:8000")

# Which new contract versions wait for a person although the strength proof would let
# them activate by themselves (operations/services/tools.py, _activation_holds): "none";
# "irreversible", the first version of a new irreversible tool and a version that makes
# a tool irreversible; "all", those and the first version of every new tool. So a new
# tool cannot arrive with approval mode "never" and run before anyone looked at it.
HOLD_NEW_TOOLS_MODES = ("none", "irreversible", "all")
HOLD_NEW_TOOLS = os.environ.get("HOLD_NEW_TOOLS", "none").strip().lower() or "none"
if HOLD_NEW_TOOLS not in HOLD_NEW_TOOLS_MODES:
    raise ImproperlyConfigured(
        f"HOLD_NEW_TOOLS: {HOLD_NEW_TOOLS!r} is not one of {', '.join(HOLD_NEW_TOOLS_MODES)}"
    )

# The time zone in which people's policies read the time of a registration
# (``context.time``: date, weekday, hour; docs/policies.md), an IANA name.
POLICY_TIME_ZONE = os.environ.get("POLICY_TIME_ZONE", "UTC").strip() or "UTC"
try:
    import zoneinfo

    zoneinfo.ZoneInfo(POLICY_TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError) as _exc:
    raise ImproperlyConfigured(f"POLICY_TIME_ZONE: {POLICY_TIME_ZONE!r} is no time zone") from _exc

# Reconciliation lookups go only to these hosts (names or CIDR ranges, comma-separated):
# they are usually on the runner's private network, so nothing is allowed by default.
RECONCILE_ALLOWED_HOSTS = _env_list("RECONCILE_ALLOWED_HOSTS")
RECONCILE_PROBE_TIMEOUT_S = float(os.environ.get("RECONCILE_PROBE_TIMEOUT_S", "5"))
# The first lookup of an unknown outcome waits this long (a request sent just before the
# lease ran out may still be on its way to the provider).
RECONCILE_FIRST_PROBE_DELAY_S = float(os.environ.get("RECONCILE_FIRST_PROBE_DELAY_S", "15"))
# Unknown outcomes older than this are highlighted in the reconciliation queue.
RECONCILE_AGE_WARNING_S = int(os.environ.get("RECONCILE_AGE_WARNING_S", "900"))

# OpenTelemetry traces (operations/telemetry.py): off unless an OTLP endpoint is set. The
# exporter reads the standard OTEL_EXPORTER_OTLP_* variables itself.
OTEL_EXPORTER_OTLP_ENDPOINT = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
OTEL_RECORD_ARGUMENTS = _env_bool("OTEL_RECORD_ARGUMENTS", False)

# ---------------------------------------------------------------------------------------
# Security and hardening (docs/security.md). Off DEBUG, cookies are Secure and HSTS is
# sent; `python manage.py check --deploy` passes with zero warnings once the production
# variables of docs/deployment.md are set.

# Console sessions: idle and absolute timeouts (console.middleware), cookies that scripts
# cannot read and that other sites' requests carry only on top-level navigation.
SESSION_IDLE_TIMEOUT_S = int(os.environ.get("SESSION_IDLE_TIMEOUT_S", str(30 * 60)))
SESSION_ABSOLUTE_TIMEOUT_S = int(os.environ.get("SESSION_ABSOLUTE_TIMEOUT_S", str(12 * 3600)))
SESSION_COOKIE_AGE = SESSION_ABSOLUTE_TIMEOUT_S
SESSION_COOKIE_SECURE = _env_bool("SESSION_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# The console sends the CSRF token from the page (hx-headers), never from the cookie.
CSRF_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"

# HTTPS. Behind a TLS-terminating proxy set BEHIND_TLS_PROXY=1 (it must overwrite
# X-Forwarded-Proto) and SECURE_SSL_REDIRECT=1 unless the proxy redirects itself.
if _env_bool("BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = _env_bool("SECURE_SSL_REDIRECT", False)
# Probes and scrapers speak plain HTTP to the process behind the proxy.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", "0" if DEBUG else "31536000"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = _env_bool("SECURE_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# The client address that sign-in throttling and the audit record: REMOTE_ADDR, or, with
# TRUSTED_PROXY_COUNT proxies in front, the address the outermost proxy saw.
TRUSTED_PROXY_COUNT = int(os.environ.get("TRUSTED_PROXY_COUNT", "0"))

# Content-Security-Policy (django-csp): no inline script, no eval, nothing from another
# origin, no framing. Every page of the console, the admin and the API docs keeps to it.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# Swagger UI would otherwise load a badge from the public validator.
SPECTACULAR_SETTINGS["SWAGGER_UI_SETTINGS"] = {"deepLinking": True, "validatorUrl": None}
# Answers from the layers in front of every view (token, scope, JSON parser), documented.
SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"] = [
    "drf_spectacular.hooks.postprocess_schema_enums",
    "operations.http.openapi.problem_responses",
    "operations.http.openapi.batches",
]

# Sign-in throttling (django-axes): after AXES_FAILURE_LIMIT failures for one username
# from one address, that pair is locked out for AXES_COOLOFF_MINUTES.
AXES_ENABLED = _env_bool("AXES_ENABLED", True)
# A refused single sign-on callback is a failed sign-in: its code and state stay out of
# the attempts axes records.
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "code", "state"]
AXES_FAILURE_LIMIT = int(os.environ.get("AXES_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("AXES_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_CLIENT_IP_CALLABLE = "console.security.client_ip"
AXES_VERBOSE = False
# django-axes logs every sign-in at INFO; failures are logged by console.signals instead.
LOGGING["loggers"]["axes"] = {"level": "WARNING"}

# Second factor (django-otp, TOTP). Optional for everyone; with this on, deciding on an
# irreversible tool's approvals needs a session verified with a one-time password.
REQUIRE_TOTP_FOR_IRREVERSIBLE = _env_bool("REQUIRE_TOTP_FOR_IRREVERSIBLE", False)
OTP_TOTP_ISSUER = os.environ.get("OTP_TOTP_ISSUER", "Effectgate")
# The admin's device pages show no key and no QR code of an enrolled device: whoever
# reads either can make that person's codes.
OTP_ADMIN_HIDE_SENSITIVE_DATA = True

# Append-only audit tables (operations/triggers.py): installed by pgtrigger after every
# migrate, without migration files. SQLite has no such triggers.
PGTRIGGER_MIGRATIONS = False
PGTRIGGER_INSTALL_ON_MIGRATE = True

# The transparency log (docs/security.md, Audit integrity): checkpoints signed with an
# Ed25519 private key in PEM (`openssl genpkey -algorithm ed25519 -out audit.pem`), read
# from this file or, for platforms that only pass environment variables, from the
# variable's text; never stored in the database. Without either, the sealer still
# appends events to the log but signs no checkpoint.
AUDIT_SIGNING_KEY_FILE = os.environ.get("AUDIT_SIGNING_KEY_FILE", "").strip()
AUDIT_SIGNING_KEY = os.environ.get("AUDIT_SIGNING_KEY", "").strip()
# Its public key in PEM (`openssl pkey -in audit.pem -pubout`), for processes that publish
# or check it without holding the private key; by default derived from the private key.
AUDIT_PUBLIC_KEY_FILE = os.environ.get("AUDIT_PUBLIC_KEY_FILE", "").strip()
# The log's name: the first line of every checkpoint and the signing key's name.
AUDIT_LOG_ORIGIN = os.environ.get("AUDIT_LOG_ORIGIN", "").strip() or (
    f"{(urlsplit(CONSOLE_BASE_URL).netloc.rpartition('@')[2]) or 'localhost'}/effectgate-audit"
)

# ---------------------------------------------------------------------------------------
# Single sign-on with OpenID Connect (console/sso.py, docs/deployment.md). Off unless
# OIDC_ISSUER is set. The provider's endpoints come from its discovery document
# (<issuer>/.well-known/openid-configuration), read by the server at first use.
# Exactly the provider's ``issuer``, a trailing "/" included where it has one (Auth0's):
# the ID tokens' ``iss`` must equal it.
OIDC_ISSUER = os.environ.get("OIDC_ISSUER", "").strip()


def _oidc_issuer_allowed(issuer: str) -> bool:
    parts = urlsplit(issuer)
    if parts.scheme == "https" and parts.hostname:
        return True
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


if OIDC_ISSUER and not _oidc_issuer_allowed(OIDC_ISSUER):
    raise ImproperlyConfigured(
        f"OIDC_ISSUER: {OIDC_ISSUER!r} must be an https address (or http on a loopback address)"
    )
OIDC_CLIENT_ID = os.environ.get("OIDC_CLIENT_ID", "")
OIDC_CLIENT_SECRET = os.environ.get("OIDC_CLIENT_SECRET", "")
# The name shown on the sign-in button ("Sign in with <name>").
OIDC_PROVIDER_NAME = os.environ.get("OIDC_PROVIDER_NAME", "").strip() or "single sign-on"
# The claim that lists a person's groups at the provider, and which of its values make a
# person a member of which Effectgate group: "provider value=Effectgate group" pairs,
# comma-separated (or a JSON object). Only the groups named here are ever changed.
OIDC_GROUPS_CLAIM = os.environ.get("OIDC_GROUPS_CLAIM", "groups").strip() or "groups"


def _group_map(text: str) -> dict[str, str]:
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        parsed = json.loads(text)
        pairs: list[Any] = list(parsed.items()) if isinstance(parsed, dict) else [parsed]
    else:
        pairs = [tuple(item.split("=", 1)) for item in text.split(",") if item.strip()]
    mapping = {}
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(part, str) and part.strip() for part in pair):
            raise ImproperlyConfigured(
                f"OIDC_GROUP_MAP: {pair!r} is not a pair such as finance-approvers=Finance"
            )
        mapping[pair[0].strip()] = pair[1].strip()
    return mapping


OIDC_GROUP_MAP = _group_map(os.environ.get("OIDC_GROUP_MAP", ""))
# Whether the first sign-in of someone unknown creates their person, and whether it may
# link an existing person whose email the provider says is verified. Both off: people
# are linked only by (issuer, sub), once an operator has allowed one of these.
OIDC_CREATE_USERS = _env_bool("OIDC_CREATE_USERS", False)
OIDC_LINK_BY_VERIFIED_EMAIL = _env_bool("OIDC_LINK_BY_VERIFIED_EMAIL", False)
# What the console asks the provider for; add the scope that releases the groups claim
# where the provider has one (for example "openid email profile groups").
# A sign-in whose ID token asserts one of these authentication methods (amr, RFC 8176:
# e.g. "mfa,otp,hwk") or context classes (acr) counts as verified with a second factor
# (REQUIRE_TOTP_FOR_IRREVERSIBLE) for that session; empty: never.
OIDC_SECOND_FACTOR_AMR = frozenset(
    v.strip() for v in os.environ.get("OIDC_SECOND_FACTOR_AMR", "").split(",") if v.strip()
)
OIDC_SECOND_FACTOR_ACR = frozenset(
    v.strip() for v in os.environ.get("OIDC_SECOND_FACTOR_ACR", "").split(",") if v.strip()
)
OIDC_SCOPES = os.environ.get("OIDC_SCOPES", "").strip() or "openid email profile"
OIDC_TIMEOUT_S = float(os.environ.get("OIDC_TIMEOUT_S", "10"))
OIDC_SIGN_ALGO = os.environ.get("OIDC_SIGN_ALGO", "RS256").strip() or "RS256"
if OIDC_SIGN_ALGO not in {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512"}:
    raise ImproperlyConfigured(
        f"OIDC_SIGN_ALGO: {OIDC_SIGN_ALGO!r} is not one of RS256, RS384, RS512, ES256, "
        "ES384, ES512 (the provider signs with its key; the client secret signs nothing)"
    )
# Password sign-in: "on" for everyone, "superusers" for superusers only (the others
# sign in through the provider; a superuser keeps a way in when the provider is down).
PASSWORD_LOGIN = os.environ.get("PASSWORD_LOGIN", "on").strip().lower() or "on"
if PASSWORD_LOGIN not in ("on", "superusers"):
    raise ImproperlyConfigured(f"PASSWORD_LOGIN: {PASSWORD_LOGIN!r} is not on or superusers")
if OIDC_ISSUER:
    # Signing out sends the browser on to the provider's end-session endpoint, a redirect
    # after a form's POST that form-action must allow.
    # The issuer's origin: a source with a path would match that path alone.
    _issuer = urlsplit(OIDC_ISSUER)
    CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"].append(
        f"{_issuer.scheme}://{_issuer.netloc}"
    )

# Notifications (operations/dispatch/notices.py, docs/notifications.md): mail, Slack and
# the people-facing webhook, sent from the notices the services write. A reminder goes
# to who may still decide a request this many seconds before it expires (0: none).
NOTIFY_REMINDER_BEFORE_S = int(os.environ.get("NOTIFY_REMINDER_BEFORE_S", "900"))
NOTICE_RETENTION_DAYS = int(os.environ.get("NOTICE_RETENTION_DAYS", "30"))
# The people-facing webhook: every notice, signed as Standard Webhooks with the secret
# (whsec_...), to an operator's URL (a relay to Teams or another chat); off when unset.
NOTIFY_WEBHOOK_URL = os.environ.get("NOTIFY_WEBHOOK_URL", "").strip()
NOTIFY_WEBHOOK_SECRET = os.environ.get("NOTIFY_WEBHOOK_SECRET", "").strip()
if NOTIFY_WEBHOOK_URL and urlsplit(NOTIFY_WEBHOOK_URL).scheme not in ("https", "http"):
    raise ImproperlyConfigured(f"NOTIFY_WEBHOOK_URL: {NOTIFY_WEBHOOK_URL!r} is not an http(s) URL")

# Slack approvals (console/slack.py, docs/deployment.md §4b). Off unless SLACK_BOT_TOKEN is
# set; interactions (POST /integrations/slack/interactions) need SLACK_SIGNING_SECRET.
SLACK_BOT_TOKEN = os.environ.get("SLACK_BOT_TOKEN", "").strip()
SLACK_SIGNING_SECRET = os.environ.get("SLACK_SIGNING_SECRET", "").strip()
SLACK_API_URL = os.environ.get("SLACK_API_URL", "").strip() or "https://slack.com/api/"
if not SLACK_API_URL.endswith("/"):
    SLACK_API_URL += "/"
if urlsplit(SLACK_API_URL).scheme not in ("https", "http"):
    raise ImproperlyConfigured(f"SLACK_API_URL: {SLACK_API_URL!r} is not an http(s) URL")
# The channel a tool's requests go to when neither the tool nor a deciding group has one.
SLACK_APPROVALS_CHANNEL = os.environ.get("SLACK_APPROVALS_CHANNEL", "").strip()
# The workspace (T...) whose interactions are taken, and whose full members alone may
# link their accounts: required with the signing secret (a channel shared with another
# organisation carries clicks of that organisation's people, signed alike).
SLACK_TEAM_ID = os.environ.get("SLACK_TEAM_ID", "").strip()
if SLACK_SIGNING_SECRET and not SLACK_TEAM_ID:
    raise ImproperlyConfigured(
        "SLACK_TEAM_ID: set it to your workspace's id (T...) with SLACK_SIGNING_SECRET"
    )
# Link a Slack person to the person here whose email Slack says is confirmed, when
# exactly one active person (not a superuser, not staff) has it.
SLACK_LINK_BY_VERIFIED_EMAIL = _env_bool("SLACK_LINK_BY_VERIFIED_EMAIL", False)
SLACK_TIMEOUT_S = float(os.environ.get("SLACK_TIMEOUT_S", "2"))
