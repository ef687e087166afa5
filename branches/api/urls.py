from django.urls import path

from branches.api import views

urlpatterns = [
    path("branches", views.BranchListView.as_view(), name="branch-list"),
    path("branches/<str:name>", views.BranchDetailView.as_view(), name="branch-detail"),
    path("branches/<str:name>/diff", views.BranchDiffView.as_view(), name="branch-diff"),
    path("branches/<str:name>/merge", views.BranchMergeView.as_view(), name="branch-merge"),
    path(
        "branches/<str:name>/members/user/<str:username>",
        views.BranchMemberView.as_view(),
        name="branch-member",
    ),
]
