"""Atlas's own settings (all named ``ATLAS_*``), each with a safe default, read in one place.

Atlas runs as its own project (``atlas/settings/`` fills these from the
environment) or inside a host project, whose settings module knows nothing of
them. So no code reads an ``ATLAS_*`` attribute of ``django.conf.settings``
directly: it calls :func:`get`, which takes the host's value when it sets one
and the default here otherwise. Read at call time, never cached at import, so
``override_settings`` and pytest-django's ``settings`` fixture keep working.
The defaults are the production stance: nothing here opens a door a host did
not choose to open (``docs/embedding.md`` lists them).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)

DEFAULTS: dict[str, Any] = {
    # Input limits (API.md).
    "ATLAS_MAX_CONTENT_BYTES": 1024 * 1024,
    "ATLAS_MAX_BATCH_OPS": 10_000,
    "ATLAS_MAX_BODY_BYTES": 64 * 1024 * 1024,
    # Authorship and request handling.
    "ATLAS_DEV_AUTHOR_HEADER": False,
    "ATLAS_IDEMPOTENCY_TTL_HOURS": 24,
    "ATLAS_TRUSTED_PROXIES": [],
    "ATLAS_CONTENT_SECURITY_POLICY": CONTENT_SECURITY_POLICY,
    "ATLAS_METRICS_TOKEN": "",
    # Webhooks to private addresses stay refused unless a host allows them.
    "ATLAS_ALLOW_PRIVATE_WEBHOOKS": False,
    # The journal relay and the change feed's push side (docs/feed.md).
    "ATLAS_JOURNAL_RELAY_IN_WORKER": True,
    "ATLAS_JOURNAL_RELAY_POLL_SECONDS": 5.0,
    "ATLAS_JOURNAL_RELAY_LINGER_MS": 10.0,
    "ATLAS_JOURNAL_RELAY_STREAM_LINGER_MS": 50.0,
    "ATLAS_JOURNAL_SWEEP_AGE_SECONDS": 60.0,
    "ATLAS_JOURNAL_MAX_LAG_SECONDS": 60.0,
    "ATLAS_WEBHOOK_TIMEOUT_SECONDS": 10.0,
    "ATLAS_WEBHOOK_PAGE_SIZE": 100,
    "ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS": 2.0,
    "ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS": 600.0,
    "ATLAS_WEBHOOK_MAX_PAGES_PER_RUN": 50,
    "ATLAS_WEBHOOK_COALESCE_MS": 100.0,
    "ATLAS_WEBHOOK_MAX_SECONDS_PER_RUN": 60.0,
    "ATLAS_WEBHOOK_MAX_BODY_BYTES": 1024 * 1024,
    "ATLAS_WEBHOOK_MAX_ATTEMPTS": 20,
    "ATLAS_WEBHOOK_SECRET_OVERLAP_SECONDS": 86400.0,
    # Connection pooling (docs/deploy.md "Pooled"): "" (direct), "session" or "transaction".
    "ATLAS_DB_POOLING": "",
    "ATLAS_DIRECT_DATABASE_URL": "",
    "ATLAS_IDEMPOTENCY_LEASE_SECONDS": 60.0,
    # Archive and retention (docs/retention.md). No signing key: archive_log refuses.
    "ATLAS_ARCHIVE_SIGNING_KEY": "",
    # Where a 410 says the archive is ("" = derived from STORAGES["atlas_archive"]).
    "ATLAS_ARCHIVE_LOCATION": "",
    # The folder used when a host project has no STORAGES["atlas_archive"].
    "ATLAS_ARCHIVE_DIR": "atlas-archive",
    "ATLAS_ARCHIVE_SEGMENT_REVISIONS": 100_000,
    "ATLAS_ARCHIVE_DELETE_BATCH": 2_000,
    "ATLAS_ARCHIVE_GRACE_SECONDS": 10.0,
    "ATLAS_ARCHIVE_CUT_CACHE_SECONDS": 2.0,
    # The revision table's partitions (changesets.partitions, docs/retention.md).
    "ATLAS_LOG_PARTITION_SEQS": 1_000_000,
    "ATLAS_LOG_PARTITIONS_AHEAD": 2,
    # 0: no global retention (history stays hot unless a cut is made by hand).
    "ATLAS_RETENTION_DAYS": 0,
    # Timestamps through psycopg's C loader where its values are Django's (atlas.timestamps).
    "ATLAS_FAST_TIMESTAMPS": True,
}


def get(name: str) -> Any:
    """The value of the Atlas setting ``name``: the project's, else its default.

    An unknown name is a ``KeyError``: a typo fails loudly instead of reading a default.
    """
    default = DEFAULTS[name]
    return getattr(settings, name, default)


# What Atlas's API views expect of DRF (problem+json errors, hashed API tokens, the
# JSON parser with its body limit, RFC 3339 times with milliseconds) and of
# drf-spectacular (its schema and hooks). Atlas's own settings use these dicts; a host
# project merges them into its own: ``REST_FRAMEWORK = {**atlas.conf.REST_FRAMEWORK, ...}``.
REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Hashed API tokens (atlas.models.ApiToken), in place of DRF's authtoken.
        "atlas.api.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "atlas.api.auth.DevAuthorHeaderAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["atlas.api.LimitedJSONParser"],
    # DRF's JSON renderer, encoding with orjson (atlas/api/renderers.py).
    "DEFAULT_RENDERER_CLASSES": ["atlas.api.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "atlas.api.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DATETIME_FORMAT": "%Y-%m-%dT%H:%M:%S.%fZ",
}

SPECTACULAR_SETTINGS: dict[str, Any] = {
    "TITLE": "Atlas API",
    "DESCRIPTION": "Every write to a store of JSON entities as an attributable, "
    "reviewable, revertible changeset.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from drf-spectacular-sidecar (pinned in requirements.txt), not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # PATCH bodies are described as they are validated (required fields stay required).
    "COMPONENT_SPLIT_PATCH": False,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "atlas.api.errors.problem_schema_hook",
        "atlas.api.errors.input_rules_schema_hook",
    ],
    "ENUM_NAME_OVERRIDES": {
        "RevisionOpEnum": ["create", "update", "delete"],
        "BatchOpKindEnum": ["put", "patch", "delete"],
        # The ops revert, import and restore report (batch ops without patch).
        "PlannedOpKindEnum": ["put", "delete"],
        "WriteStatusEnum": ["created", "updated", "deleted", "unchanged"],
        "RoleEnum": ["reader", "writer", "maintainer"],
    },
}
