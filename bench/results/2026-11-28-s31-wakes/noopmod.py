from scheduler_project.celery import app
@app.task(name="noop", acks_late=True, ignore_result=True)
def noop(items, partitions=None):
    return None
