"""(being written) ``flask gateway ...`` commands."""

import click

gateway_cli = click.Group("gateway", help="Flask-Gateway: database, reconciliation, status.")
