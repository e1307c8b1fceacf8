"""How every torch_shard op is registered: kernels per dispatch key, fake kernels, autograd,
``torch.library.opcheck`` over the ops that can be traced, and the error the others raise under
FakeTensorMode (NOTE [ Ops that cannot be traced ] in csrc/ops/untraceable.h). Also the row-wise
routing helpers the test library reaches through the product's seams (csrc/seams.h). Single process.
"""

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torch_shard
from torch_shard.testing import TestCase, cpu_loops, requires_testing_library, run_tests

_ops = torch.ops.torch_shard

# Every op of the library, by kind. An op added to csrc/torch_shard.cpp must be added here too
# (test_every_op_is_classified), with its kernels and fake kernel or its error under FakeTensorMode.
# Traceable: a kernel per backend key (or one for all of them) and a fake kernel.
TRACEABLE = {"chunk_boxes": ("CompositeExplicitAutograd",)}
# Not traceable (CompositeImplicitAutograd, raising under FakeTensorMode): they communicate ...
COMMUNICATE = {
    "shard", "gather", "reshard", "_abort", "_agree_shard", "_share_inputs", "_all_ranks_true",
    "_gather_values", "_rowwise_lookup", "_rowwise_lookup_backward", "_colwise_lookup",
    "_colwise_lookup_backward", "_embedding_renorm_", "_redistribute",
}
# Of those, the whole lookups in one call (NOTE [ A row-wise lookup in one call ], NOTE [ A column-wise
# lookup in one call ]) and DTensor's redistribute (NOTE [ Redistributing replicated layouts ]) take and
# return plain tensors only: CPU and CUDA kernels and a fake kernel that raises (the others run at the
# Autograd key, before the Python key of a ShardedTensor). The lookups have registered autograd, their
# backward ops none (no double backward); _redistribute none either: interop.redistribute's autograd
# Function, on DTensors, is its autograd.
LOOKUP = {"_rowwise_lookup", "_rowwise_lookup_backward", "_colwise_lookup", "_colwise_lookup_backward", "_redistribute"}
# ... build or read a ShardedTensor's C++ impl ...
READ_IMPL = {
    "_make_sharded", "_local_shards", "_local_shard_indices", "_version", "_state", "_layout", "_group_name",
    "_set_local_shards",
}
# ... or return what they read from their tensors' values.
READ_VALUES = {"validate_shards", "_find_overlap", "_transfer_counts", "_layout_fingerprint"}
# No tensors in or out, or nothing a fake tensor lacks (is_sharded: a fake tensor is never sharded;
# _local_shard_mismatch reads its tensors' metadata only).
PLAIN = {"chunk_layout", "chunked_dim_size", "is_sharded", "_local_shard_mismatch", "_comm_stats", "_error_classes"}


def _qualname(name):
    return f"torch_shard::{name}"


def _has_kernel(name, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(_qualname(name), key)


def _has_fake_kernel(name):
    return torch._library.simple_registry.singleton.find(_qualname(name)).fake_impl.kernel is not None


def _long(*values):
    return torch.tensor(values, dtype=torch.int64)


class TestRegistrations(TestCase):
    def test_every_op_is_classified(self):
        registered = {
            name.split("::", 1)[1].split(".", 1)[0]
            for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("torch_shard::")
        }
        kinds = [set(TRACEABLE), COMMUNICATE, READ_IMPL, READ_VALUES, PLAIN]
        self.assertEqual(registered, set().union(*kinds))
        self.assertEqual(sum(len(kind) for kind in kinds), len(registered))  # each op in one kind
        self.assertRegex(torch_shard.__version__, r"^0\.1\.0\+pt\d+")  # 0.1.0+pt213cpu: the torch it was built for

    def test_kernels_per_key(self):
        for name, keys in TRACEABLE.items():
            with self.subTest(op=name):
                for key in keys:
                    self.assertTrue(_has_kernel(name, key), f"{name} has no {key} kernel")
                self.assertFalse(_has_kernel(name, "CompositeImplicitAutograd"))
                self.assertTrue(_has_fake_kernel(name))
        for name in LOOKUP:
            with self.subTest(op=name):
                for key in ("CPU", "CUDA"):
                    self.assertTrue(_has_kernel(name, key), f"{name} has no {key} kernel")
                self.assertEqual(_has_kernel(name, "Autograd"), name.endswith("_lookup"))
                self.assertFalse(_has_kernel(name, "CompositeImplicitAutograd"))
                self.assertTrue(_has_fake_kernel(name))  # it raises: TestUntraceableOps
        # The others run at the Autograd key, before the Python key of a wrapped ShardedTensor.
        for name in (COMMUNICATE - LOOKUP) | READ_IMPL | READ_VALUES | PLAIN:
            with self.subTest(op=name):
                self.assertTrue(_has_kernel(name, "CompositeImplicitAutograd"))
                self.assertFalse(_has_fake_kernel(name))

    @requires_testing_library
    def test_bucket_ids_and_unpack_received(self):
        # NOTE [ Requester-side routing in one op ], through the test-only library (the helpers are C++,
        # not ops): rows [0, 4) on rank 1, [4, 8) on rank 2, none on rank 0, [8, 10) on rank 3; bags
        # [0, 2), [2, 2) (empty), [2, 5). The CPU's loops and the composition other devices take give the
        # same, with int32 ids (10 rows) and int64 ones (a table of 2**31 rows or more).
        testing = torch.ops.torch_shard_testing
        ids, offsets = _long(9, 1, 5, 0, 8), _long(0, 2, 2)
        for rows, dtype in ((10, torch.int32), (2**40, torch.int64)):
            starts, sizes = [0, 0, 4, 8], [0, 4, 4, rows - 8]
            for loops in (True, False):
                with self.subTest(rows=rows, loops=loops), cpu_loops(loops):
                    send, perm, words, divisors = testing._bucket_ids(ids, offsets, starts, sizes, rows, 1)
                    self.assertEqual(send.dtype, dtype)
                    # per owner holding ids: its ids, then its lengths of the 3 bags (rank 0 holds none,
                    # so it gets no lengths either: NOTE [ Idle owners ])
                    self.assertEqual(send.tolist(), [1, 0, 1, 0, 1, 5, 0, 0, 1, 9, 8, 1, 0, 1])
                    self.assertEqual(perm.tolist(), [1, 3, 2, 0, 4])
                    self.assertEqual(words.tolist(), [c + (3 << 32) for c in (0, 2, 1, 2)])
                    self.assertEqual(divisors.tolist(), [1, 1, 3])  # id 1 pads; an empty bag divides by 1
                    # Without bags: ids only, words are counts.
                    send, perm, words, _ = testing._bucket_ids(ids, None, starts, sizes, rows, -1)
                    self.assertEqual((send.tolist(), words.tolist()), ([1, 0, 5, 9, 8], [0, 2, 1, 2]))
                    # Rank 3 receives from two requesters that sent it the same block, rows from 8.
                    block = _long(9, 8, 1, 0, 1).to(dtype)
                    got_ids, got_offsets = testing._unpack_received(torch.cat([block, block]), [2, 2], [3, 3], True, 8)
                    self.assertEqual(got_ids.tolist(), [1, 0, 1, 0])
                    self.assertEqual(got_offsets.tolist(), [0, 1, 1, 2, 3, 3])
                    # Ids out of range and ill-formed offsets (the agreement raises on them) and no ids
                    # at all stay in bounds: every index is in its tensor. An id outside the table goes to
                    # the nearest owner (loops) or to none (the composition counts it for the range check).
                    for bad in (-3, 10, 2**41):
                        send, perm, words, _ = testing._bucket_ids(_long(bad, 1), _long(0), starts, sizes, rows, -1)
                        counts = [w & 0xFFFFFFFF for w in words.tolist()]
                        self.assertEqual(sorted(perm.tolist()), [0, 1])
                        self.assertGreaterEqual(counts[1], 1)  # id 1, on rank 1
                        self.assertEqual(sum(counts), 2 if loops or 0 <= bad < rows else 1)
                    send, perm, words, _ = testing._bucket_ids(_long(3, 1, 9), _long(2, 0, 7), starts, sizes, rows, -1)
                    self.assertEqual(sorted(perm.tolist()), [0, 1, 2])
                    self.assertEqual(send.numel(), 3 + 3 * sum(1 for w in words.tolist() if w & 0xFFFFFFFF))
                    send, perm, words, _ = testing._bucket_ids(_long(), _long(), starts, sizes, rows, -1)
                    self.assertEqual((send.numel(), perm.numel(), words.tolist()), (0, 0, [0] * 4))
        # Lengths that do not add up to the ids are a bug, never input (checked requesters send them).
        with self.assertRaisesRegex(RuntimeError, "lengths do not add up"):
            testing._unpack_received(_long(8, 9, 3), [2], [1], True, 8)
        with self.assertRaisesRegex(ValueError, "received holds 2 values"):
            testing._unpack_received(_long(8, 9), [2], [1], True, 8)
        # The ranks' rows must tile the table: a row without an owner, or with two, raises.
        with self.assertRaisesRegex(ValueError, "do not tile \\[0, 10\\): index 4 has no owner"):
            testing._bucket_ids(_long(1), None, [0, 6], [4, 4], 10, -1)
        with self.assertRaisesRegex(ValueError, "do not tile \\[0, 10\\): index 3 has two owners"):
            testing._bucket_ids(_long(1), None, [0, 3], [4, 7], 10, -1)
        with self.assertRaisesRegex(ValueError, "is not within"):
            testing._bucket_ids(_long(1), None, [0, 10], [10, 1], 10, -1)

    def test_opcheck_chunk_boxes(self):
        for global_size, dim, chunks in (([10, 4], 0, 4), ([10, 4], -1, 3), ([3], 0, 5), ([0, 2], 0, 2)):
            with self.subTest(global_size=global_size, dim=dim, chunks=chunks):
                torch.library.opcheck(_ops.chunk_boxes.default, (global_size, dim, chunks))
        with FakeTensorMode():
            offsets, sizes = _ops.chunk_boxes([10, 4], 1, 3)
            self.assertIsInstance(offsets, FakeTensor)
            self.assertEqual((offsets.shape, sizes.shape, offsets.dtype), ((3, 2), (3, 2), torch.int64))
            # The fake kernel raises what the real one does.
            with self.assertRaisesRegex(ValueError, "Invalid sharding dim"):
                _ops.chunk_boxes([10, 4], 2, 3)

class TestUntraceableOps(TestCase):
    """Under FakeTensorMode the ops that cannot be traced raise one RuntimeError naming themselves and
    why, before they touch a tensor or a process group (no group exists in this process)."""

    def _raises(self, name, why, call):
        with self.subTest(op=name):
            with FakeTensorMode():
                with self.assertRaisesRegex(RuntimeError, rf"^torch_shard\.{name} {why}, so it cannot be traced"):
                    call()

    def test_communicating_ops(self):
        why = "communicates over its process group"
        group, cpu = "no_such_group", ["rank:0/cpu"]
        calls = {
            "shard": lambda: _ops.shard(None, 0, [4], torch.float32, 0, None, None, None, cpu, [0], False, group),
            "gather": lambda: _ops.gather(torch.empty(4), 0, None),
            "reshard": lambda: _ops.reshard(torch.empty(4), 0, None, None, None, cpu, [0]),
            "_abort": lambda: _ops._abort("shard", "ValueError", group),
            "_agree_shard": lambda: _ops._agree_shard(0, [4], torch.float32, 0, group),
            "_share_inputs": lambda: _ops._share_inputs([torch.empty(2)], 0, 0, group),
            "_all_ranks_true": lambda: _ops._all_ranks_true(True, group),
            "_gather_values": lambda: _ops._gather_values(1, group),
            "_rowwise_lookup": lambda: _ops._rowwise_lookup(
                torch.empty(4, 2), _long(1), None, None, [0], [4], 4, -1, "embedding", False, False, 0, [], group
            ),
            "_rowwise_lookup_backward": lambda: _ops._rowwise_lookup_backward(
                torch.empty(1, 2), [_long()] * 10, -1, "embedding", group
            ),
            "_colwise_lookup": lambda: _ops._colwise_lookup(
                torch.empty(4, 2), _long(1), None, None, [0], [2], 4, -1, "embedding", False, False, 0, [], group
            ),
            "_colwise_lookup_backward": lambda: _ops._colwise_lookup_backward(
                torch.empty(1, 2), [_long()] * 7, -1, "embedding", group
            ),
            "_embedding_renorm_": lambda: _ops._embedding_renorm_(
                torch.empty(4, 2), _long(1), 0, [0], [4], 4, 1.0, 2.0, 0, [], group
            ),
            "_redistribute": lambda: _ops._redistribute(
                [torch.empty(4)], torch.empty(4), [4], _long(0).view(1, 1), _long(4).view(1, 1), [0],
                _long(0).view(1, 1), _long(4).view(1, 1), [0], group,
            ),
        }
        self.assertEqual(set(calls), COMMUNICATE)
        for name, call in calls.items():
            self._raises(name, why, call)
        # make_fx without fake tensors reaches the lookups through ProxyTorchDispatchMode instead.
        def traced(local, ids):
            return _ops._rowwise_lookup(local, ids, None, None, [0], [4], 4, -1, "embedding", False, False, 0, [], group)

        with self.assertRaisesRegex(RuntimeError, rf"^torch_shard\._rowwise_lookup {why}, so it cannot be traced"):
            make_fx(traced)(torch.ones(4, 2), _long(1))

    def test_impl_ops(self):
        why = "builds, reads or writes a ShardedTensor's C\\+\\+ impl"
        calls = {
            "_make_sharded": lambda: _ops._make_sharded(
                [], [], [4], 0, None, None, None, ["rank:0/cpu"], [0], torch.float32, None, False, "", -1, -1
            ),
            "_local_shards": lambda: _ops._local_shards(torch.empty(4)),
            "_local_shard_indices": lambda: _ops._local_shard_indices(torch.empty(4)),
            "_version": lambda: _ops._version(torch.empty(4)),
            "_state": lambda: _ops._state(torch.empty(4)),
            "_layout": lambda: _ops._layout(torch.empty(4)),
            "_group_name": lambda: _ops._group_name(torch.empty(4)),
            "_set_local_shards": lambda: _ops._set_local_shards(torch.empty(4), [], []),
        }
        self.assertEqual(set(calls), READ_IMPL)
        for name, call in calls.items():
            self._raises(name, why, call)
        with FakeTensorMode():
            self.assertFalse(_ops.is_sharded(torch.empty(4)))
            # Metadata only: the same answers for fake tensors as for real ones ([k, code] or []).
            fake = torch.empty(2, 3)
            self.assertEqual(_ops._local_shard_mismatch([fake], [2, 3], [2], ["cpu"]), [])
            self.assertEqual(_ops._local_shard_mismatch([fake], [2, 4], [2], ["cpu"]), [0, 3])
            self.assertEqual(_ops._local_shard_mismatch([fake], [2, 3], [2], ["cpu"], torch.float64), [0, 5])

    def test_value_reading_layout_ops(self):
        why = "reads the values of its tensor arguments"
        size = [4, 2]
        with FakeTensorMode():
            offsets = torch.zeros(2, 2, dtype=torch.int64)
            sizes = torch.ones(2, 2, dtype=torch.int64)
        calls = {
            "validate_shards": lambda: _ops.validate_shards(offsets, sizes, size),
            "_find_overlap": lambda: _ops._find_overlap(offsets, sizes),
            "_transfer_counts": lambda: _ops._transfer_counts(size, offsets, sizes, [0, 0], offsets, sizes, [0, 0], 0, 1),
            "_layout_fingerprint": lambda: _ops._layout_fingerprint(
                size, None, offsets, sizes, None, ["rank:0/cpu", "rank:0/cpu"], [0, 0], torch.float32
            ),
        }
        self.assertEqual(set(calls), READ_VALUES)
        for name, call in calls.items():
            with self.subTest(op=name):
                with self.assertRaisesRegex(RuntimeError, rf"^torch_shard\.{name} {why}, so it cannot be traced"):
                    call()
        # Meta tensors have no values either; real CPU tensors under the mode are read as usual.
        with self.assertRaisesRegex(RuntimeError, "cannot be traced"):
            meta = torch.zeros(2, 2, dtype=torch.int64, device="meta")
            _ops.validate_shards(meta, meta)
        self.assertEqual(_ops._find_overlap(_long(0, 1).view(2, 1), _long(2, 2).view(2, 1)), [0, 1])


if __name__ == "__main__":
    run_tests()
