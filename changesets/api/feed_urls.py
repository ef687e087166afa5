"""Routes for the change feed and subscriptions (included under /api/v1)."""

from django.urls import path

from changesets.api import feed

urlpatterns = [
    path("changes", feed.ChangeFeedView.as_view(), name="changes"),
    path("subscriptions", feed.SubscriptionListView.as_view(), name="subscription-list"),
    path(
        "subscriptions/<str:subscription_id>",
        feed.SubscriptionDetailView.as_view(),
        name="subscription-detail",
    ),
]
