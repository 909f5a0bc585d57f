"""The Celery application's process hooks (``scheduler_project.celery``)."""

import gc

import pytest
from celery.signals import worker_process_init, worker_ready


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("signal", [worker_process_init, worker_ready], ids=lambda s: s.name)
def test_a_worker_leaves_what_it_loaded_out_of_full_collections(unfrozen, signal):
    """A pool process after the fork, and a worker once ready, freeze the objects
    loaded so far: full collections no longer walk Django, the app and Celery."""
    import scheduler_project.celery  # noqa: F401 - the handlers connect on import

    assert gc.get_freeze_count() == 0
    signal.send(sender=None)
    assert gc.get_freeze_count() > 10_000
