from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        # Imported for their side effects once the app registry is ready (models
        # load): reconciliation registers the payment checks, tasks connects
        # the publishers of recorded webhook events (webhooks.events_recorded) and
        # of put-off deliveries whose turn came (webhooks.turn_came).
        from . import reconciliation, tasks  # noqa: F401
