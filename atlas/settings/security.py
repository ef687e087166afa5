"""Security: the secret key, hosts, HTTPS and proxies, CSP, the metrics token,
and the switches that are safe only in development (docs/deploy.md, docs/security.md).
"""

from __future__ import annotations

import ipaddress
import os

from django.core.exceptions import ImproperlyConfigured

from atlas import conf as atlas_conf
from atlas.settings.env import DEBUG, env_bool, env_int

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "atlas-development-only-secret-key-do-not-use-in-production"

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
if not ALLOWED_HOSTS and DEBUG:
    ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", "testserver"]

# --- HTTPS (docs/deploy.md) ----------------------------------------------------------
# ATLAS_HTTPS=1 is the production stance `manage.py check --deploy` asks for: plain
# HTTP redirects to HTTPS, HSTS, cookies only over HTTPS. The probes and the scrape
# stay reachable over plain HTTP from inside the network (compose's healthcheck hits
# http://127.0.0.1:8000/healthz): these paths are never redirected.
ATLAS_HTTPS = env_bool("ATLAS_HTTPS", default=False)
ATLAS_HTTPS_EXEMPT_PATHS = [r"^healthz$", r"^readyz$", r"^metrics$"]
if ATLAS_HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = ATLAS_HTTPS_EXEMPT_PATHS
    SECURE_HSTS_SECONDS = env_int("ATLAS_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("ATLAS_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env_bool("ATLAS_HSTS_PRELOAD", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True


def proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """``"X-Forwarded-Proto: https"`` → Django's ``("HTTP_X_FORWARDED_PROTO", "https")``."""
    if not value.strip():
        return None
    name, sep, expected = value.partition(":")
    name, expected = name.strip(), expected.strip()
    if not sep or not name or not expected or " " in name:
        raise ImproperlyConfigured(
            "ATLAS_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https'"
        )
    return "HTTP_" + name.upper().replace("-", "_"), expected


# Behind a proxy that terminates TLS: the header (and value) by which it says the
# client's request was HTTPS. Only set it when that proxy overwrites the header on
# every request; otherwise a client could claim HTTPS.
_proxy_ssl_header = proxy_ssl_header(os.environ.get("ATLAS_PROXY_SSL_HEADER", ""))
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = _proxy_ssl_header

# Development only: X-Atlas-Author names the principal when nobody authenticated
# (atlas.api.auth); anyone could claim any name.
ATLAS_DEV_AUTHOR_HEADER = env_bool("ATLAS_DEV_AUTHOR_HEADER", default=False)
# Webhooks to private, loopback and link-local addresses (docs/security.md): refused
# unless this is on, which it is by default only with DEBUG.
ATLAS_ALLOW_PRIVATE_WEBHOOKS = env_bool("ATLAS_ALLOW_PRIVATE_WEBHOOKS", default=DEBUG)
# /metrics answers superusers and a scraper sending "Authorization: Bearer <this>";
# empty = no bearer token accepted (docs/feed.md, "Metrics").
ATLAS_METRICS_TOKEN = os.environ.get("ATLAS_METRICS_TOKEN", "")

# Proxies (IPs or CIDRs) whose X-Forwarded-For is believed: a changeset's context.ip is
# then its right-most address that is not one of them (atlas.api.provenance). Empty:
# the peer is the client. Checked here so a typo fails at start-up, not on a write.
ATLAS_TRUSTED_PROXIES = [
    p.strip() for p in os.environ.get("ATLAS_TRUSTED_PROXIES", "").split(",") if p.strip()
]
for _proxy in ATLAS_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"ATLAS_TRUSTED_PROXIES: {_proxy!r} is no IP or CIDR") from _exc

# Sent on every HTML response: the admin and /api/docs/ (atlas.middleware). Scripts,
# styles, images and fonts from our own origin only; no plugins, no framing. Inline
# styles stay allowed: the admin's change list and Swagger UI's page carry a <style>
# block and Swagger UI sets style attributes; inline scripts do not run.
ATLAS_CONTENT_SECURITY_POLICY = os.environ.get(
    "ATLAS_CONTENT_SECURITY_POLICY", atlas_conf.CONTENT_SECURITY_POLICY
)
