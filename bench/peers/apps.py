from django.apps import AppConfig


class PeersConfig(AppConfig):
    name = "bench.peers"
    label = "bench_peers"
    default_auto_field = "django.db.models.BigAutoField"
