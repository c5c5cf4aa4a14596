"""FSDP2 (``train.fsdp``): the optimizer state, and the weights and gradients it steps on, sharded
over the ranks; the weights gathered whole for the passes (``true``), or each decoder layer only
for its own forward and backward (``"layers"``, the layer mode).

``fully_shard`` (PyTorch's FSDP2) shards each decoder layer and the root (embeddings, final norm,
output layer; a tied output layer is the embedding, one parameter) over the ranks: every parameter
becomes a ``DTensor`` holding 1/N of it, and AdamW's two moments are built on those shards: each
rank keeps 1/N of the optimizer state (AdamW's 8 bytes a float32 parameter). The model is made the
root of every unit explicitly (the trainers call its body and output layer apart, bypassing the
forward that would), so the root unit's gradients are reduced with the rest.

``true``: the trainers' passes stay those of the data-parallel run (``distributed.py``): the body
and the output layer called apart, a shared prefix backpropagated after the rows, a different
number of micro-batches on each rank, and RL's local sampler generating each rank's own groups.
FSDP's hooks are made to do no collective (no resharding after forward or backward, no gradient
reduction in ``backward``) and the whole model is gathered explicitly (``gather``, one all-gather
per unit, the same on every rank) before the passes. After the last backward, ``sum_gradients``
sums the full gradients over the ranks in one all-reduce (the data-parallel sum, not FSDP's
average), keeps this rank's shard of each, and reshards; clipping (``clip_gradients``, a norm over
the shards) and the optimizer step run on the shards; ``gather`` then puts the updated weights
back whole. It saves the optimizer state, not the weights' memory.

``"layers"``: FSDP's own hooks gather each layer for its forward, free it after, gather it again
for its backward and reduce-scatter its gradients into the shards, a *sum* (the divide factor set
to 1: global-batch normalisation needs the sum, FSDP averages by default). Every pass of a layer
is then a collective, so every rank must run as many: the ranks agree on the most micro-batches
first (``most``, one all-reduce) and a rank with fewer runs zero-weight passes (``pad``) that
reduce the same gradients. The root unit (embeddings, final norm, output layer) stays whole
through the passes (its hooks never run: the trainers call the body and the head apart); its
gradients are reduce-scattered by the root's end-of-backward callback after every backward. RL's
local sampler generates each rank's own groups, a number of forwards of its own: with
``sampling`` the layers are gathered whole between updates (``gather``: the full weights on every
rank while it samples) and resharded for the passes (``begin``); with a remote sampler they stay
sharded between updates too. A shared prefix's late backward reaches layers already resharded, so
the layer mode refuses ``share_prefix`` (``sft_config``).
Gradient checkpointing recomputes a layer inside the gather its backward made (tested in SFT).

A checkpoint is full state (``full_state``): the whole model and the whole optimizer state, in
the format of a run without FSDP, so it loads at any world size, with or without FSDP
(``shard_optimizer_state`` shards a loaded one). A remote sampler is sent the same whole weights
at each push (``full_weights``: every rank takes part in the gather, rank 0 writes them). N ranks
take the one-process step to float rounding in both modes. With one process there is nothing to
shard over: ``shard`` leaves the model as it is. What each mode costs and saves, measured:
``docs/scaling.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from palaestra.train.config import ConfigError
from palaestra.train.distributed import World, _collective, sync_gradients


class Shards:
    """The model sharded with ``fully_shard`` over ``world``'s ranks: gathered whole (``layers``
    false), or each decoder layer whole only during its own passes (``layers``; ``sampling``: the
    layers gathered whole between updates, for RL's local sampler)."""

    def __init__(
        self, model: Any, world: World, device: Any, layers: bool = False, sampling: bool = False
    ) -> None:
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        decoder_layers = getattr(model.get_decoder(), "layers", None)
        if not isinstance(decoder_layers, torch.nn.ModuleList):
            raise ConfigError(f"train.fsdp: {type(model).__name__} has no list of decoder layers to shard")
        mesh = init_device_mesh(device.type, (world.size,))
        for layer in decoder_layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=layers)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)  # the rest: embeddings, norm, head
        self.model, self.world, self.layers, self.sampling = model, world, layers, sampling
        self.units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        self.layer_units = [m for m in self.units if m is not model]
        self.params = [p for p in model.parameters() if p.requires_grad]  # the shards: the optimizer's
        # the model the root of every unit, as its own forward (which the trainers bypass) would make it:
        # else each layer's first forward makes that layer a root of its own, and the root unit's
        # gradients are never reduced (PyTorch's private hook, for want of a public one)
        model._get_fsdp_state()._lazy_init()
        if layers:  # each backward reduce-scatters every unit's gradients: summed, not averaged
            for unit in self.units:
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)
            model.set_reshard_after_backward(False, recurse=False)  # the root stays whole through the passes
        else:
            model.set_requires_gradient_sync(False)  # no reduce-scatter in backward: ``sum_gradients`` sums
            model.set_reshard_after_backward(False)
        self.gather()

    def shard_state(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """A checkpoint's trainer state with its (full) optimizer state cut to this rank's shards."""
        if state is None:
            return None
        return {**state, "optimizer": shard_optimizer_state(state["optimizer"], self.params)}

    def gather(self) -> None:
        """The weights as the passes and the sampler read them: every unit whole; in the layer mode
        the root whole (the trainers call the body and the output layer apart, around its hooks), and
        the layers whole only with ``sampling``, their hooks then set to keep them so."""
        with _collective():
            self.model.unshard()  # a no-op for a unit already whole
            if not self.layers or self.sampling:
                for unit in self.layer_units:
                    unit.set_reshard_after_forward(False, recurse=False)  # kept whole by their hooks
                    unit.unshard()

    def begin(self) -> None:
        """Before an update's passes: in the layer mode, each layer resharded, gathered by its own
        hooks for its forward and its backward (every rank must run as many: ``pad``)."""
        if self.layers and self.sampling:
            for unit in self.layer_units:
                unit.set_reshard_after_forward(True, recurse=False)
                unit.reshard()

    def most(self, passes: int) -> int:
        """The most forward and backward passes any rank runs (``passes``: this rank's), to be agreed
        before any runs: in the layer mode every pass gathers every layer, a collective."""
        return int(self.world.max(passes)) if self.layers else passes

    def pad(self, backbone: Any, head: Any, device: Any, pad_id: int, count: int) -> None:
        """``count`` zero-weight forward and backward passes (the layer mode's rank with fewer passes
        than ``most``). The output layer takes part, so every rank reduces the same gradients."""
        import torch

        for _ in range(count):
            hidden = backbone(input_ids=torch.full((1, 2), pad_id, device=device), use_cache=False)
            (head(hidden.last_hidden_state).float().sum() * 0.0).backward()

    def sum_gradients(self) -> None:
        """The full gradients summed over the ranks, each rank keeping its shards' as the sharded
        parameters' gradients; the model is resharded for the optimizer step. In the layer mode each
        backward has reduce-scattered them (a sum) already: the root is resharded."""
        from torch.distributed.tensor import distribute_tensor

        if self.layers:
            self.model.reshard()
            return
        whole = list(self.model.named_parameters())  # the gathered weights, with this rank's gradients
        trained = [(name, p) for name, p in whole if p.requires_grad]
        sync_gradients([p for _, p in trained], self.world)
        summed = {name: p.grad for name, p in trained}
        for _, p in trained:
            p.grad = None  # their storage is freed by the reshard; the gradients must not stay behind
        for unit in self.units:
            unit.reshard()
        for name, p in self.model.named_parameters():  # now the sharded ones, by the same names
            if name in summed:
                p.grad = distribute_tensor(summed.pop(name), p.device_mesh, p.placements, src_data_rank=None)

    def full_weights(self) -> dict[str, Any]:
        """The whole model's state dict, on the CPU of rank 0 (empty on the others): a collective,
        which every rank calls at the same point (for a checkpoint, or a remote sampler's push). A
        tied output layer is a key of its own, with storage of its own."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        with _collective():
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            weights = get_model_state_dict(self.model, options=options)
        self.gather()  # the state dict's hooks resharded the model
        return weights

    def full_state(self, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The whole model's state dict (``full_weights``: on rank 0; empty on the others) and the
        whole optimizer state (``optimizer.state_dict()``'s format with full tensors), on the CPU: a
        collective."""
        from torch.distributed.tensor import DTensor

        weights = self.full_weights()
        with _collective():
            state = optimizer.state_dict()
            state["state"] = {
                index: {k: v.full_tensor().cpu() if isinstance(v, DTensor) else v for k, v in values.items()}
                for index, values in state["state"].items()
            }
        return weights, state


def shard_optimizer_state(state: dict[str, Any], params: list[Any]) -> dict[str, Any]:
    """A full optimizer state (a checkpoint's) with each tensor of a sharded parameter's shape cut to
    this rank's shard, for ``optimizer.load_state_dict``; ``params`` in the optimizer's order."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    def local(value: Any, param: Any) -> Any:
        if isinstance(param, DTensor) and hasattr(value, "shape") and value.shape == param.shape:
            return distribute_tensor(
                value.to(param.device), param.device_mesh, param.placements, src_data_rank=None
            )
        return value

    out = dict(state)
    out["state"] = {
        index: {k: local(v, params[index]) if index < len(params) else v for k, v in values.items()}
        for index, values in state["state"].items()
    }
    return out


def clip_gradients(params: Iterable[Any], max_norm: float) -> float:
    """``clip_grad_norm_`` of plain or sharded gradients; the total norm (of the whole gradient)."""
    import torch
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


LAYERS = "layers"  # ``train.fsdp = "layers"``: each decoder layer whole only during its own passes


def shard(model: Any, world: World, device: Any, mode: bool | str, sampling: bool = False) -> Shards | None:
    """``model`` sharded over the ranks when ``train.fsdp`` asks and there are several (one process
    has nothing to shard over: FSDP is off there, and its checkpoints are the same); ``sampling``:
    a local sampler generates with the model between updates (the layer mode gathers it whole)."""
    if not mode or world.size == 1:
        return None
    return Shards(model, world, device, layers=mode == LAYERS, sampling=sampling)


def processes(world: World, mode: bool | str) -> str:
    """The end of a run's description: on how many processes, sharded or not."""
    if world.size == 1:
        return " (train.fsdp: off in one process, nothing to shard over)" if mode else ""
    what = {
        True: " (FSDP: optimizer state sharded)",
        LAYERS: " (FSDP: weights sharded, gathered layer by layer)",
    }
    return f" on {world.size} processes{what.get(mode, '')}"


def sum_gradients(params: list[Any], world: World, shards: Shards | None) -> None:
    """The one-process gradient on every rank: summed whole (data-parallel), or into each rank's
    shards (FSDP)."""
    if shards is None:
        sync_gradients(params, world)
    else:
        shards.sum_gradients()
