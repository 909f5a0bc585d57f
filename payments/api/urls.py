from django.urls import path

from . import recurring, views

urlpatterns = [
    path("payments/schedule", views.PaymentScheduleView.as_view(), name="payment-schedule"),
    path("payments", views.PaymentCollectionView.as_view(), name="payment-list"),
    path("payments/<str:payment_id>", views.PaymentDetailView.as_view(), name="payment-detail"),
    path(
        "payments/<str:payment_id>/cancel",
        views.PaymentCancelView.as_view(),
        name="payment-cancel",
    ),
    path(
        "payments/<str:payment_id>/events",
        views.PaymentEventsView.as_view(),
        name="payment-events",
    ),
    path(
        "payments/<str:payment_id>/attempts",
        views.PaymentAttemptsView.as_view(),
        name="payment-attempts",
    ),
    path(
        "internal/payments/<str:payment_id>/execute",
        views.InternalExecuteView.as_view(),
        name="internal-payment-execute",
    ),
    path("recurring-payments", recurring.RecurringCollectionView.as_view(), name="recurring-list"),
    path(
        "recurring-payments/<str:recurring_id>",
        recurring.RecurringDetailView.as_view(),
        name="recurring-detail",
    ),
    path(
        "recurring-payments/<str:recurring_id>/pause",
        recurring.RecurringPauseView.as_view(),
        name="recurring-pause",
    ),
    path(
        "recurring-payments/<str:recurring_id>/resume",
        recurring.RecurringResumeView.as_view(),
        name="recurring-resume",
    ),
    path(
        "recurring-payments/<str:recurring_id>/cancel",
        recurring.RecurringCancelView.as_view(),
        name="recurring-cancel",
    ),
    path(
        "recurring-payments/<str:recurring_id>/occurrences",
        recurring.RecurringOccurrencesView.as_view(),
        name="recurring-occurrences",
    ),
    path(
        "webhook-endpoints",
        recurring.WebhookEndpointCollectionView.as_view(),
        name="webhook-endpoint-list",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>",
        recurring.WebhookEndpointDetailView.as_view(),
        name="webhook-endpoint-detail",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/deliveries",
        recurring.WebhookDeliveriesView.as_view(),
        name="webhook-endpoint-deliveries",
    ),
    path("accounts", views.AccountListView.as_view(), name="account-list"),
    path("accounts/<int:account_id>", views.AccountDetailView.as_view(), name="account-detail"),
    path(
        "accounts/<int:account_id>/transactions",
        views.AccountTransactionsView.as_view(),
        name="account-transactions",
    ),
]
