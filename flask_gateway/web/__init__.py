"""The extension's pages: the owner's admin screens and the gateway-facing blueprint, forms and templates.
Imports every floor below it (``operations`` included); only the extension (its wiring) imports it."""
