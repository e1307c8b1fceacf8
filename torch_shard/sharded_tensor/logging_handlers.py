"""Where ShardedTensor's internal logs go: a NullHandler unless a destination is registered."""

from __future__ import annotations

import logging

__all__: list[str] = []

_log_handlers: dict[str, logging.Handler] = {"default": logging.NullHandler()}
