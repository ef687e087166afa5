from django.urls import path

from changesets.api import views

urlpatterns = [
    path("changesets", views.ChangesetListView.as_view(), name="changeset-list"),
    path(
        "changesets/<str:changeset_id>",
        views.ChangesetDetailView.as_view(),
        name="changeset-detail",
    ),
    path(
        "changesets/<str:changeset_id>/revisions",
        views.ChangesetRevisionsView.as_view(),
        name="changeset-revisions",
    ),
]
