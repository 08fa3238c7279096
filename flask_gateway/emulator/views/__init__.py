"""The emulator's blueprints: v2 and v1 APIs, hosted pages, control API, deliveries, dashboard."""
