from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        from django.contrib import admin

        from scheduler_project.admin_actions import guard_every_admin

        # Imported for their side effects once the app registry is ready (models
        # load): reconciliation registers the payment checks, tasks connects
        # the publishers of recorded webhook events (webhooks.events_recorded) and
        # of put-off deliveries whose turn came (webhooks.turn_came).
        from . import reconciliation, tasks  # noqa: F401

        # Every admin list, third parties' included, gets the guards of ours
        # (a bad selection or drill-down year answers with a message, not a
        # 500; the unfiltered list of a big table is not counted row by row).
        # The admin's autodiscovery (AdminConfig.ready) has run: it is first
        # in INSTALLED_APPS.
        guard_every_admin(admin.site)
