"""Port of upstream test/distributed/_shard/sharded_tensor/test_logger.py (plus idempotence)."""

import logging

from torch_shard.sharded_tensor.logger import _get_or_create_logger
from torch_shard.testing import TestCase, run_tests


def _own_handlers(logger):
    # pytest attaches its capture handlers to loggers while a test runs; count the logger's own.
    return [h for h in logger.handlers if not type(h).__module__.startswith("_pytest")]


class ShardingSpecLoggerTest(TestCase):
    def test_get_or_create_logger(self):
        logger = _get_or_create_logger()
        self.assertIsNotNone(logger)
        handlers = _own_handlers(logger)
        self.assertEqual(1, len(handlers))
        self.assertIsInstance(handlers[0], logging.NullHandler)

    def test_logger_is_configured_once(self):
        first = _get_or_create_logger()
        second = _get_or_create_logger()
        self.assertIs(first, second)
        self.assertEqual(1, len(_own_handlers(second)))
        self.assertFalse(second.propagate)
        self.assertEqual(logging.DEBUG, second.level)


if __name__ == "__main__":
    run_tests()
