"""Routes for the change feed and subscriptions (included under /api/v1)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from changesets.api import feed

router = SimpleRouter(trailing_slash=False, use_regex_path=False)
router.register("subscriptions", feed.SubscriptionViewSet, basename="subscription")

urlpatterns = [
    # The feed is one list, and keeps its route name ("changes", not "changes-list").
    path("changes", feed.ChangeFeedViewSet.as_view({"get": "list"}), name="changes"),
    *router.urls,
]
