"""Registers the extension's blueprints and CLI on an app (called by ``Gateway.init_app``)."""

from __future__ import annotations

from flask import Flask

from flask_gateway.config import GatewayConfig

__all__ = ["register"]


def register(app: Flask, config: GatewayConfig) -> None:
    from flask_gateway.cli import gateway_cli
    from flask_gateway.views import admin, public

    app.register_blueprint(public.bp, url_prefix=config.url_prefix)
    app.register_blueprint(admin.bp, url_prefix=f"{config.url_prefix}/admin")
    csrf = app.extensions.get("csrf")
    if csrf is not None:
        # The callback and the v1 URLs are called by the gateway, proven by signatures, never by a form.
        csrf.exempt(public.bp)
    app.cli.add_command(gateway_cli)
