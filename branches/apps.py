from django.apps import AppConfig


class BranchesConfig(AppConfig):
    name = "branches"
    verbose_name = "Branches"

    def ready(self) -> None:
        # An erasure writes on each open branch whose overlay holds a target;
        # changesets never imports branches, so branches tells it where they are.
        # Imported here: the store imports models, which the registry loads first.
        from branches.store import overlay_stores_holding
        from changesets.services.erase import register_overlay_finder

        register_overlay_finder(overlay_stores_holding)
