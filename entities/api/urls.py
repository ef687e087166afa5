"""Entity and namespace routes (included under /api/v1)."""

from atlas.api.routers import Router
from entities.api import bulk, namespaces, restore, views

router = Router()
router.register("entities", views.EntityViewSet, basename="entity")
router.register("batch", bulk.BatchViewSet, basename="batch")
router.register("delete-by-query", bulk.DeleteByQueryViewSet, basename="delete-by-query")
router.register("restore", restore.RestoreViewSet, basename="restore")
router.register("namespaces", namespaces.NamespaceViewSet, basename="namespace")

urlpatterns = router.urls
