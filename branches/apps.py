from django.apps import AppConfig


class BranchesConfig(AppConfig):
    name = "branches"
    verbose_name = "Branches"
