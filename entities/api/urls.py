from django.urls import path

from entities.api import namespaces, views

urlpatterns = [
    path("entities", views.EntityListView.as_view(), name="entity-list"),
    path(
        "entities/<str:namespace>/<str:kind>/<str:slug>",
        views.EntityDetailView.as_view(),
        name="entity-detail",
    ),
    path(
        "entities/<str:namespace>/<str:kind>/<str:slug>/history",
        views.EntityHistoryView.as_view(),
        name="entity-history",
    ),
    path("batch", views.BatchView.as_view(), name="batch"),
    path("delete-by-query", views.DeleteByQueryView.as_view(), name="delete-by-query"),
    path("namespaces", namespaces.NamespaceListView.as_view(), name="namespace-list"),
    path(
        "namespaces/<str:name>", namespaces.NamespaceDetailView.as_view(), name="namespace-detail"
    ),
    path(
        "namespaces/<str:name>/grants/<str:principal_type>/<str:principal>",
        namespaces.GrantView.as_view(),
        name="namespace-grant",
    ),
]
