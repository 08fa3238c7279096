"""Running it: the CLI, doctor, reconcile, callback health, metrics, rate limits, drift, outages, Celery
tasks. Imports the ground floor, the core, ``payments`` and ``inbound``; never ``web`` or the extension."""
