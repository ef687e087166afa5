from django.apps import AppConfig
from django.db.backends.signals import connection_created


class AtlasConfig(AppConfig):
    name = "atlas"
    verbose_name = "Atlas"

    def ready(self) -> None:
        from atlas.timestamps import use_fast_timestamps

        connection_created.connect(use_fast_timestamps, dispatch_uid="atlas.fast_timestamps")
