from django.apps import AppConfig


class PlainConfig(AppConfig):
    name = "bench.plain"
    label = "bench_plain"
    default_auto_field = "django.db.models.BigAutoField"
