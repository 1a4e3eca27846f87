"""Save and load a tree of render state (dataclasses, lists, tuples, dicts, tensors, numbers, None)
as one safetensors file, atomically.

The tree is walked generically: every tensor becomes an entry of the file under its path in the
tree (e.g. ``blocks.3.sink.key``), everything else goes into a JSON skeleton stored in the file's
metadata. A dataclass is recorded by its import path and rebuilt with its fields, so fields added
to a cache class later are saved and restored without changes here. Only classes from camrender
modules are rebuilt (a checkpoint cannot make this process import anything else).

    save_tree(path, {"cache": segment_cache, "step": 3}, metadata={"settings": "..."})
    check_tree(path)                          # before the model loads: whole, every tensor as recorded
    tree, metadata = load_tree(path, device="cuda")

Every tensor node of the skeleton records its shape and dtype, and the metadata holds the fingerprint of the
file's layout (`LAYOUT_KEY`: sha256 of every tensor's name, dtype and shape): `check_tree` reads the file's
header alone (`camrender.render.safetensors_header`, no tensor data, no torch) and refuses a file cut short, a
missing or extra tensor, or one of another shape or dtype than the tree recorded.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from camrender.errors import CamrenderError
from camrender.files import atomic_path
from camrender.render.safetensors_header import layout_fingerprint, read_header

ALLOWED_MODULE_PREFIX = "camrender."
_SKELETON_KEY = "camrender.tree"
LAYOUT_KEY = "camrender.layout_sha256"


def _flatten(value, name: str, tensors: dict):
    """JSON skeleton of `value`; its tensors go into `tensors` under their dotted path."""
    if isinstance(value, torch.Tensor):
        # an owned, contiguous copy on the CPU: a view would save its whole base storage
        tensors[name] = value.detach().to("cpu").contiguous().clone()
        return {"tensor": name, "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {f.name: _flatten(getattr(value, f.name), f"{name}.{f.name}", tensors)
                  for f in dataclasses.fields(value)}
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    if isinstance(value, (list, tuple)):
        items = [_flatten(item, f"{name}.{i}", tensors) for i, item in enumerate(value)]
        return {"list": items} if isinstance(value, list) else {"tuple": items}
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(f"{name}: only str dict keys can be saved")
        return {"dict": {key: _flatten(item, f"{name}.{key}", tensors) for key, item in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    raise TypeError(f"{name}: cannot save a {type(value).__name__}")


def _dataclass(path: str):
    module_name, _, qualname = path.partition(":")
    if not module_name.startswith(ALLOWED_MODULE_PREFIX):
        raise ValueError(f"refusing to rebuild {path!r}: not a camrender class")
    try:
        cls = importlib.import_module(module_name)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):  # a class moved or renamed since the checkpoint was written
        raise ValueError(f"{path!r}: no such camrender class") from None
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{path!r} is not a dataclass")
    return cls


def _unflatten(node, tensors: dict, device):
    if not isinstance(node, dict):
        return node
    if "tensor" in node:
        return tensors[node["tensor"]].to(device)
    if "dataclass" in node:
        cls = _dataclass(node["dataclass"])
        fields = {key: _unflatten(item, tensors, device) for key, item in node["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        obj = cls(**{key: value for key, value in fields.items() if key in init})
        for key, value in fields.items():
            if key not in init:
                object.__setattr__(obj, key, value)
        return obj
    if "list" in node:
        return [_unflatten(item, tensors, device) for item in node["list"]]
    if "tuple" in node:
        return tuple(_unflatten(item, tensors, device) for item in node["tuple"])
    if "dict" in node:
        return {key: _unflatten(item, tensors, device) for key, item in node["dict"].items()}
    if "dtype" in node:
        return getattr(torch, node["dtype"])
    raise ValueError(f"unknown node {sorted(node)}")


def save_tree(path, tree, metadata: dict | None = None) -> int:
    """Write `tree` (and str -> str `metadata`) to `path` atomically: a temporary file in the same
    folder, flushed to disk, then renamed over `path`. Returns the bytes written."""
    tensors: dict = {}
    skeleton = _flatten(tree, "root", tensors)
    meta = dict(metadata or {})
    meta[_SKELETON_KEY] = json.dumps(skeleton)
    meta[LAYOUT_KEY] = layout_fingerprint({name: (str(t.dtype).removeprefix("torch."), list(t.shape))
                                           for name, t in tensors.items()})
    # flushed to disk before the rename makes it the checkpoint, after the renames it refers to
    try:
        with atomic_path(path, suffix=".safetensors", durable=True, chmod=False) as temp:
            save_file(tensors, temp, metadata=meta)
            check_tree(temp)  # whole (a full disk can leave a short file without an error), before the rename
    except CamrenderError as error:
        raise CamrenderError(f"cannot write the checkpoint: {error.detail}", path=path) from None
    except Exception as error:  # noqa: BLE001 - safetensors reports a failed write as its own error type
        reason = " ".join(str(getattr(error, "strerror", None) or error).split())[:200]
        raise CamrenderError(f"cannot write the checkpoint: {reason}", path=path) from None
    return os.path.getsize(path)


def check_tree(path) -> dict:
    """The skeleton of the tree saved at `path`, after checking from the file's header alone that the file is
    whole and holds every tensor the skeleton records with its shape and dtype, no other, matching the
    layout fingerprint, and that every class it names can be rebuilt. CamrenderError (naming the file)
    saying what does not verify."""
    try:
        layout, metadata = read_header(path)
        skeleton = json.loads(metadata[_SKELETON_KEY])
        recorded = {}
        _tensor_nodes(skeleton, recorded)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise CamrenderError(f"not a whole checkpoint ({type(error).__name__}: {error})", path=path) from None
    for name, entry in recorded.items():
        if name not in layout:
            raise CamrenderError(f"tensor {name} is missing", path=path)
        if list(layout[name]) != list(entry):
            raise CamrenderError(f"tensor {name} is {layout[name][0]} {layout[name][1]}, the tree recorded "
                                 f"{entry[0]} {entry[1]}", path=path)
    extra = sorted(set(layout) - set(recorded))
    if extra:
        raise CamrenderError(f"tensor {extra[0]} is not part of the tree", path=path)
    if metadata.get(LAYOUT_KEY) != layout_fingerprint(layout):
        raise CamrenderError("its tensors do not match its layout fingerprint", path=path)
    return skeleton


def _tensor_nodes(node, found: dict) -> None:
    """{name: (dtype, shape)} of every tensor node of a skeleton, walked as `_unflatten` walks it (ValueError for
    a node it would refuse, or a tensor node that records no shape and dtype)."""
    if not isinstance(node, dict):
        return
    if "tensor" in node:
        if not isinstance(node.get("dtype"), str) or not isinstance(node.get("shape"), list):
            raise ValueError(f"tensor {node['tensor']} has no recorded shape and dtype (another camrender version?)")
        found[node["tensor"]] = (node["dtype"], node["shape"])
    elif "dataclass" in node:
        _dataclass(node["dataclass"])
        for item in node["fields"].values():
            _tensor_nodes(item, found)
    elif "list" in node or "tuple" in node:
        for item in node.get("list", node.get("tuple")):
            _tensor_nodes(item, found)
    elif "dict" in node:
        for item in node["dict"].values():
            _tensor_nodes(item, found)
    elif "dtype" not in node:
        raise ValueError(f"unknown node {sorted(node)}")


def skeleton_value(skeleton: dict, key: str):
    """The plain value (no tensors) stored under `key` of a saved dict's skeleton (`check_tree`'s result)."""
    return _unflatten(skeleton["dict"][key], {}, "cpu")


def load_tree(path, device="cpu"):
    """(tree, metadata) saved by `save_tree`; tensors are moved to `device`."""
    with safe_open(os.fspath(path), framework="pt") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    skeleton = json.loads(metadata.pop(_SKELETON_KEY))
    return _unflatten(skeleton, tensors, device), metadata
