"""Django project of the delayed payment scheduler.

Importing the Celery app here makes ``shared_task`` bind to it in every process
(Django's documented Celery integration).
"""

from .metrics_files import use_host_scoped_files

use_host_scoped_files()  # before any metric is created

from .celery import app as celery_app  # noqa: E402 - after the metric files are named

__all__ = ("celery_app",)
