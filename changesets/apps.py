from django.apps import AppConfig


class ChangesetsConfig(AppConfig):
    name = "changesets"
    verbose_name = "Changesets"

    def ready(self) -> None:
        # Each Celery worker runs the journal relay (one at a time is active).
        # Imported here, not at the top: the relay imports the journal's tasks and
        # models, which Django's app registry must have loaded first.
        from celery.signals import worker_ready, worker_shutdown
        from django.db.models.signals import post_migrate

        from changesets.outbox import relay

        worker_ready.connect(relay.on_worker_ready, weak=False, dispatch_uid="atlas-relay")
        worker_shutdown.connect(relay.on_worker_shutdown, weak=False, dispatch_uid="atlas-relay")
        # Upkeep of the revision table's partitions after every migrate (changesets.partitions).
        post_migrate.connect(_partition_upkeep, sender=self, dispatch_uid="atlas-partitions")


def _partition_upkeep(sender: AppConfig, **kwargs: object) -> None:
    """``post_migrate``: partitions ahead of the log head (a no-op before migration 0025)."""
    from changesets import partitions

    if kwargs.get("using", "default") == "default" and kwargs.get("plan") is not None:
        partitions.ensure_ahead()
