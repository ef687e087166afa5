"""Atlas's URLs plus the plain, untracked update endpoint the HTTP benchmark compares with."""

from django.urls import path

from atlas.urls import handler400, handler403, handler404, handler500  # noqa: F401
from atlas.urls import urlpatterns as atlas_urlpatterns
from bench.plain.views import PlainItemUpdateView

urlpatterns = [
    path("bench/plain/<str:namespace>/<str:slug>", PlainItemUpdateView.as_view()),
    *atlas_urlpatterns,
]
