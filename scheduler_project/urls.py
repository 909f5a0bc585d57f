from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from payments import views_ops

urlpatterns = [
    path("admin/operations/", views_ops.operations, name="operations"),
    path("admin/", admin.site.urls),
    path("healthz", views_ops.healthz, name="healthz"),
    path("readyz", views_ops.readyz, name="readyz"),
    path("metrics", views_ops.metrics, name="metrics"),
    path("api/v1/", include("payments.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

handler404 = "payments.api.errors.json_404"
handler500 = "payments.api.errors.json_500"
