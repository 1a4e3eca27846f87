"""Quality of FP8 W8A8 (camrender.model.fp8) against bf16 on the refiner, random weights.

The refiner (release configs: 48 layers, 4096 wide; `--tiny`: the tiny refiner on a CPU) refines one
clip (sink + `--blocks` blocks of 3 latent frames, 704x1280 at the release size) through `RefinerStream`,
all in bf16, then again with its blocks' linears quantized:

- `fp8_row`: e4m3 weights with per-output-channel scales, activations per token (camrender's choice);
- `fp8_tensor`: one scale per weight and per activation tensor (the usual default elsewhere);
- `bf16_one_ulp`: bf16 again with every input value moved one ulp: bf16's own noise floor.

`stage1` holds the same rows for stage 1 (the SANA-WM DiT's first segment: 4 latent frames, the 4-step
list, its block linears and 1x1 FFN convs in FP8, the camera branch in bf16; `--tiny`: fp32 on a CPU).

For each it reports, against the bf16 run: per linear layer (each quantized layer on the activations it
gets in the quantized run, against the same layer with its bf16 weight on the same input; median and
worst over the layers), per block (each block's output on the first pass, errors accumulated through
the depth: the first, middle and last blocks and the worst), and end to end (the refined latents).
Errors: relative Frobenius error ||a - b|| / ||b|| and cosine similarity. Random weights have no
outlier channels, so the gap between the two scalings here is a lower bound of a trained model's.

    python3 bench/bench_fp8.py --out $OUT/bench_fp8.json     # release size, one GPU (about 1 minute)
    python3 bench/bench_fp8.py --tiny                          # CPU, tiny refiner
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_segments as stage_one  # noqa: E402
import refiner_common  # noqa: E402
from camrender.model.fp8 import Fp8Linear, quantize_blocks  # noqa: E402
from camrender.model.refiner.stream import RefinerStream  # noqa: E402
from camrender.model.stage1.segments import SegmentOptions, segment_bounds  # noqa: E402
from camrender.render.segments import DEFAULT_SEGMENT_TIMESTEPS, sample_segments  # noqa: E402
from common import emit  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, the tiny refiner")
    parser.add_argument("--blocks", type=int, default=1, help="refined blocks of 3 latent frames after the sink")
    parser.add_argument("--text-tokens", type=int, default=1024)
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def compare(a, b) -> dict:
    a, b = a.double().flatten(), b.double().flatten()
    return dict(rel=float((a - b).norm() / b.norm()), cos=float(F.cosine_similarity(a, b, dim=0)))


def refine(transformer, text, clip, device, *, block_outputs=None):
    """Refined latents of `clip` (sink + blocks); block_outputs: list filled with each block's first output."""
    handles = []
    if block_outputs is not None:
        def keep(index):
            def hook(module, args, output):
                if len(block_outputs) <= index:
                    hidden = output[0] if isinstance(output, tuple) else output
                    block_outputs.append(hidden.detach().clone())
            return hook
        handles = [block.register_forward_hook(keep(i)) for i, block in enumerate(transformer.transformer_blocks)]
    try:
        stream = RefinerStream(refiner_common.as_refiner(transformer), text, fps=16.0, device=device,
                               generator=torch.Generator().manual_seed(0),
                               kernel_backend=refiner_common.kernel_backend(device))
        out = torch.cat([stream.push(clip), stream.finish()], dim=2)
    finally:
        for handle in handles:
            handle.remove()
    return out


def layer_errors(quantized_blocks, reference_blocks) -> tuple[list, list]:
    """Hooks on every Fp8Linear of `quantized_blocks`: its output on its first input against the bf16 layer's
    (stage 1's 1x1 FFN convs, `conv.fp8`, against the conv's weight as a linear)."""
    rows, handles = [], []
    for block, reference in zip(quantized_blocks, reference_blocks):
        originals = dict(reference.named_modules())
        for name, module in block.named_modules():
            if isinstance(module, Fp8Linear):
                original = originals[name[:-len(".fp8")] if name.endswith(".fp8") else name]
                weight = original.weight if original.weight.dim() == 2 else original.weight[:, :, 0, 0]

                def hook(module, args, output, weight=weight, bias=original.bias, name=name, seen=[]):  # noqa: B006
                    if id(module) in seen:
                        return
                    seen.append(id(module))
                    rows.append(dict(layer=name, **compare(output, F.linear(args[0], weight, bias))))
                handles.append(module.register_forward_hook(hook))
    return rows, handles


def summary(rows) -> dict:
    rels, coss = [r["rel"] for r in rows], [r["cos"] for r in rows]
    worst = max(rows, key=lambda r: r["rel"])
    return dict(layers=len(rows), rel_median=statistics.median(rels), rel_max=max(rels),
                cos_median=statistics.median(coss), cos_min=min(coss), worst_layer=worst["layer"])


def block_summary(outputs, reference) -> dict:
    rows = [compare(a, b) for a, b in zip(outputs, reference)]
    picks = {"first": 0, "middle": len(rows) // 2, "last": len(rows) - 1}
    result = {f"block_{name}": dict(index=i, **rows[i]) for name, i in picks.items()}
    result["block_rel_max"] = max(r["rel"] for r in rows)
    result["block_cos_min"] = min(r["cos"] for r in rows)
    return result


def stage_one_quality(tiny, device, shape) -> dict:
    """Stage 1 (SANA-WM DiT, release config; tiny on a CPU in fp32): the first segment (4 latent frames, the
    4-step list) in the model's dtype, one ulp up, and with its block linears in FP8 (row / tensor)."""
    dtype = torch.float32 if tiny else torch.bfloat16
    stage_args = SimpleNamespace(cpu_smoke=tiny, quick=False, kernels="fused" if device.type == "cuda" else "torch")
    transformer, _ = stage_one.build_models(stage_args, device, dtype)
    inputs = stage_one.path_inputs(transformer, 4, shape[0], shape[1], device, dtype)

    def segment(model, nudge=False, block_outputs=None):
        run_inputs = inputs
        if nudge:
            run_inputs = copy.copy(inputs)
            run_inputs.noise = torch.nextafter(inputs.noise, torch.full_like(inputs.noise, float("inf")))
        handles = []
        if block_outputs is not None:
            def keep(module, args, output):
                if len(block_outputs) < len(model.blocks):
                    block_outputs.append((output[0] if isinstance(output, tuple) else output).detach().clone())
            handles = [block.register_forward_hook(keep) for block in model.blocks]
        try:
            return torch.cat([x for *_, x in sample_segments(model, run_inputs, segment_bounds(4, 3),
                                                             list(DEFAULT_SEGMENT_TIMESTEPS), SegmentOptions(),
                                                             device)], dim=2)
        finally:
            for handle in handles:
                handle.remove()

    result = {}
    reference_blocks, nudged_blocks = [], []
    reference = segment(transformer, block_outputs=reference_blocks)
    nudged = segment(transformer, nudge=True, block_outputs=nudged_blocks)
    result["one_ulp"] = dict(end_to_end=compare(nudged, reference), **block_summary(nudged_blocks, reference_blocks))
    for scaling in ("row", "tensor"):
        quantized = copy.deepcopy(transformer)
        count = quantize_blocks(quantized.blocks, scaling)
        rows, handles = layer_errors(quantized.blocks, transformer.blocks)
        outputs = []
        out = segment(quantized, block_outputs=outputs)
        for handle in handles:
            handle.remove()
        result[f"fp8_{scaling}"] = dict(quantized_linears=count, end_to_end=compare(out, reference),
                                        per_layer=summary(rows), **block_summary(outputs, reference_blocks))
        del quantized
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.tiny:
        device, shape, tokens = torch.device("cpu"), (32, 32), min(args.text_tokens, 16)
        stage_one.SPATIAL = 8
    elif not torch.cuda.is_available():
        print('{"error": "no CUDA device (use --tiny on a CPU)"}')
        return 1
    else:
        device, shape, tokens = torch.device("cuda"), (704, 1280), args.text_tokens
    dtype = torch.bfloat16
    Fp8Linear.backend = refiner_common.kernel_backend(device)  # on a CPU the PyTorch reference, not the interpreter
    began = time.perf_counter()
    transformer = refiner_common.build_refiner_transformer(args.tiny, device, dtype)
    text = refiner_common.refiner_text(transformer, tokens, device, dtype)
    spatial = stage_one.SPATIAL
    h, w = shape[0] // spatial, shape[1] // spatial
    clip = torch.randn(1, transformer.config.in_channels, 1 + 3 * args.blocks, h, w,
                       generator=torch.Generator().manual_seed(2)).to(device, dtype)
    results = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                   tiny=args.tiny, height=shape[0], width=shape[1], blocks=args.blocks, text_tokens=tokens,
                   layers=len(transformer.transformer_blocks), note=__doc__.splitlines()[0])
    # nothing parked: each quantized copy is taken of the model as it stands, its prompt projections on the GPU
    with torch.no_grad(), refiner_common.unparked():
        reference_blocks = []
        reference = refine(transformer, text, clip, device, block_outputs=reference_blocks)
        nudged_blocks = []
        nudged = refine(transformer, text, torch.nextafter(clip, torch.full_like(clip, float("inf"))), device,
                        block_outputs=nudged_blocks)
        results["bf16_one_ulp"] = dict(end_to_end=compare(nudged, reference),
                                       **block_summary(nudged_blocks, reference_blocks))
        del nudged_blocks
        for scaling in ("row", "tensor"):
            quantized = copy.deepcopy(transformer)
            count = quantize_blocks(quantized.transformer_blocks, scaling)
            rows, handles = layer_errors(quantized.transformer_blocks, transformer.transformer_blocks)
            outputs = []
            out = refine(quantized, text, clip, device, block_outputs=outputs)
            for handle in handles:
                handle.remove()
            results[f"fp8_{scaling}"] = dict(quantized_linears=count, end_to_end=compare(out, reference),
                                             per_layer=summary(rows), **block_summary(outputs, reference_blocks))
            if scaling == "row":
                results["weight_bytes"] = dict(
                    bf16=sum(b.numel() * b.element_size() for b in transformer.parameters()),
                    fp8=sum(t.numel() * t.element_size() for t in list(quantized.parameters()) +
                            list(quantized.buffers())))
            del quantized, outputs
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results["stage1"] = stage_one_quality(args.tiny, device, shape)
    results["wall_s"] = round(time.perf_counter() - began, 1)
    emit(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
