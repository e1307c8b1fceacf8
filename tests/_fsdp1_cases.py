"""FSDP1 state dicts through torch_shard's ShardedTensor: run by test_fsdp1.py in an interpreter that
installed torch_shard.compat first (FSDP1 builds its ShardedTensors through torch.distributed._shard).

FSDP1 runs on CPU here with ``device_id=torch.device("cpu")`` and gloo. Its sharded state dict without
DTensor (``StateDictType.SHARDED_STATE_DICT``) holds one ShardedTensor per parameter (built with
``_init_from_local_shards_and_global_metadata``), its optimizer state dict the same for each state
tensor, and DCP's ``load_sharded_optimizer_state_dict`` builds them again on load; the local state
dict (``LOCAL_STATE_DICT``) holds each FSDP unit's flat parameter as a ShardedTensor built with
``init_from_local_shards`` (one exchange per unit).
"""

import shutil
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: N817 - the name its docs use
from torch.distributed.fsdp import ShardedOptimStateDictConfig, ShardedStateDictConfig, StateDictType

import torch_shard
from torch_shard.testing import ShardedTensorTestBase, with_comms

CPU = torch.device("cpu")


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))


def _shared_dir(rank: int) -> str:
    """A directory every rank names the same (created by rank 0, its name broadcast)."""
    names = [tempfile.mkdtemp(prefix="torch_shard_fsdp1_") if rank == 0 else None]
    torch.distributed.broadcast_object_list(names, 0)
    return names[0]


def _remove_shared_dir(rank: int, path: str) -> None:
    torch.distributed.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def _step(model, optimizer, rank: int, step: int) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _full_params(model) -> list:
    with FSDP.summon_full_params(model):
        return [p.detach().clone() for p in model.parameters()]


class TestFSDP1(ShardedTensorTestBase):
    @with_comms(init_rpc=False)
    def test_sharded_state_dict_and_optimizer_state_through_dcp(self):
        assert ShardedTensor is torch_shard.sharded_tensor.ShardedTensor
        model = FSDP(_model(0), device_id=CPU, use_orig_params=True)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        _step(model, optimizer, self.rank, 0)
        configs = (StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig())
        with FSDP.state_dict_type(model, *configs):
            state = model.state_dict()
            optim_state = FSDP.optim_state_dict(model, optimizer)
        self.assertTrue(state and all(type(v) is ShardedTensor for v in state.values()), {type(v) for v in state.values()})
        moments = [v for per_param in optim_state["state"].values() for k, v in per_param.items() if k != "step"]
        self.assertTrue(moments and all(type(v) is ShardedTensor for v in moments))
        path = _shared_dir(self.rank)
        dcp.save({"model": state, "optim": optim_state}, checkpoint_id=path)

        other = FSDP(_model(1), device_id=CPU, use_orig_params=True)
        other_optimizer = torch.optim.Adam(other.parameters(), lr=0.1)
        with FSDP.state_dict_type(other, *configs):
            loaded = {"model": other.state_dict()}
            dcp.load(loaded, checkpoint_id=path)
            other.load_state_dict(loaded["model"])
            optim_loaded = load_sharded_optimizer_state_dict(
                model_state_dict=loaded["model"], optimizer_key="optim", storage_reader=dcp.FileSystemReader(path)
            )
            loaded_moments = [v for p in optim_loaded["optim"]["state"].values() for k, v in p.items() if k != "step"]
            self.assertTrue(all(type(v) is ShardedTensor for v in loaded_moments))
            other_optimizer.load_state_dict(FSDP.optim_state_dict_to_load(other, other_optimizer, optim_loaded["optim"]))
        self.assertEqual(_full_params(other), _full_params(model))
        # Training goes on identically: the optimizer state came back too.
        _step(model, optimizer, self.rank, 1)
        _step(other, other_optimizer, self.rank, 1)
        self.assertEqual(_full_params(other), _full_params(model))
        _remove_shared_dir(self.rank, path)

    @with_comms(init_rpc=False)
    def test_local_state_dict_through_dcp(self):
        model = FSDP(_model(0), device_id=CPU)
        with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
            state = model.state_dict()
        flat = [v for v in state.values() if isinstance(v, ShardedTensor)]
        self.assertEqual(len(flat), 1)
        self.assertEqual(flat[0].size(), torch.Size([8 * 16 + 16 + 16 * 5 + 5]))
        path = _shared_dir(self.rank)
        dcp.save(state, checkpoint_id=path)
        other = FSDP(_model(1), device_id=CPU)
        with FSDP.state_dict_type(other, StateDictType.LOCAL_STATE_DICT):
            loaded = other.state_dict()
            dcp.load(loaded, checkpoint_id=path)
            other.load_state_dict(loaded)
        self.assertEqual(_full_params(other), _full_params(model))
        _remove_shared_dir(self.rank, path)
