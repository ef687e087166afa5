from django.db import models


class Order(models.Model):
    """The host's own row, written in the same transaction as Atlas's changeset."""

    number = models.CharField(max_length=40, unique=True)
    total = models.IntegerField()
    changeset_id = models.UUIDField()

    def __str__(self) -> str:
        return self.number
