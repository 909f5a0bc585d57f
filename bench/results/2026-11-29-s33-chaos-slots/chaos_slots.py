"""How often chaos's direct load (1,200/s × 0.96, one due instant per class per 1 s tick) makes
windows that sub_slots cuts: replays the due times through sweeper.chunk_claims."""
import random
from collections import Counter
from datetime import timedelta
import django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings.test")
django.setup()
from django.utils import timezone
from payments import transitions
from payments.engine import sweeper
from payments.clock import slot_start, spread_grid
rng = random.Random(1)
t0 = timezone.now()
claims = []
n = 0
for tick in range(120):
    now = t0 + timedelta(seconds=tick)
    count = int(1200 * 0.96)
    picks = Counter(rng.choices(range(3), [30, 50, 20], k=count))
    for cls, k in picks.items():
        low, high = [(0, 0), (1, 10), (10, 45)][cls]
        due = now + timedelta(seconds=rng.uniform(low, high))
        for _ in range(k):
            claims.append(transitions.Claimed(str(n), 1, rng.randrange(16), due)); n += 1
# the sweeper sees, every 200 ms, the claims whose due time is in its whole-slot horizon
grid = spread_grid()
cut_windows = windows = 0
claims.sort(key=lambda c: c.due_at)
by_slot = {}
for c in claims:
    by_slot.setdefault(slot_start(c.due_at, grid), []).append(c)
for start, group in sorted(by_slot.items()):
    sweep_now = start - timedelta(seconds=0.6)  # claimed ahead of its slot
    subs = sweeper.sub_slots(group, grid, sweep_now)
    windows += 1
    cut_windows += len(subs) > 1
print(f"{windows} slots with claims, {cut_windows} cut into sub-slots")
