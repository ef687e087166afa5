"""Every ``ATLAS_*`` setting the apps read has a default in ``atlas.conf``, so a host
project whose settings name none of them still gets a working, safe Atlas."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import override_settings

from atlas import conf

ROOT = Path(__file__).resolve().parents[2]
APPS = ("atlas", "entities", "changesets", "branches")


def _app_sources() -> list[Path]:
    return [
        path
        for app in APPS
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts and path.name != "settings.py"
    ]


def test_no_app_code_reads_an_atlas_setting_from_django_settings_directly():
    direct = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _app_sources()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bsettings\.ATLAS_", line)
    ]
    assert direct == [], "read these through atlas.conf.get(), which has the defaults"


def test_every_setting_the_apps_read_has_a_default():
    read = {
        name
        for path in _app_sources()
        for name in re.findall(r"conf\.get\(\s*[\"'](ATLAS_[A-Z_]+)[\"']", path.read_text())
    }
    assert read, "the scan found no reads: the pattern no longer matches the code"
    assert read <= set(conf.DEFAULTS), sorted(read - set(conf.DEFAULTS))


def test_a_project_without_the_setting_gets_the_default(settings):
    del settings.ATLAS_MAX_BATCH_OPS
    del settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS
    assert conf.get("ATLAS_MAX_BATCH_OPS") == 10_000
    assert conf.get("ATLAS_ALLOW_PRIVATE_WEBHOOKS") is False


def test_a_project_setting_wins_and_is_read_at_call_time():
    with override_settings(ATLAS_MAX_BATCH_OPS=3):
        assert conf.get("ATLAS_MAX_BATCH_OPS") == 3


def test_an_unknown_name_fails_loudly():
    with pytest.raises(KeyError):
        conf.get("ATLAS_NO_SUCH_SETTING")
