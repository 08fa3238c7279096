"""The version, in one place: setuptools reads ``__version__`` from here for the distribution's metadata
(``[tool.setuptools.dynamic]`` in pyproject.toml), so ``flask_gateway.__version__`` and
``importlib.metadata.version(DISTRIBUTION)`` agree (tests/packaging/test_release.py checks both the
installed package and the built wheel's METADATA). Release: change it here and in CHANGELOG.md.

``DISTRIBUTION`` is the name the package index knows this project by (pyproject.toml's ``[project] name``,
which setuptools reads as a literal: the test checks the two agree). It differs from the import name:
``flask-gateway`` on the index is another project (docs/packaging.md).
"""

from typing import Final

__version__ = "0.1.0"

DISTRIBUTION: Final = "flask-bnpl-gateway"
