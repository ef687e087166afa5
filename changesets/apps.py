from django.apps import AppConfig


class ChangesetsConfig(AppConfig):
    name = "changesets"
    verbose_name = "Changesets"
