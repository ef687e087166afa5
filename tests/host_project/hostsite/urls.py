from django.contrib import admin
from django.urls import include, path
from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("shop/orders/", views.place_order, name="place-order"),
    # Atlas's API under a prefix of the host's choosing.
    path("records/", include("atlas.api_urls")),
]
