"""What beat and the workers run (DESIGN §4): one module per process role.

- ``sweeper``: claims due payments and hands their chunks to the publisher (timer
  worker, every second);
- ``executor``: executes a chunk of claimed payments in one transaction (payment workers);
- ``reaper``: takes back claims whose lease expired, dead-letters the hopeless (timer worker);
- ``materializer``: turns recurring occurrences into payments (recurring worker);
- ``bounds``: the time limits the reaper's, the materialiser's and the
  executor's transactions put on a lock another session holds.

Every status change they make goes through ``payments.transitions``; they
never publish (``payments.tasks`` does, after they return).
"""
