"""Routes of the changeset log (included under /api/v1).

A router, so each action is reached the same way: ``/changesets/import`` is
an action of the list (``detail=False``), routed before ``/changesets/{id}``,
so "import" is never taken for an id.
"""

from rest_framework.routers import SimpleRouter

from changesets.api import erase, history, log, views

router = SimpleRouter(trailing_slash=False, use_regex_path=False)
router.register("changesets", views.ChangesetViewSet, basename="changeset")
router.register("log", log.LogViewSet, basename="log")
router.register("revisions", history.RevisionViewSet, basename="revision")
router.register("diff", history.DiffViewSet, basename="diff")
router.register("erase", erase.EraseViewSet, basename="erase")
router.register("erasures", erase.ErasuresViewSet, basename="erasures")

urlpatterns = router.urls
