"""`--gpus N` of `camrender render` and `camrender batch`: run the command again as N torchrun workers.

The launching process checks the request first (bad input: one line, exit 2, no worker started),
then hands the same command line, minus `--gpus`, to `camrender.parallel.distributed.launch`. Inside
torchrun (started by it or by the user) `--gpus` is not used: the run's WORLD_SIZE counts.
"""
from __future__ import annotations

import contextlib
import io
from typing import Optional

import click

from camrender.errors import CamrenderError
from camrender.parallel import distributed


def gpus_option(help_text: str):
    """The `--gpus N` click option."""
    return click.option("--gpus", default=None, type=click.IntRange(min=1),
                        help=help_text + " Inside torchrun the run's processes count instead.")


def wants_launch(gpus: Optional[int]) -> bool:
    """Whether `--gpus` asks this (not yet distributed) process to start workers."""
    return gpus is not None and gpus > 1 and not distributed.launched_by_torchrun()


def quiet_checks(gpus: Optional[int]):
    """A context in which the request checks' warnings are dropped unless this process is the one
    that reports them: rank 0 of the workers (a launching process is checked again there)."""
    if wants_launch(gpus) or not distributed.is_main_process():
        return contextlib.redirect_stderr(io.StringIO())
    return contextlib.nullcontext()


def check_devices(gpus: int, device: Optional[str]) -> None:
    """Raise CamrenderError unless this host has `gpus` GPUs (`--device cpu`: N CPU processes, gloo)."""
    if device == "cpu":
        return
    # lazy: keeps `camrender --help` free of torch
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < gpus:
        raise CamrenderError(f"{gpus} GPUs were asked for but this host has {count} (--device cpu runs "
                             f"{gpus} CPU processes instead)", field="gpus")


def relaunch(gpus: int, device: Optional[str], exclude=("gpus",)) -> int:
    """Run the current click command again on `gpus` workers; returns the exit code."""
    check_devices(gpus, device)
    ctx = click.get_current_context()
    given = {name: value for name, value in ctx.params.items()
             if name not in exclude and ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)}
    return distributed.launch(gpus, [ctx.info_name, *options_to_argv(ctx.command, given)])


def options_to_argv(command: click.Command, values: dict) -> list:
    """A command line for `command` that parses back to `values` (param name -> value)."""
    positional, options = [], []
    for param in command.params:
        if param.name not in values:
            continue
        value = values[param.name]
        if isinstance(param, click.Argument):
            positional.append(str(value))
        elif param.is_flag and param.secondary_opts:
            if value is not None:  # None: neither (e.g. --smooth/--no-smooth left to the scheme)
                options.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            options += [param.opts[0]] if value else []
        elif value is not None:
            options += [param.opts[0], str(value)]
    return positional + options
