"""The ShardedTensor logger: ``torch_shard.sharding-spec-<HandlerClass>``.

Upstream names its logger ``sharding-spec-<HandlerClass>``; ours lives under ``torch_shard.`` so the
two never share handlers when both libraries are imported in one process.
"""

from __future__ import annotations

import logging

from .logging_handlers import _log_handlers

__all__: list[str] = []

_FORMAT = "%(asctime)s %(filename)s:%(lineno)s %(levelname)s p:%(processName)s t:%(threadName)s: %(message)s"


def _get_logging_handler(destination: str = "default") -> tuple[logging.Handler, str]:
    handler = _log_handlers[destination]
    return handler, type(handler).__name__


def _get_or_create_logger() -> logging.Logger:
    """The logger, configured once: DEBUG level, not propagated, one handler."""
    handler, handler_name = _get_logging_handler()
    logger = logging.getLogger(f"torch_shard.sharding-spec-{handler_name}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    if handler not in logger.handlers:
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
    return logger
