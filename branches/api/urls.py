"""Routes of the branches API (included under /api/v1)."""

from rest_framework.routers import SimpleRouter

from branches.api import views

router = SimpleRouter(trailing_slash=False, use_regex_path=False)
router.register("branches", views.BranchViewSet, basename="branch")

urlpatterns = router.urls
