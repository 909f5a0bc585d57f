from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        # Imported for their side effects once the app registry is ready (models
        # load): reconciliation registers the payment checks, tasks connects
        # the publisher of recorded webhook events (webhooks.events_recorded).
        from . import reconciliation, tasks  # noqa: F401
