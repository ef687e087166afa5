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
    path(
        "subscriptions/<str:subscription_id>/rotate-secret",
        feed.SubscriptionRotateSecretView.as_view(),
        name="subscription-rotate-secret",
    ),
    path(
        "subscriptions/<str:subscription_id>/retry",
        feed.SubscriptionRetryView.as_view(),
        name="subscription-retry",
    ),
    path(
        "subscriptions/<str:subscription_id>/skip",
        feed.SubscriptionSkipView.as_view(),
        name="subscription-skip",
    ),
]
