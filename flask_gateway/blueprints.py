"""Registers the extension's blueprints and CLI on an app (called by ``Gateway.init_app``)."""

from __future__ import annotations

from flask import Blueprint, Flask, request

from flask_gateway.config import GatewayConfig

__all__ = ["register"]


def register(app: Flask, config: GatewayConfig) -> None:
    from flask_gateway.cli import gateway_cli
    from flask_gateway.views import admin, public

    app.register_blueprint(public.bp, url_prefix=config.url_prefix)
    app.register_blueprint(admin.bp, url_prefix=f"{config.url_prefix}/admin")
    # The callback and the v1 URLs are called by the gateway, proven by signatures, never by a form: they
    # are exempt from CSRF whether CSRFProtect was set up before Gateway or after it.
    _exempt_from_csrf(app, public.bp)
    app.cli.add_command(gateway_cli)


def _exempt_from_csrf(app: Flask, blueprint: Blueprint) -> None:
    csrf = app.extensions.get("csrf")
    if csrf is not None:
        csrf.exempt(blueprint)
        return

    def exempt_late() -> None:
        # Runs first among the app's before_request hooks, so before CSRFProtect's own check.
        late = app.extensions.get("csrf")
        if late is not None and request.blueprint == blueprint.name:
            late.exempt(blueprint)

    app.before_request_funcs.setdefault(None, []).insert(0, exempt_late)
