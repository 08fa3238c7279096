"""The extension's blueprints: ``public`` (gateway-facing endpoints) and ``admin`` (screens)."""
