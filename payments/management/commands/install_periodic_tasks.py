from django.core.management.base import BaseCommand

from payments.periodic import install_periodic_tasks


class Command(BaseCommand):
    help = "Install or reset the beat schedule (sweeper, reaper, maintenance)."

    def handle(self, *args, **options):
        for name in install_periodic_tasks():
            self.stdout.write(f"installed: {name}")
