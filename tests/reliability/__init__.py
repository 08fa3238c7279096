"""Reliability under load and faults: the example shop and the emulator as real gunicorn servers.

Everything runs on PostgreSQL (the session's throwaway cluster, one database per app; ``test_faults.py`` has a
cluster of its own), the shop with 4 worker processes, the emulator with 3, both started on empty databases
(``conftest.py``). Counts come from
database rows, across processes: fulfilments are the orders' ``paid`` history rows, signals the rows of
``reliability_signals`` (``shop_wsgi.py``).

- ``test_callbacks.py``: 50 identical signed callbacks at once; callbacks racing the return page; the
  owner's cancel racing the consumer's payment; reconcile runs racing callbacks and return pages.
- ``test_idempotency.py``: 20 parallel refunds over the paid total (gateway API, and the shop's admin);
  20 parallel creates with one ``requestId``; 20 parallel "Pay" submissions of one order (open checkout,
  lost create answer, brand-new order).
- ``test_chaos.py``: 100 seeded checkouts with faults on create, getstatus, callbacks and refunds, the
  clock moved on, ``flask --app example_shop gateway reconcile``; every order checked against the gateway.
- ``test_faults.py``: faults an operator meets, on a cluster of its own with fsync on: the fault run (60
  shoppers while PostgreSQL restarts fast and immediate and shop workers are SIGKILLed inside callbacks, then
  ``deliver`` and ``reconcile``: nothing lost, nothing twice, 503 + ``Retry-After`` only during the outages,
  the shop back without a person), both servers booting while PostgreSQL is down, SIGTERM mid-callback.
- ``test_deployment.py``: the example shop deployed with its own files (gunicorn, Celery worker and beat,
  Redis, ``/metrics``, the doctor); Redis and the worker stopped and started again.

No test asserts how long something took: each waits for the event it needs (a row, a log line, a process,
an answer), with a last-resort deadline whose failure says what it waited for and shows the logs' tails.
How long recovery takes (the outbox after kills, the shop's return after a restart or a boot without its
database, an outage's detection and clearing) is measured by the same scenarios in
``benchmarks/figure_recovery.py``, against targets.

Run: ``.venv/bin/pytest tests/reliability -q`` (part of the normal ``pytest``; skipped with
``--database=sqlite``). The figures each test checked are printed as ``[reliability] ...`` lines;
``RELIABILITY_SEED=<n>`` replays a chaos plan.
"""

#: The line a gunicorn process of ``shop_wsgi`` writes to its log once it has built the app (a worker that
#: cannot boot never does), with its pid: a test waits for it instead of giving a worker time to fail.
APP_LOADED = "reliability: the shop's app is loaded in process"
