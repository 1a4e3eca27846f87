"""Build a patched module from a stock one without copying its weights."""
from __future__ import annotations

import torch


def adopt_module(cls, stock: torch.nn.Module, **attributes) -> torch.nn.Module:
    """An instance of `cls` that takes over `stock`'s parameters, buffers, sub-modules and
    attributes (the same tensors, no copies), with `attributes` set (e.g. `settings`)."""
    patched = cls.__new__(cls)
    state = dict(stock.__dict__)
    # Fresh containers holding the same tensors/modules, so the two objects never alias dicts.
    for container in ("_parameters", "_buffers", "_modules"):
        state[container] = type(state[container])(state[container])
    state["_non_persistent_buffers_set"] = set(state["_non_persistent_buffers_set"])
    patched.__dict__.update(state)
    for name, value in attributes.items():
        setattr(patched, name, value)
    return patched
