"""A plain, untracked DRF update endpoint: the HTTP baseline next to Atlas's PUT.

Same server, same authentication (DRF token, ``IsAuthenticated``), same JSON
parser and renderer as Atlas's API; no history, no authorization by namespace.
"""

from __future__ import annotations

from rest_framework import generics, serializers

from bench.plain.models import PlainItem


class PlainItemSerializer(serializers.ModelSerializer):
    class Meta:
        model = PlainItem
        fields = ["namespace", "slug", "content"]
        read_only_fields = ["namespace", "slug"]


class PlainItemUpdateView(generics.UpdateAPIView):
    """``PUT /bench/plain/<namespace>/<slug>`` with ``{"content": {...}}``: get() + save()."""

    serializer_class = PlainItemSerializer
    queryset = PlainItem.objects.all()

    def get_object(self) -> PlainItem:
        return generics.get_object_or_404(
            self.get_queryset(), namespace=self.kwargs["namespace"], slug=self.kwargs["slug"]
        )
