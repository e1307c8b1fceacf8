"""Port of upstream test/distributed/_shard/sharded_tensor/test_logger.py (plus idempotence)."""

import logging

from torch_shard.sharded_tensor.logger import _get_or_create_logger
from torch_shard.testing import TestCase, run_tests


class ShardingSpecLoggerTest(TestCase):
    def test_get_or_create_logger(self):
        logger = _get_or_create_logger()
        self.assertIsNotNone(logger)
        self.assertEqual(1, len(logger.handlers))
        self.assertIsInstance(logger.handlers[0], logging.NullHandler)

    def test_logger_is_configured_once(self):
        first = _get_or_create_logger()
        second = _get_or_create_logger()
        self.assertIs(first, second)
        # pytest attaches its own capture handlers to loggers while a test runs; count ours only.
        ours = [h for h in second.handlers if not type(h).__module__.startswith("_pytest")]
        self.assertEqual(1, len(ours))
        self.assertFalse(second.propagate)
        self.assertEqual(logging.DEBUG, second.level)


if __name__ == "__main__":
    run_tests()
