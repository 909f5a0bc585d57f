"""One module per scenario of the bench suite, each over ``bench.harness``.

Suite scenarios (run by ``bench/run.py``, each in its own process): ``drain``
(and its ``hot`` variant), ``steady``, ``scale``, ``pglimit``, ``peers``,
``capacity`` (asked for by name: ``--only drain,capacity``); each has
``run(args) -> dict``. Standalone benches with their own command line
(``bench/<name>.py`` calls their ``main``): ``noisy``, ``soak``,
``api_latency``, ``api_cost``, ``executor_cost``, ``peers``.
"""
