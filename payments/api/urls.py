from django.urls import path

from . import views

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
    path("accounts", views.AccountListView.as_view(), name="account-list"),
    path("accounts/<int:account_id>", views.AccountDetailView.as_view(), name="account-detail"),
    path(
        "accounts/<int:account_id>/transactions",
        views.AccountTransactionsView.as_view(),
        name="account-transactions",
    ),
]
