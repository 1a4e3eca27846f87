"""CUDA-graph replay of a denoising forward whose input layout repeats.

A render calls the transformer again and again on the same shapes: every step of full mode, and
every denoising step of a segment in segment mode. Launching its thousands of kernels from Python
costs CPU time that, for small calls (segment mode: B=1, 3 latent frames, about 2600 tokens) or
the many tiny kernels of the camera preparation, leaves the GPU waiting. `GraphedForward`
captures the forward once per input layout (the shapes and strides of every tensor among its
arguments) and replays it: each call copies its inputs into the graph's own (static) tensors,
replays, and returns a copy of the output. An input tensor that is the same object, unmodified,
as the one last copied into its slot is not copied again.

*Resident* arguments (`resident`: their positions) are not copied at all: the graph reads their
tensors where they are. Their addresses are part of the layout, so a resident tensor that moves to
new storage is a new layout (captured again), and one written in place between calls is read with
its new values. Segment mode passes its ~1 GB `SegmentCache` this way: the cache-writing pass
writes its tensors in place (`camrender.model.stage1.state.store`, `BlockCache.window`), so the cache
exists once, not once more as the graph's copy, and the steady-state segments keep replaying one graph.

The first call with a new layout runs eagerly (it compiles the Triton kernels and warms up the
libraries for those shapes); the second captures. A caller that has just run the forward itself on
that layout says so (`warmed`), and the first call captures. With `capture_new_layouts`, only the instance's
first layout runs eagerly, and a later one captures at its first call. That saves one eager pass per layout;
at the release size an eager pass costs the host about twice a replay's GPU time. A kernel the new layout needs for
the first time is compiled during the capture, such as the state-reading kernels of segment mode's second segment.
`bench/bench_segments.py --capture-first-sight` captured every layout of segment mode at first sight on an H200,
and no capture failed.

Only the latest layout's graph is kept, so the graphs add a constant to the memory allocated by a render. In segment
mode, segments 0, 1 and 2 (a growing softmax context) and a longer last segment each get their own capture, and
every other segment replays one graph. Captures do not wait for the GPU (`_capturing`), so they do not empty the
allocator's cache either: a dropped graph's memory, and what eager passes left cached, stay reserved by PyTorch's
allocator, unallocated. Outside a capture the allocator returns them to the driver itself before it would fail an
allocation; during a capture it does not, so a capture that runs out of memory empties the cache and is tried once
more. A capture that fails otherwise, or again, switches the instance to eager calls for good.

With `capture=False` the same static-copy path runs without a graph (CPU tests check the
bookkeeping: replaying on copies gives the eager result).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import weakref
from typing import Callable, Iterator, Optional

import torch


def _layout(tree, addresses: bool = False) -> tuple:
    """Hashable description of a tree of dataclasses / dicts / lists / tuples / tensors: the structure,
    tensor shapes, dtypes and strides (with `addresses`, their data pointers and devices too), and the
    non-numeric plain values. Numbers (a segment's first frame, the cache's next frame) only feed
    argument checks, never a kernel, so they are left out."""
    if isinstance(tree, torch.Tensor):
        where = (tree.device, tree.data_ptr()) if addresses else ()
        return ("tensor", tuple(tree.shape), tree.dtype, tuple(tree.stride())) + where
    if dataclasses.is_dataclass(tree):
        return (type(tree).__name__,) + tuple(_layout(getattr(tree, f.name), addresses)
                                              for f in dataclasses.fields(tree))
    if isinstance(tree, dict):
        return ("dict",) + tuple((key, _layout(value, addresses)) for key, value in tree.items())
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__,) + tuple(_layout(item, addresses) for item in tree)
    if isinstance(tree, (int, float)) and not isinstance(tree, bool):
        return ("number",)
    return ("value", tree)


def storage_layout(tree, addresses: bool = True) -> tuple:
    """The layout of `tree` (structure, tensor shapes, dtypes and strides) with, by default, its tensors'
    addresses: equal before and after a call that wrote the tree's tensors only in place (what a graph
    reading it as a resident argument needs)."""
    return _layout(tree, addresses=addresses)


def _clone(tree):
    """A copy of the tree with every tensor cloned; other leaves shared."""
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if dataclasses.is_dataclass(tree):
        return dataclasses.replace(tree, **{f.name: _clone(getattr(tree, f.name)) for f in dataclasses.fields(tree)
                                            if f.init})
    if isinstance(tree, dict):
        return {key: _clone(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_clone(item) for item in tree)
    return tree


def _with_tensors(tree, static):
    """`tree` (this call's plain values: numbers only feed argument checks) with the tensors of `static`."""
    if isinstance(tree, torch.Tensor):
        return static
    if dataclasses.is_dataclass(tree):
        return dataclasses.replace(tree, **{f.name: _with_tensors(getattr(tree, f.name), getattr(static, f.name))
                                            for f in dataclasses.fields(tree) if f.init})
    if isinstance(tree, dict):
        return {key: _with_tensors(value, static[key]) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_with_tensors(item, static_item) for item, static_item in zip(tree, static))
    return tree


def _copy_into(static, tree, copied: dict) -> None:
    """Copy every tensor of `tree` into the matching tensor of `static` (same layout), except those
    `copied` records as already there: copied maps id(static tensor) -> (weak reference to the
    source tensor, its version counter), updated here."""
    if isinstance(tree, torch.Tensor):
        if _unchanged(copied.get(id(static)), tree):
            return
        static.copy_(tree)
        copied[id(static)] = _stamp(tree)
    elif dataclasses.is_dataclass(tree):
        for f in dataclasses.fields(tree):
            _copy_into(getattr(static, f.name), getattr(tree, f.name), copied)
    elif isinstance(tree, dict):
        for key, value in tree.items():
            _copy_into(static[key], value, copied)
    elif isinstance(tree, (list, tuple)):
        for static_item, item in zip(static, tree):
            _copy_into(static_item, item, copied)


def _stamp(tensor):
    """(weak reference, version counter) of a tensor; the version is None where it is not tracked."""
    try:
        version = tensor._version
    except RuntimeError:  # inference-mode tensors keep no version counter: always copy them
        version = None
    return weakref.ref(tensor), version


def _unchanged(stamp, tensor) -> bool:
    """Whether `tensor` is the object `stamp` was taken of, not modified in place since."""
    if stamp is None or stamp[1] is None or stamp[0]() is not tensor:
        return False
    return _stamp(tensor)[1] == stamp[1]


@functools.lru_cache(maxsize=None)
def _capture_stream(device_index: int) -> "torch.cuda.Stream":
    """The side stream captures run on, one per GPU (a capture cannot run on the default stream)."""
    return torch.cuda.Stream(device=device_index)


@contextlib.contextmanager
def _capturing(graph: "torch.cuda.CUDAGraph", pool) -> Iterator[None]:
    """Capture the CUDA work queued inside the block into `graph` (into `pool`, a memory pool handle, or a pool of
    its own), as `torch.cuda.graph` does but without what it does first: synchronize the device and empty the
    allocator's caches (on the GPU and of page-locked memory). The GPU would then sit idle for the whole capture,
    the host running a forward's Python without launching anything (65-135 ms at the release size), and the next
    eager pass would allocate its memory from the driver again. Here the work queued before the capture keeps
    running while the host captures (what the cache keeps: the module docstring).

    Thread-local capture mode: a capture in a helper thread must not outlaw the render thread's wait for its frames
    (`camrender.render.stage_two._Beside`); nothing else queues work during a capture."""
    with torch.cuda.stream(_capture_stream(torch.cuda.current_device())):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            yield
        finally:
            graph.capture_end()


@dataclasses.dataclass
class _Replay:
    """A captured forward: its static inputs (None at the resident positions: never held here), the graph
    (None without capture) and its output."""

    inputs: tuple
    graph: Optional["torch.cuda.CUDAGraph"]
    output: torch.Tensor
    copied: dict = dataclasses.field(default_factory=dict)  # see _copy_into


class GraphedForward:
    """Runs `forward(*inputs)` through CUDA graphs, one per input layout (see the module docstring).

    Args:
        forward: the function to replay; it reads only its arguments (tensors inside dataclasses,
            dicts, lists and tuples are fine) and returns one tensor. Called as `forward(*inputs)`.
            It must not refer back to the object holding this instance (a bound method of it): the
            cycle would keep the static copies alive after their render until a garbage collection.
        capture: record CUDA graphs (needs CUDA); False replays on static copies without a graph.
        resident: positions of the arguments read in place, never copied (module docstring): between
            calls their tensors may change values in place, not storage (new storage recaptures).
        capture_new_layouts: a layout met after the first one captures at its first call (module docstring),
            instead of running eagerly first.
        share_pool_with: another instance whose graphs replay one after another with these on the same
            stream: a capture here goes into the memory pool of its live graph, if it has one (their temporaries
            then share memory), else into a pool of its own. (A pool handle outliving its last graph cannot
            be captured into again, so the pool is taken from a live graph, never kept.) Held as a weak
            reference, so two instances may name each other.
    """

    def __init__(self, forward: Callable[..., torch.Tensor], *, capture: bool = True, resident: tuple = (),
                 capture_new_layouts: bool = False, share_pool_with: Optional["GraphedForward"] = None):
        self.forward = forward
        self.capture = capture
        self.capture_new_layouts = capture_new_layouts
        self._share_pool_with = None
        self.share_pool_with = share_pool_with
        self.resident = frozenset(resident)
        self.enabled = True
        self._seen: set = set()
        self._layout: Optional[tuple] = None
        self._replay: Optional[_Replay] = None
        self.stats = {"eager": 0, "captures": 0, "replays": 0}

    @property
    def share_pool_with(self) -> Optional["GraphedForward"]:
        return None if self._share_pool_with is None else self._share_pool_with()

    @share_pool_with.setter
    def share_pool_with(self, other: Optional["GraphedForward"]) -> None:
        self._share_pool_with = None if other is None else weakref.ref(other)

    def __call__(self, *inputs) -> torch.Tensor:
        if not self.enabled:
            return self._eager(inputs)
        layout = self._layout_of(inputs)
        if layout != self._layout:
            if layout not in self._seen and not (self.capture_new_layouts and self._seen):  # warm up eagerly
                self._seen.add(layout)
                return self._eager(inputs)
            self._replay = None  # drop the previous graph before capturing (module docstring: its memory)
            try:
                self._replay = self._record_within_memory(inputs)
            except Exception as error:  # keep rendering without graphs rather than fail the render
                reason = (str(error).splitlines() or [""])[0]
                print(f"camrender: CUDA graph capture failed, running eagerly ({type(error).__name__}: {reason})",
                      file=sys.stderr)
                self.enabled, self._layout = False, None
                return self._eager(inputs)
            self._layout = layout
        _copy_into(self._replay.inputs, self._copied_part(inputs), self._replay.copied)
        if self._replay.graph is None:
            # the static tensors in this call's trees; the resident arguments are this call's own (the layout
            # matched: they are the captured tensors)
            static = _with_tensors(self._copied_part(inputs), self._replay.inputs)
            output = self.forward(*self._arguments(inputs, static))
        else:
            self._replay.graph.replay()
            output = self._replay.output
        self.stats["replays"] += 1
        return output.clone()

    def warmed(self, *inputs) -> None:
        """Say that `forward` has just run eagerly, outside this instance, on arguments of this layout (the
        same resident tensors): the next call with this layout captures at once, without a warm-up call."""
        self._seen.add(self._layout_of(inputs))

    def _layout_of(self, inputs) -> tuple:
        return tuple(_layout(arg, addresses=i in self.resident) for i, arg in enumerate(inputs))

    def _eager(self, inputs) -> torch.Tensor:
        self.stats["eager"] += 1
        return self.forward(*inputs)

    def _copied_part(self, inputs) -> tuple:
        """The arguments, None in place of the resident ones."""
        return tuple(None if i in self.resident else arg for i, arg in enumerate(inputs))

    def _arguments(self, inputs, static) -> tuple:
        """The forward's arguments: the static copies, and the resident arguments of `inputs` themselves."""
        return tuple(arg if i in self.resident else copy for i, (arg, copy) in enumerate(zip(inputs, static)))

    def _record_within_memory(self, inputs) -> _Replay:
        """`_record`, tried once more after emptying the allocator's cache if it runs out of memory (during a
        capture the allocator does not return its cached blocks to the driver itself)."""
        try:
            return self._record(inputs)
        except torch.cuda.OutOfMemoryError:
            pass  # leaving the handler drops the traceback, and with it the failed capture's graph and tensors
        torch.cuda.empty_cache()
        return self._record(inputs)

    def _record(self, inputs) -> _Replay:
        static = _clone(self._copied_part(inputs))
        if not self.capture:
            return _Replay(static, None, torch.empty(0))
        graph = torch.cuda.CUDAGraph()
        other = self.share_pool_with
        pool = other._replay.graph.pool() if other is not None and other._replay is not None \
            and other._replay.graph is not None else None
        with _capturing(graph, pool):
            output = self.forward(*self._arguments(inputs, static))
        self.stats["captures"] += 1
        return _Replay(static, graph, output)
