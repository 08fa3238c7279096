"""Jinja templates compiled once per process, not once per app's environment (no Flask here).

Every Flask app has a Jinja environment of its own, and each environment compiles every template it renders
(parse, generate Python source, ``compile``): tens of milliseconds for a page of the example shop, the
extension's admin screens or the emulator's hosted pages. An app factory called many times in one process
(a test suite builds apps per test) compiles the same templates again for each app.
:class:`SharedTemplateCode` is a Jinja bytecode cache held in memory for the process: an environment that
loads a template another environment compiled takes that compiled code, when both would have compiled it
the same way.

What the compiled code depends on, besides the template's source (its checksum) and name: the syntax
settings (delimiters, whitespace control, newlines), whether it autoescapes (decided for the template's
name), async and sandbox modes, the optimizer, the code generator, ``finalize``, and the filters and tests
(the optimizer may run a filter on constants while compiling): all in the key, so an environment that
differs in any of them compiles for itself. An environment with Jinja extensions is never served from the
cache (an extension may parse and compile as it likes). The code objects are immutable; each environment
builds its own template from them, with its own globals.

``app.jinja_options = {**app.jinja_options, "bytecode_cache": SHARED_TEMPLATE_CODE}`` before the app's
environment is first used (the emulator's ``create_app`` does).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from types import CodeType
from typing import Final

from jinja2 import Environment
from jinja2.bccache import Bucket, BytecodeCache

__all__ = ["SHARED_TEMPLATE_CODE", "SharedTemplateCode"]


def _compile_signature(environment: Environment, name: str) -> Hashable | None:
    """What, besides the source, decides the code ``environment`` compiles for the template ``name``; None
    when it cannot be told (the environment has extensions, or a filter that cannot be hashed)."""
    if environment.extensions:
        return None
    autoescape = environment.autoescape
    signature = (
        bool(autoescape(name)) if callable(autoescape) else bool(autoescape),
        environment.block_start_string,
        environment.block_end_string,
        environment.variable_start_string,
        environment.variable_end_string,
        environment.comment_start_string,
        environment.comment_end_string,
        environment.line_statement_prefix,
        environment.line_comment_prefix,
        environment.trim_blocks,
        environment.lstrip_blocks,
        environment.newline_sequence,
        environment.keep_trailing_newline,
        environment.is_async,
        environment.sandboxed,
        frozenset(getattr(environment, "intercepted_binops", ())),
        frozenset(getattr(environment, "intercepted_unops", ())),
        environment.optimized,
        environment.code_generator_class,
        environment.finalize,
        frozenset(environment.filters.items()),
        frozenset(environment.tests.items()),
    )
    try:
        hash(signature)
    except TypeError:  # a filter or test that cannot be hashed: compiled for this environment alone
        return None
    return signature


class SharedTemplateCode(BytecodeCache):
    """A Jinja bytecode cache in memory, shared by every environment of the process that uses it."""

    def __init__(self) -> None:
        self._codes: dict[tuple[str, Hashable, str], CodeType] = {}
        self._lock = threading.Lock()

    def get_bucket(self, environment: Environment, name: str, filename: str | None, source: str) -> Bucket:
        signature = _compile_signature(environment, name)
        key = self.get_cache_key(name, filename)
        checksum = self.get_source_checksum(source)
        bucket = _SharedBucket(environment, key, checksum, signature)
        if signature is not None:
            bucket.code = self._codes.get((key, signature, checksum))
        return bucket

    def set_bucket(self, bucket: Bucket) -> None:
        if isinstance(bucket, _SharedBucket) and bucket.signature is not None and bucket.code is not None:
            with self._lock:
                self._codes[(bucket.key, bucket.signature, bucket.checksum)] = bucket.code

    def load_bytecode(self, bucket: Bucket) -> None:
        """Not used: :meth:`get_bucket` looks the code up itself."""

    def dump_bytecode(self, bucket: Bucket) -> None:
        self.set_bucket(bucket)

    def clear(self) -> None:
        with self._lock:
            self._codes.clear()

    def __len__(self) -> int:
        return len(self._codes)


class _SharedBucket(Bucket):
    """A bucket that remembers the compile signature it was looked up with."""

    def __init__(self, environment: Environment, key: str, checksum: str, signature: Hashable | None) -> None:
        super().__init__(environment, key, checksum)
        self.signature = signature


#: The process's cache (one is enough: the key tells environments apart).
SHARED_TEMPLATE_CODE: Final = SharedTemplateCode()
