"""A minimal host project's settings: its own apps plus Atlas's, nothing of Atlas's settings.py.

The database comes from ``HOST_DB_*`` (the test that runs this project creates one).
No ``ATLAS_*`` setting is named: Atlas's defaults apply (atlas.conf).
"""

import os

import atlas.conf

SECRET_KEY = "host-project-test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]

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
    # Atlas's four apps.
    "atlas",
    "entities",
    "changesets",
    "branches",
    # The host's own.
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "hostsite.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["HOST_DB_NAME"],
        "HOST": os.environ.get("HOST_DB_HOST", ""),
        "PORT": os.environ.get("HOST_DB_PORT", ""),
        "USER": os.environ.get("HOST_DB_USER", ""),
        "PASSWORD": os.environ.get("HOST_DB_PASSWORD", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Atlas's namespace roles are django-guardian object permissions.
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None

# Atlas's API views need its DRF settings; a host adds its own on top.
REST_FRAMEWORK = {**atlas.conf.REST_FRAMEWORK}
SPECTACULAR_SETTINGS = {**atlas.conf.SPECTACULAR_SETTINGS, "TITLE": "Shop (with Atlas)"}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
