"""Part of a model's blocks in page-locked CPU memory, each visiting the GPU for its own forward.

A DiT runs its blocks in one order on every pass. `stream_blocks(blocks, count, device)` keeps `count`
of them, spread evenly over the list, in page-locked CPU memory and moves the others to `device`.
Two staging slots on `device` (each the size of one block) take the streamed blocks in turn: while a
streamed block runs from one slot, the next streamed block is copied into the other on a side CUDA
stream, behind the resident blocks between them. The GPU then holds n - count + 2 blocks' weights
instead of n, and a pass loses no time as long as copying `count` blocks (over PCIe) takes less time
than the pass computes.

    streamer = stream_blocks(transformer.transformer_blocks, 12, "cuda")   # 12 of 48 blocks streamed
    ...                                                                     # forwards as before
    streamer.remove()                                                       # all on "cuda" again

The blocks' own modules and forwards run unchanged: a forward pre-hook points the block's parameters
and buffers at its slot (waiting for its copy), a forward hook (run also when the forward raises) points
them back at the CPU copies, so `state_dict()` sees the real weights, and queues the copy of the
streamed block two places ahead into the slot just freed (which waits for the block's kernels). A block
that runs out of the expected order is copied in when it runs: slower, never wrong; `load_state_dict`
on a streamed block empties the slots, so the new weights are the ones copied next. Every streamed block
must hold the same tensor shapes and dtypes (a DiT's blocks do). For inference only (the weights are
swapped under autograd's feet), and the streamer places the list: `remove()` it before `.to()`. Off CUDA
the copies are synchronous (tests).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

SLOTS = 2
_ATTRIBUTE = "_camrender_block_streamer"


def streamed_indices(blocks: int, count: int) -> list:
    """`count` of `blocks` block indices, spread evenly (the middle of each of `count` equal runs)."""
    if not 1 <= count <= blocks:
        raise ValueError(f"can stream 1 to {blocks} blocks, got {count}")
    return sorted({int((i + 0.5) * blocks / count) for i in range(count)})


def block_streamer(blocks) -> Optional["BlockStreamer"]:
    """The `BlockStreamer` managing `blocks` (a ModuleList), or None."""
    return getattr(blocks, _ATTRIBUTE, None)


def stream_blocks(blocks, count: int, device) -> "BlockStreamer":
    """Stream `count` of `blocks` (a `torch.nn.ModuleList`) through two slots on `device` (module docstring);
    the other blocks are moved to `device`. Streaming the same list again with the same count is a no-op."""
    current = block_streamer(blocks)
    if current is not None:
        if len(current.streamed) == count and current.device == torch.device(device):
            return current
        current.remove()
    return BlockStreamer(blocks, streamed_indices(len(blocks), count), device)


def _tensor_places(block) -> list:
    """(module, name, is_parameter) of every parameter and buffer of `block`, in a fixed order."""
    slots = []
    for module in block.modules():
        slots += [(module, name, True) for name, value in module._parameters.items() if value is not None]
        slots += [(module, name, False) for name, value in module._buffers.items() if value is not None]
    return slots


def _get(module, name, is_parameter) -> torch.Tensor:
    return (module._parameters if is_parameter else module._buffers)[name]


def _set(module, name, is_parameter, tensor) -> None:
    if is_parameter:
        module._parameters[name].data = tensor
    else:
        module._buffers[name] = tensor


class BlockStreamer:
    """See the module docstring. Attributes: `streamed` (indices into the list), `device`, `slot_bytes`
    (bytes of one staging slot)."""

    def __init__(self, blocks, indices, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.blocks, self.streamed = blocks, list(indices)
        self.tensors = [_tensor_places(blocks[i]) for i in self.streamed]
        layout = [(tuple(_get(*t).shape), _get(*t).dtype) for t in self.tensors[0]]
        for index, tensors in zip(self.streamed, self.tensors):
            if [(tuple(_get(*t).shape), _get(*t).dtype) for t in tensors] != layout:
                raise ValueError(f"block {index} holds other tensors than block {self.streamed[0]}: "
                                 "only blocks of one layout can share the staging slots")
        streamed = set(self.streamed)
        for index, block in enumerate(blocks):
            if index not in streamed:
                block.to(self.device)
        self.host = []  # per streamed block, its tensors in CPU memory (page-locked for asynchronous copies)
        for tensors in self.tensors:
            copies = []
            for t in tensors:
                value = _get(*t).detach()
                copy = torch.empty(value.shape, dtype=value.dtype, pin_memory=self.cuda)
                copy.copy_(value)
                _set(*t, copy)
                copies.append(copy)
            self.host.append(copies)
        if self.cuda:
            torch.cuda.empty_cache()  # the streamed blocks' GPU memory, now unreferenced
        slots = min(SLOTS, len(self.streamed))
        self.slots = [[torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in layout]
                      for _ in range(slots)]
        self.slot_bytes = sum(t.numel() * t.element_size() for t in self.slots[0])
        self.owner = [None] * slots   # position in `streamed` of the block each slot holds (or is receiving)
        self.ready = [None] * slots   # CUDA event: the slot's copy is done
        self.free = [None] * slots    # CUDA event: the kernels reading the slot are done
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        if self.cuda:
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        self.running = None
        self.handles = []
        for position, index in enumerate(self.streamed):
            block = blocks[index]
            self.handles.append(block.register_forward_pre_hook(functools.partial(self._before, position)))
            self.handles.append(block.register_forward_hook(functools.partial(self._after, position), always_call=True))
            self.handles.append(block.register_load_state_dict_post_hook(self._forget_slots))
        for slot in range(slots):
            self._load(slot, slot)
        setattr(blocks, _ATTRIBUTE, self)

    def _load(self, position: int, slot: int) -> None:
        """Copy streamed block `position` into `slot` once the slot's readers are done."""
        sources = self.host[position]
        if self.cuda:
            with torch.cuda.stream(self.copy_stream):
                if self.free[slot] is not None:
                    self.copy_stream.wait_event(self.free[slot])
                for target, source in zip(self.slots[slot], sources):
                    target.copy_(source, non_blocking=True)
                self.ready[slot] = torch.cuda.Event()
                self.ready[slot].record(self.copy_stream)
        else:
            for target, source in zip(self.slots[slot], sources):
                target.copy_(source)
        self.owner[slot] = position

    def _before(self, position: int, module, args) -> None:
        if position in self.owner:
            slot = self.owner.index(position)
        else:  # out of the expected order: take the slot not holding the block that ran last
            slot = 0 if self.running is None else (self.running + 1) % len(self.slots)
            self._load(position, slot)
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])
        for t, tensor in zip(self.tensors[position], self.slots[slot]):
            _set(*t, tensor)
        self.running = slot

    def _after(self, position: int, module, args, output) -> None:
        slot = self.owner.index(position)
        for t, tensor in zip(self.tensors[position], self.host[position]):
            _set(*t, tensor)
        if self.cuda:
            self.free[slot] = torch.cuda.Event()
            self.free[slot].record(torch.cuda.current_stream(self.device))
        upcoming = (position + len(self.slots)) % len(self.streamed)
        if self.owner[slot] != upcoming:
            self._load(upcoming, slot)

    def _forget_slots(self, module, incompatible_keys) -> None:
        """New weights were loaded into a streamed block's CPU copies: no slot holds them yet."""
        self.owner = [None] * len(self.slots)

    def remove(self) -> None:
        """Undo: the streamed blocks' tensors back on `device`, the hooks and slots gone (idempotent)."""
        if block_streamer(self.blocks) is not self:
            return
        for handle in self.handles:
            handle.remove()
        if self.cuda:  # the slots are freed below: no copy into them or kernel reading them may still run
            torch.cuda.synchronize(self.device)
        for tensors, copies in zip(self.tensors, self.host):
            for t, copy in zip(tensors, copies):
                _set(*t, copy.to(self.device))
        self.slots, self.host = [], []
        delattr(self.blocks, _ATTRIBUTE)
