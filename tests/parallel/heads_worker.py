"""Worker script of tests/parallel/test_heads.py, run under torchrun (gloo, CPU, tiny model of 4 heads).

    python -m torch.distributed.run --standalone --nproc-per-node N tests/parallel/heads_worker.py modules OUT.pt
        every rank builds the same patched tiny transformer, records the unsplit outputs of each
        block's attention, cross-attention and FFN and of the whole forward, splits a copy over the
        N ranks (`camrender.parallel.heads`) and runs the same inputs; rank 0 saves both.
    ... tests/parallel/heads_worker.py segments OUT.pt [camrender-args...]
        every rank renders a segment-mode clip with the heads split over the ranks (the sampler's
        latents recorded); rank 0 also renders it alone (one process) and saves all of them;
        then, with arguments, `camrender` runs them on the same processes
    ... tests/parallel/heads_worker.py full OUT.pt GUIDANCE
        the same for a full-mode clip (GUIDANCE > 1 on 4 ranks: the guidance branches on 2 ranks
        each, which split the heads)
"""
import copy
import dataclasses
import sys
from pathlib import Path

import torch

from camrender.parallel import distributed
from camrender.parallel.heads import HeadSplit, split_transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from test_patch_transformer import one_ulp_floor, relative_error, transformer_inputs, ulp_up  # noqa: E402

TINY_HEADS = dict(num_attention_heads=4, linear_head_dim=8)  # 2 heads per rank on 2 ranks


def record_calls(modules):
    """Forward hooks saving each module's first (args, kwargs, output); returns (records, handles)."""
    records, handles = {}, []
    for name, module in modules.items():
        def hook(module, args, kwargs, output, name=name):
            records.setdefault(name, (args, kwargs, output))
        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    return records, handles


def named_parts(model):
    parts = {}
    for index, block in enumerate(model.blocks):
        parts[f"attn{index}"] = block.attn
        parts[f"cross{index}"] = block.cross_attn
    return parts


def one_ulp_floors(model, records, inputs, ffn_in, hw) -> dict:
    """For each recorded part, each FFN and the whole forward: how far the unsplit output moves when its input
    moves by one ulp (the unsplit module's own rounding noise on this machine's BLAS)."""
    floors = {}
    with torch.no_grad():
        for name, module in named_parts(model).items():
            args, kwargs, expected = records[name]
            floors[name] = relative_error(module(ulp_up(args[0]), *args[1:], **kwargs), expected)
        for index, block in enumerate(model.blocks):
            floors[f"ffn{index}"] = relative_error(block.mlp(ulp_up(ffn_in), hw), block.mlp(ffn_in, hw))
        floors["forward"] = one_ulp_floor(lambda moved: model(**moved)[0], inputs)
    return floors


def modules(out):
    from camrender.model.stage1.patch import patch_transformer
    from camrender.model.stage1.tiny import build_tiny_transformer

    torch.set_num_threads(1)
    ranks = distributed.start("cpu")
    model = patch_transformer(build_tiny_transformer(seed=0, **TINY_HEADS), kernels="fused", matmul_precision="ieee")
    inputs = transformer_inputs(model)
    records, handles = record_calls(named_parts(model))
    with torch.no_grad():
        whole = model(**inputs)[0]
    for handle in handles:
        handle.remove()
    g = torch.Generator().manual_seed(5)
    frames, height, width = 3, 2, 4
    ffn_in = torch.randn(2, frames * height * width, model.config.hidden_size, generator=g)
    with torch.no_grad():
        ffn = {f"ffn{i}": block.mlp(ffn_in, (frames, height, width)) for i, block in enumerate(model.blocks)}

    floors = one_ulp_floors(model, records, inputs, ffn_in, (frames, height, width))
    split_model = split_transformer(copy.deepcopy(model), HeadSplit(ranks.video_group, ranks.group_rank,
                                                                     ranks.per_video))
    results = {"floors": floors}
    with torch.no_grad():
        for name, module in named_parts(split_model).items():
            args, kwargs, expected = records[name]
            results[name] = (module(*args, **kwargs), expected)
        for index, block in enumerate(split_model.blocks):
            results[f"ffn{index}"] = (block.mlp(ffn_in, (frames, height, width)), ffn[f"ffn{index}"])
        results["forward"] = (split_model(**inputs)[0], whole)
    results["heads"] = [block.attn.heads for block in split_model.blocks]
    results["qkv_rows"] = split_model.blocks[0].attn.qkv.weight.shape[0]
    gathered = distributed.gather_objects(results, ranks)
    if ranks.is_main:
        torch.save(gathered, out)
    distributed.stop()


def recorded_latents(pipe, request):
    """Run segment mode's `render_frames` and return the latents of every segment, concatenated
    over frames (B, C, T, h, w) (the sampler's output, recorded on every rank)."""
    from camrender.render import loop as render_loop
    from camrender.render import segments as segment_render

    recorded = []

    def recording(sampler):
        def run(*args, **kwargs):
            for item in sampler(*args, **kwargs):
                recorded.append(item[-1].clone())
                yield item
        return run

    samplers = dict(segment_render.SEGMENT_SAMPLERS)
    segment_render.SEGMENT_SAMPLERS.update({name: recording(sampler) for name, sampler in samplers.items()})
    try:
        for _ in render_loop.render_frames(pipe, request):
            pass
    finally:
        segment_render.SEGMENT_SAMPLERS.update(samplers)
    return torch.cat(recorded, dim=2)


def split_and_alone(latents, out, results):
    """Every rank's latents(dtype) with the heads split, then rank 0's alone (one process), for fp32
    and fp64, saved to `out` by rank 0 with `results`. Leaves the process group joined."""
    from dist_worker import precision_model

    torch.set_num_threads(1)
    ranks = distributed.start("cpu")
    for dtype in (torch.float32, torch.float64):
        with precision_model(dtype):
            gathered = distributed.gather_objects(latents(dtype, ranks), ranks)
            if ranks.is_main:  # the same render on this process alone
                results[str(dtype)] = {"ranks": gathered, "alone": latents(dtype, None)}
    if ranks.is_main:
        torch.save(results, out)


def segments(out):
    from camrender.api.requests import for_ranks
    from camrender.render.pipeline import load_patched_pipeline
    from dist_worker import orbit_request

    def request():
        return dataclasses.replace(orbit_request(), mode="segments", guidance=None, steps=2, segment_frames=1)

    def latents(dtype, ranks):
        planned = for_ranks(request(), ranks)
        return recorded_latents(load_patched_pipeline(planned.settings, ranks=ranks).to(dtype), planned)

    split_and_alone(latents, out, {})


def full(out, guidance):
    from camrender.api.requests import for_ranks
    from camrender.render.full import sample_latents
    from camrender.render.pipeline import load_patched_pipeline
    from dist_worker import orbit_request

    layout = []

    def latents(dtype, ranks):
        request = for_ranks(dataclasses.replace(orbit_request(), guidance=guidance, steps=2), ranks)
        pipe = load_patched_pipeline(request.settings, ranks=ranks).to(dtype)
        split = getattr(pipe.transformer, "head_split", None)
        layout.append((pipe.transformer.blocks[0].attn.heads, None if split is None else split.size))
        return sample_latents(pipe, request)

    split_and_alone(latents, out, {"layout": layout})
    distributed.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if sys.argv[1] == "modules":
        modules(sys.argv[2])
    elif sys.argv[1] == "full":
        full(sys.argv[2], float(sys.argv[3]))
    elif sys.argv[1] == "segments":
        segments(sys.argv[2])
        if sys.argv[3:]:
            from camrender.cli.main import main

            main(sys.argv[3:])
    else:
        sys.exit(f"unknown worker task {sys.argv[1]!r}")
