"""The refiner's sliding-window KV cache as one preallocated buffer per layer: [sink | history].

diffusers' `SanaWMRefinerKVCache` keeps each layer's sink (pre-RoPE K, V) and history (post-RoPE K, V) as
separate tensors, and its attention processor re-RoPEs the sink and concatenates [sink, history,
current] K and V on every pass: 2 fresh copies of the whole window per layer and pass. `WindowKVCache`
instead holds, per layer, a key and a value buffer (B, capacity, C) that the attention reads as one
prefix: the fused processor (`camrender.model.refiner.attention`) ropes the sink's keys into the sink slot
once per block (when `sink_pe` is set) and attends to [prefix ; the pass's own K/V] as two attention calls
merged by their log-sum-exp (`camrender.model.refiner.lse_attention`), so a pass copies nothing. The block's cache
pass then keeps the last `max_history` frames of [history, block] (`append`): the history slides down in
place, without a temporary, and the block's kept frames go after it (the order of the stock
concatenation and trim).

Memory: per layer (sink + history) frames of K and V, what diffusers' cache holds (which also concatenates
the whole window into fresh tensors on every pass, one layer at a time). `--refiner-window` shrinks it.

With `BLOCK_SLOT` (the default: faster on an H200) the buffers have a third slot for the
current block: the processor writes the pass's K/V into it and attends to the window in one call, and
`commit` slides the history after the cache pass. That slot costs the block's frames per layer: 3 x 880
tokens x 4096 x 2 (K, V) x 2 bytes x 48 layers = 2.1 GB at the release shape.

Layout of a layer's buffers (tokens, S = sink, H = history now held, n = this pass's block):

    key:   [ RoPE(sink_k_pre) at sink_pe | history (post-RoPE) | unused ] (| current | with BLOCK_SLOT)
    value: [ sink V                      | history             | unused ] (| current |)
             0 .. S                        S .. S+H

The history views (`history_k`, `history_v`) keep their storage once the window is full.
"""
from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache, SanaWMRefinerKVLayerCache


# True (renders' default): the window has a slot for the current block (one attention call per pass, 2.1 GB more
# at the release shape); False: sink + history only, the block attended to by a second call (module docstring).
# On an H200 the split layout rendered the FP8 refined pipeline at 23.5 video fps against 29.7 with the slot
# (bench/results/2026-12-01_refined_segments_fp8_split_window_h200.json), so the slot stays the default. Read when
# a `WindowKVCache` is built.
BLOCK_SLOT = True


class WindowLayerCache(SanaWMRefinerKVLayerCache):
    """One layer's window buffers (see the module docstring); the stock accessors return views of them.
    block_slot: the layout with the current block's slot (default `BLOCK_SLOT`)."""

    def __init__(self, history_frames: int, block_frames: int, sink_frames: int, block_slot=None):
        self.history_frames, self.block_frames, self.sink_frames = history_frames, block_frames, sink_frames
        self.block_slot = BLOCK_SLOT if block_slot is None else bool(block_slot)
        self.key = self.value = None  # (B, capacity, C)
        self.sink_k_pre = None  # (B, S, C) normalised, pre-RoPE sink keys
        self.sink_tokens = self.history_tokens = 0
        self.sink_stale = True  # the sink slot of `key` does not hold RoPE(sink_k_pre) at the current sink_pe
        self.captured_k_pre = self.captured_v_pre = self.captured_k_post = self.captured_v_post = None

    # -------------------------------------------------------------- the stock cache's fields, as views
    @property
    def sink_v(self):
        return None if self.value is None else self.value[:, :self.sink_tokens]

    @property
    def history_k(self):
        return None if self.key is None else self.key[:, self.sink_tokens:self.sink_tokens + self.history_tokens]

    @property
    def history_v(self):
        return None if self.value is None else self.value[:, self.sink_tokens:self.sink_tokens + self.history_tokens]

    def store_sink(self, sink_k_pre: torch.Tensor, sink_v: torch.Tensor) -> None:
        """Allocate the window for this sink's frame size and put the sink in it (once per stream)."""
        batch, tokens, channels = sink_k_pre.shape
        per_frame = tokens // self.sink_frames
        capacity = tokens + (self.history_frames + (self.block_frames if self.block_slot else 0)) * per_frame
        self.key = torch.empty(batch, capacity, channels, device=sink_k_pre.device, dtype=sink_k_pre.dtype)
        self.value = torch.empty_like(self.key)
        self.value[:, :tokens].copy_(sink_v)
        self.sink_k_pre = sink_k_pre
        self.sink_tokens, self.history_tokens, self.sink_stale = tokens, 0, True

    def store_history(self, history_k, history_v) -> None:
        raise NotImplementedError("a WindowLayerCache's history is written by the attention and `commit`")

    def prefix(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(key, value) views (B, S + H, C) of [sink | history], what a pass attends to before its own block."""
        if self.key is None:
            raise RuntimeError("the window has no sink yet: run a 'capture_pre_rope' pass and store_sink first")
        end = self.sink_tokens + self.history_tokens
        return self.key[:, :end], self.value[:, :end]

    def place(self, tokens: int) -> tuple[int, int]:
        """With the block slot: the current block's slot [start, end) for `tokens` query tokens."""
        if self.key is None:
            raise RuntimeError("the window has no sink yet: run a 'capture_pre_rope' pass and store_sink first")
        if not self.block_slot:
            raise RuntimeError("this window has no slot for the current block (BLOCK_SLOT was off when it was made)")
        start = self.sink_tokens + self.history_tokens
        if start + tokens > self.key.shape[1]:
            raise ValueError(f"a block of {tokens} tokens does not fit the window ({self.key.shape[1] - start} free)")
        return start, start + tokens

    def append(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """Without the block slot, after the cache pass's attention on a block (key, value (B, n, C), post-RoPE):
        history <- the last `history_frames` frames of [history, block]."""
        if self.block_slot:
            raise RuntimeError("a window with the block slot takes the block in its slot (`place`, `commit`)")
        tokens = key.shape[1]
        keep = min(self.history_tokens + tokens, self.history_frames * (self.sink_tokens // self.sink_frames))
        drop = self.history_tokens + tokens - keep
        old = max(self.history_tokens - drop, 0)  # history tokens that stay, slid down by `drop`
        self._slide_down(drop, old)
        start = self.sink_tokens + old
        self.key[:, start:self.sink_tokens + keep].copy_(key[:, tokens - (keep - old):])
        self.value[:, start:self.sink_tokens + keep].copy_(value[:, tokens - (keep - old):])
        self.history_tokens = keep

    def commit(self, frames: int) -> None:
        """After a cache pass on a block of `frames` frames: with the block slot (the block is in it), history <-
        the last `history_frames` frames of [history, block]; without, nothing (`append` did it in the pass)."""
        if not self.block_slot:
            return
        per_frame = self.sink_tokens // self.sink_frames
        total = self.history_tokens + frames * per_frame
        keep = min(total, self.history_frames * per_frame)
        self._slide_down(total - keep, keep)
        self.history_tokens = keep

    def _slide_down(self, drop: int, count: int) -> None:
        """Move the `count` tokens after the sink's first `drop` history tokens down by `drop`, in place."""
        if not drop or not count:
            return
        s = self.sink_tokens
        # In pieces of at most `drop` tokens from the front: a piece's source and destination never overlap, and
        # a piece writes only below every source still to be read (no temporary of the whole history).
        for buffer in (self.key, self.value):
            for start in range(0, count, drop):
                stop = min(start + drop, count)
                buffer[:, s + start:s + stop].copy_(buffer[:, s + drop + start:s + drop + stop])

    def clear(self) -> None:
        self.key = self.value = self.sink_k_pre = None
        self.sink_tokens = self.history_tokens = 0
        self.sink_stale = True
        self.captured_k_pre = self.captured_v_pre = self.captured_k_post = self.captured_v_post = None


class WindowKVCache(SanaWMRefinerKVCache):
    """`SanaWMRefinerKVCache` with `WindowLayerCache` layers (block_slot: their layout, default `BLOCK_SLOT`);
    setting `sink_pe` (once per block) marks every layer's roped sink stale, so the first pass of the block
    re-ropes it."""

    def __init__(self, num_layers: int, *, history_frames: int, block_frames: int, sink_frames: int,
                 block_slot=None):
        if history_frames <= 0:
            raise ValueError("a window cache needs a bounded history (history_frames > 0)")
        self.layer_caches = [WindowLayerCache(history_frames, block_frames, sink_frames, block_slot)
                             for _ in range(num_layers)]
        self._sink_pe = None

    @property
    def sink_pe(self):
        return self._sink_pe

    @sink_pe.setter
    def sink_pe(self, value):
        self._sink_pe = value
        for layer in self.layer_caches:
            layer.sink_stale = True

    def clear(self) -> None:
        for layer in self.layer_caches:
            layer.clear()
        self._sink_pe = None
