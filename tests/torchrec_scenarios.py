"""TorchRec on torch_shard: the rank program test_torchrec.py launches with torchrun (4 gloo ranks).

Not a test module itself (pytest does not collect it): ``tests/test_torchrec.py`` runs it as
``torchrun --nproc-per-node=4 torchrec_scenarios.py RESULTS_DIR`` and reports each scenario as a test.
Every rank installs ``torch_shard.compat`` before anything imports ``torch.distributed._shard``, so
TorchRec's ShardedTensors are torch_shard's (``... RESULTS_DIR --upstream``: torch's own, for the
side-by-side runs of scripts/stress_torchrec.py). Each scenario runs on every rank; each rank writes the
outcome of every scenario to ``RESULTS_DIR/rank<r>.json`` as it goes. After a scenario the ranks agree
on its outcome; after a failure the remaining scenarios are recorded as not run (the ranks may no
longer be in step), and the process group's timeout turns a hang into an error.

The ranks pretend to be 2 hosts of 2 ranks (``LOCAL_WORLD_SIZE=2``), so table-row-wise sharding (row-
wise within one host) differs from row-wise (over all 4 ranks).

Every FBGEMM kernel the scenarios build passes ``_guard_fbgemm_kernels`` (no kernel ends with a table
that has no rows on its rank, where FBGEMM's CPU kernels read out of bounds).
"""

# ruff: noqa: E402 - the alias (below) must be installed before anything imports torch.distributed._shard
from __future__ import annotations

import os

os.environ["LOCAL_WORLD_SIZE"] = "2"  # torchrun sets 4; TorchRec reads this for its host grouping

import sys

# `--upstream`: the same scenarios on torch's own torch.distributed._shard, for side-by-side runs
# (scripts/stress_torchrec.py); by default every ShardedTensor is torch_shard's.
UPSTREAM = "--upstream" in sys.argv
if not UPSTREAM:
    import torch_shard.compat  # noqa: F401

import datetime
import io
import json
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.testing import assert_close

SCENARIOS: dict = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def _torchrec() -> dict:
    """TorchRec's names the scenarios use, imported after the alias."""
    import torchrec
    import torchrec.distributed.sharding.dynamic_sharding as dynamic_sharding
    import torchrec.distributed.sharding_plan as sharding_plan
    import torchrec.distributed.types as types
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    return {
        "torchrec": torchrec,
        "EmbeddingBagCollection": torchrec.EmbeddingBagCollection,
        "EmbeddingBagConfig": torchrec.EmbeddingBagConfig,
        "EmbeddingCollection": torchrec.EmbeddingCollection,
        "EmbeddingConfig": torchrec.EmbeddingConfig,
        "KeyedJaggedTensor": torchrec.KeyedJaggedTensor,
        "DistributedModelParallel": DistributedModelParallel,
        "output_sharding_plan_delta_single": dynamic_sharding.output_sharding_plan_delta_single,
        "construct_module_sharding_plan": sharding_plan.construct_module_sharding_plan,
        "row_wise": sharding_plan.row_wise,
        "column_wise": sharding_plan.column_wise,
        "table_wise": sharding_plan.table_wise,
        "table_row_wise": sharding_plan.table_row_wise,
        "ShardingEnv": types.ShardingEnv,
        "ShardingPlan": types.ShardingPlan,
        "apply_optimizer_in_backward": apply_optimizer_in_backward,
    }


TR = _torchrec()
RANK = WORLD = 0
TABLES: list = []
STATE: dict = {}  # what one scenario leaves for the next (the trained model, the checkpoint)


def _tables():
    config = TR["EmbeddingBagConfig"]
    return [
        # 6 rows row-wise over 4 ranks: 2, 2, 2 and an empty shard on rank 3.
        config(name="t_rw", embedding_dim=8, num_embeddings=6, feature_names=["f_rw"]),
        # Rank 3's row-wise kernel needs a non-empty table as well: FBGEMM's CPU kernel fails where every
        # table of a kernel is empty (it takes the kernel for a GPU one).
        config(name="t_rw2", embedding_dim=8, num_embeddings=11, feature_names=["f_rw2"]),
        # 7 rows, so that laid out row-wise (plan "b") rank 3's share is 1 row, not 0: there it is the
        # last table of rank 3's row-wise kernel (see _guard_fbgemm_kernels).
        config(name="t_cw", embedding_dim=16, num_embeddings=7, feature_names=["f_cw"]),
        config(name="t_tw", embedding_dim=8, num_embeddings=7, feature_names=["f_tw"]),
        config(name="t_twrw", embedding_dim=8, num_embeddings=9, feature_names=["f_twrw"]),
    ]


def _plan(name: str) -> dict:
    rw, cw, tw, twrw = TR["row_wise"], TR["column_wise"], TR["table_wise"], TR["table_row_wise"]
    plans = {
        # The one the model is trained with: every sharding type.
        "a": {"t_rw": rw(), "t_rw2": rw(), "t_cw": cw(ranks=[0, 1]), "t_tw": tw(rank=2), "t_twrw": twrw(host_index=1)},
        # Every table laid out otherwise: the checkpoint is loaded into this one.
        "b": {"t_rw": tw(rank=1), "t_rw2": rw(), "t_cw": rw(), "t_tw": cw(ranks=[3, 2]), "t_twrw": twrw(host_index=0)},
        # "a" with the table-wise table moved and the column-wise one on other ranks: resharding target
        # (TorchRec's resharding does not support row-wise moves on gloo).
        "c": {"t_rw": rw(), "t_rw2": rw(), "t_cw": cw(ranks=[2, 3]), "t_tw": tw(rank=0), "t_twrw": twrw(host_index=1)},
    }
    return plans[name]


class Model(nn.Module):
    """An EmbeddingBagCollection and one dense parameter (so DistributedModelParallel wraps the model
    in DistributedDataParallel, as it does for real models, which its reshard expects)."""

    def __init__(self, device):
        super().__init__()
        self.ebc = TR["EmbeddingBagCollection"](tables=TABLES, device=device)
        self.scale = nn.Parameter(torch.ones((), device=device))

    def forward(self, kjt):
        return self.ebc(kjt).values() * self.scale


def _model(optimizer, options: dict) -> Model:
    """A Model on the meta device whose embeddings ``optimizer`` trains in backward (TorchRec then
    picks its fused kernels, which apply the optimizer inside the embedding backward)."""
    model = Model(torch.device("meta"))
    # (a copy: TorchRec adds its own keys to the dict it is given)
    TR["apply_optimizer_in_backward"](optimizer, model.ebc.parameters(), dict(options))
    return model


def _module_plan(name: str, model: Model | None = None):
    """Plan ``name`` for ``model``'s embeddings (for a model with a fused optimizer by default)."""
    model = model if model is not None else _model(torch.optim.SGD, {"lr": 0.5})
    return TR["construct_module_sharding_plan"](model.ebc, _plan(name), local_size=2, world_size=WORLD, device_type="cpu")


def _dmp(plan_name: str, optimizer, options: dict):
    """A DistributedModelParallel of Model with ``plan_name``'s plan, its embeddings trained by
    TorchRec's fused ``optimizer``."""
    model = _model(optimizer, options)
    env = TR["ShardingEnv"].from_process_group(dist.group.WORLD)
    plan = TR["ShardingPlan"]({"ebc": _module_plan(plan_name, model)})
    dmp = TR["DistributedModelParallel"](model, env=env, device=torch.device("cpu"), plan=plan)
    _guard_fbgemm_kernels(dmp)
    return dmp


# Follows each kernel's table sizes in memory (see _guard_fbgemm_kernels): far above FBGEMM's 2^31-row
# limit, so a kernel that reads it raises at once.
_CANARY = 1 << 40


def _every_submodule(module: nn.Module, prefix: str = ""):
    """(name, module) for ``module`` and everything under it, TorchRec's kernels included (a sharded
    module keeps its lookups in a plain list, out of ``named_modules``)."""
    yield prefix, module
    children = list(module._modules.items())
    children += [(f"_lookups.{i}", lookup) for i, lookup in enumerate(getattr(module, "_lookups", None) or [])]
    for name, child in children:
        if isinstance(child, nn.Module):
            yield from _every_submodule(child, f"{prefix}.{name}" if prefix else name)


def _guard_fbgemm_kernels(module: nn.Module) -> None:
    """Refuse, and trap, the table layout on which FBGEMM's CPU kernels read out of bounds.

    A CPU table-batched embedding kernel (fbgemm-gpu-cpu 1.8) finds table t's row count by walking its
    ``hash_size_cumsum`` buffer (T + 1 entries) from t + 1 until the difference is not 0. For a kernel
    whose LAST table has no rows on this rank, the walk goes past the end of the buffer: the kernel
    takes whatever memory follows as a row count, in the forward and in the backward. A value at or
    above 2^31 makes the backward raise "CPU exact rowwise adagrad currently doesn't support embedding
    tables with more than 2B rows" on that rank only, while its peers wait in TorchRec's next
    all-to-all until the group's timeout; what follows the buffer depends on the process's heap, so
    the failure comes and goes from run to run (with upstream's ShardedTensor and with torch_shard's
    alike, and in FBGEMM alone: tests/test_torchrec.py shows it without TorchRec or a process group).
    Row-wise sharding gives a rank no rows of a table with fewer rows than ranks, so the scenarios'
    tables are sized for no rank to end a kernel with an empty table, and this checks that they do.
    It also puts ``_CANARY`` right after every kernel's buffer, so a read past its end fails on every
    run instead of by chance.
    """
    for name, kernel in _every_submodule(module):
        sizes = getattr(kernel, "hash_size_cumsum", None)
        if not isinstance(sizes, torch.Tensor) or sizes.device.type != "cpu" or getattr(kernel, "_canary", False):
            continue
        cumsum = sizes.tolist()
        rows = [end - begin for begin, end in zip(cumsum, cumsum[1:])]
        assert rows and rows[-1] > 0, (
            f"rank {RANK}: FBGEMM kernel {name} has tables of {rows} rows; its CPU kernels read past "
            "hash_size_cumsum when the last table has no rows (see _guard_fbgemm_kernels)"
        )
        backing = torch.tensor(cumsum + [_CANARY], dtype=sizes.dtype)
        kernel.hash_size_cumsum = backing[: len(cumsum)]
        kernel._canary = True


def _weights(dmp) -> dict:
    """Table name -> the ShardedTensor of its weight in ``dmp``'s state_dict."""
    return {key.split(".")[-2]: value for key, value in dmp.state_dict().items() if isinstance(value, ShardedTensor)}


def _copy_into(dmp, reference: Model) -> None:
    """Give ``dmp`` the reference model's weights (each rank fills its own shards)."""
    with torch.no_grad():
        scales = [p for name, p in dmp.named_parameters() if name.endswith("scale")]
        assert len(scales) == 1, [name for name, _ in dmp.named_parameters()]
        scales[0].copy_(reference.scale)
        for name, st in _weights(dmp).items():
            full = reference.ebc.embedding_bags[name].weight
            for shard in st.local_shards():
                shard.tensor.copy_(full[_box(shard.metadata)])


def _box(md) -> tuple:
    return tuple(slice(o, o + s) for o, s in zip(md.shard_offsets, md.shard_sizes))


def _gathered(st) -> torch.Tensor:
    """The whole of ``st`` on every rank."""
    out = torch.empty(st.size(), dtype=st.dtype) if RANK == 0 else None
    st.gather(0, out)
    out = out if out is not None else torch.empty(st.size(), dtype=st.dtype)
    dist.broadcast(out, 0)
    return out


def _assert_weights(dmp, reference: Model) -> None:
    for name, st in _weights(dmp).items():
        assert_close(_gathered(st), reference.ebc.embedding_bags[name].weight.detach(), msg=lambda m, n=name: f"{n}: {m}")


def _batch(rank: int, step: int):
    """Rank ``rank``'s input of training step ``step`` (the same on every rank that asks)."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    batch = 3
    keys = [t.feature_names[0] for t in TABLES]
    lengths = torch.randint(0, 3, (len(keys) * batch,), generator=generator)
    values = [
        torch.randint(0, t.num_embeddings, (int(lengths[i * batch : (i + 1) * batch].sum()),), generator=generator)
        for i, t in enumerate(TABLES)
    ]
    return TR["KeyedJaggedTensor"].from_lengths_sync(keys=keys, values=torch.cat(values), lengths=lengths)


def _train_step(dmp, reference: Model, optimizer, step: int) -> None:
    """One step on both: ``dmp`` on this rank's batch (TorchRec sums the embedding gradients over the
    ranks), the reference on the whole global batch; the outputs must match before the step."""
    out = dmp(_batch(RANK, step))
    assert_close(out, reference(_batch(RANK, step)).detach())
    out.sum().backward()
    optimizer.zero_grad()
    sum(reference(_batch(r, step)).sum() for r in range(WORLD)).backward()
    optimizer.step()


ADAGRAD = {"lr": 0.5, "eps": 1e-8}


@scenario
def ebc_forward_backward_against_dense_reference():
    torch.manual_seed(0)
    reference = Model(torch.device("cpu"))
    optimizer = torch.optim.Adagrad(reference.ebc.parameters(), **ADAGRAD)
    dmp = _dmp("a", torch.optim.Adagrad, ADAGRAD)
    _copy_into(dmp, reference)
    for step in range(2):
        _train_step(dmp, reference, optimizer, step)
    _assert_weights(dmp, reference)
    STATE.update(dmp=dmp, reference=reference, optimizer=optimizer)


@scenario
def ebc_state_dict_types_and_values():
    dmp, reference = STATE["dmp"], STATE["reference"]
    from torch.distributed._shard.sharded_tensor import ShardedTensor as Aliased

    plan = _module_plan("a")
    weights = _weights(dmp)
    assert sorted(weights) == sorted(t.name for t in TABLES), sorted(weights)
    for name, st in weights.items():
        assert type(st) is ShardedTensor and Aliased is type(st), type(st)
        assert UPSTREAM or type(st).__module__.startswith("torch_shard."), type(st)
        assert st.size() == reference.ebc.embedding_bags[name].weight.size()
        # The layout is the plan's, shard for shard.
        expected = plan[name].sharding_spec.shards
        got = st.metadata().shards_metadata
        assert sorted(map(_key, got)) == sorted(map(_key, expected)), (name, got, expected)
        assert plan[name].compute_kernel == "fused", plan[name].compute_kernel
        for shard in st.local_shards():
            assert shard.metadata.placement.rank() == RANK
            assert_close(shard.tensor, reference.ebc.embedding_bags[name].weight.detach()[_box(shard.metadata)])
    # torch.save / torch.load, also with weights_only=True: this rank's shards and the layout survive.
    buffer = io.BytesIO()
    torch.save(dmp.state_dict(), buffer)
    # (upstream's ShardedTensor is not among the classes torch.load admits with weights_only=True)
    for weights_only in (False,) if UPSTREAM else (False, True):
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=weights_only)
        for key, st in dmp.state_dict().items():
            if isinstance(st, ShardedTensor):
                assert type(loaded[key]) is type(st)
                assert loaded[key].metadata() == st.metadata()
                assert_close([s.tensor for s in loaded[key].local_shards()], [s.tensor for s in st.local_shards()])
    # Optimizer state: the fused Adagrad's sums, as ShardedTensors, equal the reference's (each rank
    # lists only the tables it holds).
    optimizer = STATE["optimizer"]
    state = dmp.fused_optimizer.state_dict()["state"]
    assert state, "no optimizer state"
    for key, per_param in state.items():
        name = key.split(".")[-2]
        expected = optimizer.state[reference.ebc.embedding_bags[name].weight]["sum"]
        for st in per_param.values():
            assert type(st) is ShardedTensor, type(st)
            for shard in st.local_shards():
                assert_close(shard.tensor, expected[_box(shard.metadata)])


def _key(md) -> tuple:
    return (tuple(md.shard_offsets), tuple(md.shard_sizes), str(md.placement))


@scenario
def ebc_dcp_save_and_load_into_another_plan_with_optimizer_state():
    dmp, reference, optimizer = STATE["dmp"], STATE["reference"], STATE["optimizer"]
    path = STATE["checkpoint_dir"]
    dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id=path)
    other = _dmp("b", torch.optim.Adagrad, ADAGRAD)
    assert sorted(map(_key, _weights(other)["t_tw"].metadata().shards_metadata)) != sorted(
        map(_key, _weights(dmp)["t_tw"].metadata().shards_metadata)
    )
    target = {"model": other.state_dict(), "optim": other.fused_optimizer.state_dict()}
    dcp.load(target, checkpoint_id=path)
    other.fused_optimizer.load_state_dict(target["optim"])
    _assert_weights(other, reference)
    for key, per_param in other.fused_optimizer.state_dict()["state"].items():
        expected = optimizer.state[reference.ebc.embedding_bags[key.split(".")[-2]].weight]["sum"]
        for st in per_param.values():
            for shard in st.local_shards():
                assert_close(shard.tensor, expected[_box(shard.metadata)])
    # Training goes on from the loaded weights and optimizer state exactly as the reference does.
    _train_step(other, reference, optimizer, 2)
    _assert_weights(other, reference)


def _train_alike(models: list, step: int) -> None:
    """One forward and backward of each of ``models`` on this rank's batch of ``step``; their outputs
    must match."""
    outs = [model(_batch(RANK, step)) for model in models]
    for out in outs[1:]:
        assert_close(out, outs[0])
    for out in outs:
        out.sum().backward()


@scenario
def ebc_rowwise_adagrad_checkpoint_into_a_trained_second_model():
    # TorchRec's EXACT_ROWWISE_ADAGRAD kernels: a model trains, is saved with its optimizer state, and
    # is loaded into a second model of another plan that has already trained a step of its own. (Plan
    # "c", not "b": a row-wise optimizer keeps one sum per row of each column shard, so its state
    # cannot move between column-wise and row-wise layouts.)
    from torchrec.optim import RowWiseAdagrad

    options = {"lr": 0.5, "eps": 1e-8}
    torch.manual_seed(3)
    reference = Model(torch.device("cpu"))
    first = _dmp("a", RowWiseAdagrad, options)
    _copy_into(first, reference)
    _train_alike([first], 0)
    _train_alike([first], 1)
    state = {"model": first.state_dict(), "optim": first.fused_optimizer.state_dict()}
    path = STATE["checkpoint_dir"] + "_rowwise"
    dcp.save(state, checkpoint_id=path)
    second = _dmp("c", RowWiseAdagrad, options)
    _train_alike([second], 2)
    target = {"model": second.state_dict(), "optim": second.fused_optimizer.state_dict()}
    dcp.load(target, checkpoint_id=path)
    second.fused_optimizer.load_state_dict(target["optim"])
    for name, st in _weights(second).items():
        assert_close(_gathered(st), _gathered(_weights(first)[name]), msg=lambda m, n=name: f"{n}: {m}")
    # From the same weights and row-wise sums, the same step leaves the same weights.
    _train_alike([first, second], 3)
    for name, st in _weights(second).items():
        assert_close(_gathered(st), _gathered(_weights(first)[name]), msg=lambda m, n=name: f"{n}: {m}")


@scenario
def ebc_dynamic_resharding():
    torch.manual_seed(1)
    reference = Model(torch.device("cpu"))
    optimizer = torch.optim.Adagrad(reference.ebc.parameters(), **ADAGRAD)
    dmp = _dmp("a", torch.optim.Adagrad, ADAGRAD)
    _copy_into(dmp, reference)
    _train_step(dmp, reference, optimizer, 0)  # so there is optimizer state to move
    old, new = _module_plan("a"), _module_plan("c")
    volume, delta = TR["output_sharding_plan_delta_single"](old, new)
    assert sorted(delta) == ["t_cw", "t_tw"], sorted(delta)
    before = _weights(dmp)
    # For the tables that stay, TorchRec assigns each new local shard the old shard's (equal) metadata.
    dmp.reshard(sharded_module_fqn="ebc", changed_shard_to_params={"ebc": (volume, delta)})
    _guard_fbgemm_kernels(dmp)  # resharding builds new kernels
    after = _weights(dmp)
    for name, st in after.items():
        assert sorted(map(_key, st.metadata().shards_metadata)) == sorted(map(_key, new[name].sharding_spec.shards))
    assert before["t_tw"].metadata() != after["t_tw"].metadata()
    _assert_weights(dmp, reference)
    # The moved tables took their Adagrad state along: the next step matches the reference.
    _train_step(dmp, reference, optimizer, 1)
    _assert_weights(dmp, reference)


@scenario
def embedding_collection_state_dict_and_forward():
    # EmbeddingCollection builds its ShardedTensors with init_from_local_shards (one exchange per
    # table), unlike EmbeddingBagCollection's no-communication path.
    config = TR["EmbeddingConfig"]
    tables = [
        config(name="e_rw", embedding_dim=8, num_embeddings=6, feature_names=["g_rw"]),
        config(name="e_rw2", embedding_dim=8, num_embeddings=10, feature_names=["g_rw2"]),
        config(name="e_tw", embedding_dim=8, num_embeddings=5, feature_names=["g_tw"]),
        config(name="e_cw", embedding_dim=8, num_embeddings=3, feature_names=["g_cw"]),
    ]
    torch.manual_seed(2)
    reference = TR["EmbeddingCollection"](tables=tables, device=torch.device("cpu"))
    model = TR["EmbeddingCollection"](tables=tables, device=torch.device("meta"))
    TR["apply_optimizer_in_backward"](torch.optim.SGD, model.parameters(), {"lr": 0.1})
    plan = TR["construct_module_sharding_plan"](
        model,
        {"e_rw": TR["row_wise"](), "e_rw2": TR["row_wise"](), "e_tw": TR["table_wise"](rank=1), "e_cw": TR["column_wise"](ranks=[2, 3])},
        local_size=2,
        world_size=WORLD,
        device_type="cpu",
    )
    env = TR["ShardingEnv"].from_process_group(dist.group.WORLD)
    dmp = TR["DistributedModelParallel"](model, env=env, device=torch.device("cpu"), plan=TR["ShardingPlan"]({"": plan}))
    _guard_fbgemm_kernels(dmp)
    state = {key.split(".")[-2]: st for key, st in dmp.state_dict().items()}
    with torch.no_grad():
        for name, st in state.items():
            assert type(st) is ShardedTensor, type(st)
            assert sorted(map(_key, st.metadata().shards_metadata)) == sorted(map(_key, plan[name].sharding_spec.shards))
            for shard in st.local_shards():
                shard.tensor.copy_(reference.embeddings[name].weight[_box(shard.metadata)])
    for name, st in state.items():
        assert_close(_gathered(st), reference.embeddings[name].weight.detach())
    generator = torch.Generator().manual_seed(RANK)
    keys = [t.feature_names[0] for t in tables]
    lengths = torch.randint(1, 3, (len(keys) * 2,), generator=generator)
    values = torch.cat(
        [torch.randint(0, t.num_embeddings, (int(lengths[2 * i : 2 * i + 2].sum()),), generator=generator) for i, t in enumerate(tables)]
    )
    kjt = TR["KeyedJaggedTensor"].from_lengths_sync(keys=keys, values=values, lengths=lengths)
    out, expected = dmp(kjt), reference(kjt)
    for key in keys:
        assert_close(out[key].values(), expected[key].values().detach())


def _run(results_dir: str) -> int:
    global RANK, WORLD, TABLES
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    TR["torchrec"].distributed.comm_ops.set_gradient_division(False)
    TABLES = _tables()
    STATE["checkpoint_dir"] = os.path.join(results_dir, "checkpoint")
    outcomes: dict = {}
    path = os.path.join(results_dir, f"rank{RANK}.json")
    failed = None
    for name, fn in SCENARIOS.items():
        if failed is not None:
            outcomes[name] = {"status": "not run", "detail": f"not run: scenario {failed} failed before it"}
            continue
        try:
            fn()
            outcome = {"status": "ok", "detail": ""}
        except Exception:  # noqa: BLE001 - every failure is reported to the test process
            outcome = {"status": "error", "detail": traceback.format_exc()}
        outcomes[name] = outcome
        with open(path, "w") as f:
            json.dump(outcomes, f)
        verdicts = [None] * WORLD
        dist.all_gather_object(verdicts, outcome["status"])
        if any(v != "ok" for v in verdicts):
            failed = name
    with open(path, "w") as f:
        json.dump(outcomes, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_run(sys.argv[1]))
