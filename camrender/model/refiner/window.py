"""The refiner's sliding-window KV cache as one preallocated buffer per layer: [sink | history | current].

diffusers' `SanaWMRefinerKVCache` keeps each layer's sink (pre-RoPE K, V) and history (post-RoPE K, V) as
separate tensors, and its attention processor re-RoPEs the sink and concatenates [sink, history,
current] K and V on every pass: 2 fresh copies of the whole window per layer and pass. `WindowKVCache`
instead holds, per layer, a key and a value buffer (B, capacity, C) that the attention reads as one
prefix: the fused processor (`camrender.model.refiner.attention`) writes the pass's K/V straight into the
current slot and ropes the sink's keys into the sink slot once per block (when `sink_pe` is set), so
a pass copies nothing. After a block's cache pass `commit` keeps the last `max_history` frames:
the history slides down in place, without a temporary (the same order as the stock concatenation and trim).

Memory: per layer (sink + history + block) frames of K and V, the block's 3 frames above diffusers' cache,
which holds sink + history and concatenates the whole window into fresh tensors on every pass (one
layer at a time). At the release shape that is 3 x 880 tokens x 4096 x 2 (K, V) x 2 bytes x 48 layers
= 2.1 GB: the price of passes that copy nothing. `--refiner-window` shrinks both.

Layout of a layer's buffers (tokens, S = sink, H = history now held, n = this pass's block):

    key:   [ RoPE(sink_k_pre) at sink_pe | history (post-RoPE) | current (post-RoPE) | unused ]
    value: [ sink V                      | history             | current             | unused ]
             0 .. S                        S .. S+H              S+H .. S+H+n

The history views (`history_k`, `history_v`) keep their storage once the window is full.
"""
from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache, SanaWMRefinerKVLayerCache


class WindowLayerCache(SanaWMRefinerKVLayerCache):
    """One layer's window buffers (see the module docstring); the stock accessors return views of them."""

    def __init__(self, history_frames: int, block_frames: int, sink_frames: int):
        self.history_frames, self.block_frames, self.sink_frames = history_frames, block_frames, sink_frames
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
        capacity = tokens + (self.history_frames + self.block_frames) * per_frame
        self.key = torch.empty(batch, capacity, channels, device=sink_k_pre.device, dtype=sink_k_pre.dtype)
        self.value = torch.empty_like(self.key)
        self.value[:, :tokens].copy_(sink_v)
        self.sink_k_pre = sink_k_pre
        self.sink_tokens, self.history_tokens, self.sink_stale = tokens, 0, True

    def store_history(self, history_k, history_v) -> None:
        raise NotImplementedError("a WindowLayerCache's history is written by the attention and `commit`")

    def place(self, tokens: int) -> tuple[int, int]:
        """The current block's slot [start, end) for `tokens` query tokens."""
        if self.key is None:
            raise RuntimeError("the window has no sink yet: run a 'capture_pre_rope' pass and store_sink first")
        start = self.sink_tokens + self.history_tokens
        if start + tokens > self.key.shape[1]:
            raise ValueError(f"a block of {tokens} tokens does not fit the window ({self.key.shape[1] - start} free)")
        return start, start + tokens

    def commit(self, frames: int) -> None:
        """After a cache pass on a block of `frames` frames (in the current slot): history <- the last
        `history_frames` frames of [history, block]."""
        per_frame = self.sink_tokens // self.sink_frames
        total = self.history_tokens + frames * per_frame
        keep = min(total, self.history_frames * per_frame)
        drop = total - keep
        if drop:
            s = self.sink_tokens
            # Slide down in place, in pieces of at most `drop` tokens from the front: a piece's source and
            # destination never overlap, and a piece writes only below every source still to be read (no
            # temporary of the whole history).
            for buffer in (self.key, self.value):
                for start in range(0, keep, drop):
                    stop = min(start + drop, keep)
                    buffer[:, s + start:s + stop].copy_(buffer[:, s + drop + start:s + drop + stop])
        self.history_tokens = keep

    def clear(self) -> None:
        self.key = self.value = self.sink_k_pre = None
        self.sink_tokens = self.history_tokens = 0
        self.sink_stale = True
        self.captured_k_pre = self.captured_v_pre = self.captured_k_post = self.captured_v_post = None


class WindowKVCache(SanaWMRefinerKVCache):
    """`SanaWMRefinerKVCache` with `WindowLayerCache` layers; setting `sink_pe` (once per block) marks
    every layer's roped sink stale, so the first pass of the block re-ropes it."""

    def __init__(self, num_layers: int, *, history_frames: int, block_frames: int, sink_frames: int):
        if history_frames <= 0:
            raise ValueError("a window cache needs a bounded history (history_frames > 0)")
        self.layer_caches = [WindowLayerCache(history_frames, block_frames, sink_frames) for _ in range(num_layers)]
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
