from django.urls import path

from changesets.api import actions, views

urlpatterns = [
    path("changesets", views.ChangesetListView.as_view(), name="changeset-list"),
    path("log/head", views.LogHeadView.as_view(), name="log-head"),
    # Before <changeset_id>, so "import" is never taken for an id.
    path("changesets/import", actions.ImportView.as_view(), name="changeset-import"),
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
    path(
        "changesets/<str:changeset_id>/revert",
        actions.RevertView.as_view(),
        name="changeset-revert",
    ),
    path(
        "changesets/<str:changeset_id>/export",
        actions.ExportView.as_view(),
        name="changeset-export",
    ),
]
