"""Django itself: apps, middleware, templates, auth, i18n, static files, the REST
framework and logging.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from atlas import conf as atlas_conf
from atlas.settings.env import BASE_DIR

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "guardian",
    "drf_spectacular",
    # Swagger UI's files, served by WhiteNoise from our own origin (no CDN, no @latest).
    "drf_spectacular_sidecar",
    "atlas",
    "entities",
    "changesets",
    "branches",
]

MIDDLEWARE = [
    # First: every response, redirects and refusals included, echoes X-Request-ID.
    "atlas.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # gzip for clients that accept it (feed pages, lists, history compress ~5-10x),
    # keeping entity ETags strong, which Django's own GZipMiddleware would weaken.
    "atlas.middleware.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Picks a replica for the read endpoints (atlas/settings/database.py); after
    # authentication, so users and sessions are read from the primary. It does
    # nothing while no replica is configured.
    "atlas.replicas.ReplicaReadMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "atlas.middleware.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "atlas.urls"
WSGI_APPLICATION = "atlas.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user object; anonymous gets 401

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("ATLAS_STATIC_ROOT", BASE_DIR / ".atlas" / "static"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on a missing folder
# Not the Manifest variant: tests run with DEBUG off and no collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    # Archive segments and checkpoints (docs/retention.md): a local folder by default;
    # S3-compatible storage through django-storages is a STORAGES entry like any other.
    "atlas_archive": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": os.environ.get("ATLAS_ARCHIVE_DIR", str(BASE_DIR / ".atlas" / "archive"))
        },
    },
}

# --- REST framework -------------------------------------------------------------
# Atlas's views need these DRF and drf-spectacular settings; atlas.conf holds them so
# that a host project merges the same dicts (docs/embedding.md).
REST_FRAMEWORK: dict[str, Any] = dict(atlas_conf.REST_FRAMEWORK)
SPECTACULAR_SETTINGS: dict[str, Any] = dict(atlas_conf.SPECTACULAR_SETTINGS)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "pgserver": {"level": "WARNING"},
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
