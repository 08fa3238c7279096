"""The money's path: checkouts, plans and limits, state transitions, refunds, polling, and the outbox that
delivers what they record. Imports only the ground floor (config, errors, models, state, ...) and the core."""
