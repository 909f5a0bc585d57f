from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from payments import views_ops

admin.site.site_header = "Payment scheduler back office"
admin.site.site_title = "Payment scheduler"
# No app sidebar beside every page: the lists need the width (the payments
# list shows its columns beside the filters at 1,400 px); the index and the
# breadcrumbs lead everywhere the sidebar did.
admin.site.enable_nav_sidebar = False

urlpatterns = [
    # A landing page linking the API docs, the back office and health; every
    # other unknown path is a 404 (JSON under /api/, payments.api.errors.json_404).
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("admin/operations/", views_ops.operations, name="operations"),
    path("admin/", admin.site.urls),
    path("healthz", views_ops.healthz, name="healthz"),
    path("readyz", views_ops.readyz, name="readyz"),
    path("metrics", views_ops.metrics, name="metrics"),
    path("api/v1/", include("payments.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

handler400 = "payments.api.errors.json_400"
handler403 = "payments.api.errors.json_403"
handler404 = "payments.api.errors.json_404"
handler500 = "payments.api.errors.json_500"
