#!/usr/bin/env python
"""The host project's manage.py: a Django project of its own that installs Atlas as a package."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
