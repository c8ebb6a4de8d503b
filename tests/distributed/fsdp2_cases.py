"""Cases run on each rank by test_fsdp2.py: FSDP2 (``fully_shard``) with thunder-compiled blocks."""

from __future__ import annotations

import copy

import thunder
import torch
from torch.distributed.fsdp import fully_shard
from training import Blocks, batches, train

import thunderplug


def blocks(float8: bool = False) -> Blocks:
    model = Blocks()
    if float8:
        from torchao.float8 import convert_to_float8_training

        model = convert_to_float8_training(model)
    return model


def jit(module: torch.nn.Module) -> torch.nn.Module:
    return thunder.jit(module, executors=thunderplug.discover())


def shard(model: Blocks, *, compile_block=None, compile_after: bool = False) -> Blocks:
    """torchtitan's order: (compile each block,) fully_shard each block, fully_shard the root."""
    for i, layer in enumerate(model.layers):
        if compile_block is not None and not compile_after:
            layer = compile_block(layer)
        fully_shard(layer)
        if compile_block is not None and compile_after:
            layer = compile_block(layer)
        model.layers[i] = layer
    fully_shard(model)
    return model


def _compare(rank, float8, **how):
    """Eager FSDP2 against FSDP2 with thunder-compiled blocks; gradients of the sharded
    parameters (what the optimizer steps) as full tensors."""
    model = blocks(float8)
    data = batches(rank, 32, 32)
    eager = train(shard(copy.deepcopy(model)), data)
    compiled = train(shard(copy.deepcopy(model), compile_block=jit, **how), data)
    return {"eager": eager, "compiled": compiled}


def jit_then_fully_shard(rank, world_size):
    return _compare(rank, False)


def jit_then_fully_shard_float8(rank, world_size):
    return _compare(rank, True)


def fully_shard_then_jit_float8(rank, world_size):
    return _compare(rank, True, compile_after=True)


def activation_checkpointing_float8(rank, world_size):
    """torchtitan's order with activation checkpointing: ``checkpoint_wrapper(block)``, jit, ``fully_shard``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = blocks(float8=True)
    data = batches(rank, 32, 32)
    runs = {}
    for key, compile_block in (("eager", lambda block: block), ("compiled", jit)):
        sharded = shard(copy.deepcopy(model), compile_block=lambda block, c=compile_block: c(checkpoint_wrapper(block)))
        runs[key] = train(sharded, data)
    return runs


def _float8_all_gather(rank, precompute: bool, compile_after: bool = False):
    """torchao's float8 all-gather: weights cast to float8 before FSDP2 gathers them."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    model = convert_to_float8_training(Blocks(), config=config)
    data = batches(rank, 32, 32)
    runs = {}
    for key, compile_block in (("eager", None), ("compiled", jit)):
        sharded = shard(copy.deepcopy(model), compile_block=compile_block, compile_after=compile_after)
        after = (lambda m=sharded: precompute_float8_dynamic_scale_for_fsdp(m)) if precompute else (lambda: None)
        runs[key] = train(sharded, data, before_step=after)
    return runs


def float8_all_gather(rank, world_size):
    return _float8_all_gather(rank, precompute=False)


def float8_all_gather_precomputed_scales(rank, world_size):
    return _float8_all_gather(rank, precompute=True)


def fully_shard_then_jit_float8_all_gather(rank, world_size):
    return _float8_all_gather(rank, precompute=True, compile_after=True)


def _jit_of_sharded_model(rank, *, float8: bool = False, gather: bool = False, precompute: bool = False):
    """``fully_shard`` every block and the root, then jit the root: each block is a compiled region
    whose FSDP2 hooks run eagerly around it; the root's own code runs eagerly."""
    from thunderplug.caching.regions import compiled_regions

    model = Blocks()
    if float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig(enable_fsdp_float8_all_gather=gather)
        model = convert_to_float8_training(model, config=config)
    data = batches(rank, 32, 32)
    runs = {}
    for key, compile_root in (("eager", lambda m: m), ("compiled", jit)):
        root = shard(copy.deepcopy(model))
        compiled = compile_root(root)
        after = lambda: None  # noqa: E731
        if precompute:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            after = lambda m=root: precompute_float8_dynamic_scale_for_fsdp(m)  # noqa: E731
        runs[key] = train(compiled, data, before_step=after)
        if key == "compiled":
            runs["state_dict_keys"] = (sorted(compiled.state_dict()), sorted(root.state_dict()))
            runs["regions"] = sorted(compiled_regions(compiled))
            runs["scaled_mm"] = ["_scaled_mm" in str(trace) for trace in thunder.last_traces(compiled)]
            runs["tree_restored"] = all(type(layer) is type(root.layers[0]) for layer in root.layers)
    return runs


def jit_of_a_model_with_sharded_blocks(rank, world_size):
    return _jit_of_sharded_model(rank)


def jit_of_a_model_with_sharded_float8_blocks(rank, world_size):
    return _jit_of_sharded_model(rank, float8=True)


def jit_of_a_model_with_sharded_blocks_float8_all_gather(rank, world_size):
    return _jit_of_sharded_model(rank, float8=True, gather=True)


def jit_of_a_model_with_sharded_blocks_float8_all_gather_precomputed_scales(rank, world_size):
    return _jit_of_sharded_model(rank, float8=True, gather=True, precompute=True)


def stock_jit_of_a_model_with_sharded_blocks(rank, world_size):
    """Stock thunder.jit (no discover()) of the same program: what it does."""
    model = shard(blocks())
    x, target = batches(rank, 32, 32)[0]
    try:
        torch.nn.functional.mse_loss(thunder.jit(model)(x), target).backward()
    except Exception as error:  # noqa: BLE001 - the text is what the test records
        return f"{type(error).__name__}: {error}"
    return None


def jit_of_a_function_calling_a_sharded_model(rank, world_size):
    """A jitted *function* that calls a sharded model reaches the root's FSDP2 hook in the trace:
    refused by name, with what works."""
    model = shard(blocks())
    x = batches(rank, 32, 32)[0][0]
    try:
        thunder.jit(lambda inputs: model(inputs), executors=thunderplug.discover())(x)
    except NotImplementedError as error:
        return (type(error).__name__, str(error))
    return None


def blocks_share_one_compilation(rank, world_size):
    """Four float8 blocks, both orders: each block trains its own shards (against eager), and the
    blocks after the second (whose input, unlike the first's, requires grad) compile nothing."""
    model = convert_blocks(Blocks(depth=4))
    data = batches(rank, 32, 32)
    runs = {"eager": train(shard(copy.deepcopy(model)), data)}
    for order in ("jit_then_fully_shard", "fully_shard_then_jit"):
        jitted = []

        def compile_block(block, jitted=jitted):
            jitted.append(jit(block))
            return jitted[-1]

        after = order == "fully_shard_then_jit"
        sharded = shard(copy.deepcopy(model), compile_block=compile_block, compile_after=after)
        runs[order] = {**train(sharded, data), "misses": [thunder.cache_misses(j) for j in jitted]}
    return runs


def convert_blocks(model: Blocks) -> Blocks:
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(model)
