"""FP8 W8A8 linears (camrender.model.fp8): the scales' placement, which layers are quantized, and the blocks'
outputs against the unquantized ones (tiny models, CPU: torch._scaled_mm runs there with row-wise scales)."""
import pytest
import torch

import camrender.model.fp8 as fp8_module
from camrender.model.fp8 import (E4M3_MAX, Fp8Linear, dequantize, feed_forward, one_input_linears, quantize,
                                 quantize_blocks)
from camrender.model.refiner.loading import strip_audio
from camrender.model.refiner.tiny import build_tiny_refiner
from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.tiny import build_tiny_pipeline


def cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


@pytest.mark.parametrize("scaling", ["row", "tensor"])
def test_quantize_round_trip_and_scale_shapes(scaling):
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-2, 2, 8)[:, None]
    q, scale = quantize(x, scaling)
    assert q.dtype == torch.float8_e4m3fn
    assert scale.shape == ((8, 1) if scaling == "row" else ())
    back = dequantize(q, scale)
    # e4m3 keeps 3 mantissa bits: relative error of each element below 2^-4 of its row's (tensor's) amax
    bound = (x.abs().amax(1, keepdim=True) if scaling == "row" else x.abs().amax()) / 16
    assert ((back - x).abs() <= bound).all()
    assert q.float().abs().max() <= E4M3_MAX
    if scaling == "row":  # each row uses the full e4m3 range
        assert torch.allclose(q.float().abs().amax(1), torch.full((8,), E4M3_MAX))


def test_zero_rows_quantize_to_zero():
    q, scale = quantize(torch.zeros(3, 16))
    assert torch.equal(dequantize(q, scale), torch.zeros(3, 16))


@pytest.mark.parametrize("scaling", ["row", "tensor"])
def test_fp8_linear_is_the_product_of_the_dequantized_operands(scaling):
    generator = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(32, 48)
    x = torch.randn(2, 5, 32, generator=generator)
    fp8 = Fp8Linear.from_linear(linear, scaling)
    assert fp8.weight_fp8.dtype == torch.float8_e4m3fn and fp8.weight_fp8.shape == (48, 32)
    qx, sx = quantize(x.reshape(-1, 32), scaling)
    expected = dequantize(qx, sx) @ dequantize(fp8.weight_fp8, fp8.weight_scale.reshape(-1, 1) if scaling == "row"
                                              else fp8.weight_scale).t() + linear.bias
    out = fp8(x)
    assert out.shape == (2, 5, 48) and out.dtype == x.dtype
    torch.testing.assert_close(out, expected.reshape(2, 5, 48), rtol=1e-5, atol=1e-5)
    reference = linear(x).detach()
    assert cosine(out, reference) > 0.998  # and close to the unquantized layer


def test_linears_of_one_input_quantize_it_once_to_the_same_bits(monkeypatch):
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 7, 32, generator=generator).to(torch.bfloat16)
    linears = [Fp8Linear.from_linear(torch.nn.Linear(32, n).to(torch.bfloat16)) for n in (48, 48, 16)]
    alone = [linear(x) for linear in linears]
    calls = []
    counted = fp8_module.quantize_rows
    monkeypatch.setattr(fp8_module, "quantize_rows", lambda *a, **k: calls.append(1) or counted(*a, **k))
    shared = one_input_linears(x, linears)
    assert len(calls) == 1
    for a, b in zip(shared, alone):
        assert a.shape == b.shape and torch.equal(a, b)
    calls.clear()  # a bf16 layer among them: each its own call, as before
    mixed = one_input_linears(x, linears[:2] + [torch.nn.Linear(32, 16).to(torch.bfloat16)])
    assert len(calls) == 2 and torch.equal(mixed[0], alone[0])
    calls.clear()  # a hooked layer is called as a module: its hook sees the call
    seen = []
    handle = linears[1].register_forward_hook(lambda module, args, output: seen.append(output))
    hooked = one_input_linears(x, linears)
    handle.remove()
    assert len(calls) == 3 and len(seen) == 1 and torch.equal(seen[0], alone[1]) and torch.equal(hooked[2], alone[2])


def test_fp8_feed_forward_runs_the_gelu_inside_the_quantization(monkeypatch):
    """The refiner's FFN under FP8: the GELU goes into the output linear's quantization (no GELU tensor), the
    same result as the module's own forward but for rare one-step e4m3 roundings (the GELU's fp32 tanh);
    a hooked layer falls back to the module call, bit for bit."""
    from diffusers.models.attention import FeedForward

    torch.manual_seed(3)
    ff = FeedForward(32, activation_fn="gelu-approximate").to(torch.bfloat16).eval()
    assert quantize_blocks([ff]) == 2
    x = torch.randn(2, 40, 32, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    stock = ff(x)
    calls = []
    counted = fp8_module.gelu_quantize_rows
    monkeypatch.setattr(fp8_module, "gelu_quantize_rows", lambda *a, **k: calls.append(1) or counted(*a, **k))
    fused = feed_forward(ff, x)
    assert calls == [1] and fused.shape == stock.shape and fused.dtype == stock.dtype
    assert (fused != stock).float().mean() < 0.02 and cosine(fused, stock) > 0.9999
    handle = ff.net[2].register_forward_hook(lambda *args: None)
    hooked = feed_forward(ff, x)
    handle.remove()
    assert calls == [1] and torch.equal(hooked, stock)


def test_refiner_blocks_quantized_leave_the_rest_alone_and_stay_close():
    refiner = build_tiny_refiner(seed=0)
    strip_audio(refiner.transformer)
    transformer = refiner.transformer
    block = transformer.transformer_blocks[0]
    names = [name for name, m in block.named_modules() if isinstance(m, torch.nn.Linear)]
    count = quantize_blocks(transformer.transformer_blocks)
    assert count == len(names) * len(transformer.transformer_blocks)
    assert not any(isinstance(m, torch.nn.Linear) for b in transformer.transformer_blocks for m in b.modules())
    # outside the blocks (conditioning, projections in and out) nothing changes
    assert isinstance(transformer.proj_in, torch.nn.Linear) and isinstance(transformer.proj_out, torch.nn.Linear)


@pytest.mark.parametrize("gated", [False, True])
def test_fp8_refiner_block_quantizes_each_activation_in_the_kernel_that_writes_it(monkeypatch, gated):
    """Under FP8 the fused refiner block hands its linears their input already quantized (adaLN glue, head merge,
    with LTX-2's output gate when the model has it): no separate quantizing pass is left but the prompt's keys and
    values, computed once per render, and the refined latents are the bits of quantizing each bf16 tensor after."""
    import camrender.model.refiner.attention as attention_module
    import camrender.model.refiner.block as block_module
    from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt

    options = dict(num_attention_heads=16, attention_head_dim=4, cross_attention_dim=64, gated_attn=True)
    refiner = build_tiny_refiner(seed=5, **(options if gated else {}))
    strip_audio(refiner.transformer)
    refiner.to(torch.bfloat16)
    blocks = refiner.transformer.transformer_blocks
    quantize_blocks(blocks)
    assert all(isinstance(b.attn1.to_gate_logits, Fp8Linear) == gated for b in blocks)
    text = encode_refiner_prompt(refiner, "a hall", "cpu", torch.bfloat16)
    clip = torch.randn(1, 8, 1 + 3, 2, 4, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)

    def refine():
        stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(2), kernels="fused")
        return torch.cat([stream.push(clip), stream.finish()], dim=2)

    calls = []
    counted = fp8_module.quantize_rows
    monkeypatch.setattr(fp8_module, "quantize_rows", lambda *a, **k: calls.append(1) or counted(*a, **k))
    fused = refine()
    assert len(calls) == 2 * len(blocks)  # each cross-attention's to_k and to_v, once
    calls.clear()
    for module in (block_module, attention_module):
        monkeypatch.setattr(module, "takes_quantized", lambda linears: False)
    apart = refine()
    passes = 2 + 3  # the cross-attention's prompt projections, then per forward: its query, both outputs
    assert len(calls) > passes * len(blocks)
    assert torch.equal(fused, apart)


def test_stage_one_block_keeps_the_camera_branch_and_stays_close():
    pipe = build_tiny_pipeline(seed=0)
    transformer = pipe.transformer
    patch_transformer(transformer, kernels="fused")
    block = transformer.blocks[0]
    camera = {name: m.weight.clone() for name, m in block.named_modules()
              if isinstance(m, torch.nn.Linear) and ("cam" in name or "plucker" in name)}
    x = torch.randn(1, 4 * 16, 32, generator=torch.Generator().manual_seed(2))
    mlp_before = block.mlp.inverted_conv.conv.weight.clone()
    count = quantize_blocks([block])
    assert count > 0
    for name, weight in camera.items():
        module = dict(block.named_modules())[name]
        assert isinstance(module, torch.nn.Linear) and torch.equal(module.weight, weight)
    assert isinstance(block.attn.qkv, Fp8Linear) and isinstance(block.attn.proj, Fp8Linear)
    assert isinstance(block.attn.beta_proj, torch.nn.Linear)  # N = heads: not a _scaled_mm shape
    assert block.mlp.inverted_conv.conv.fp8 is not None and block.mlp.point_conv.conv.fp8 is not None
    # the FFN's first 1x1 conv as quantized: close to the bf16 one
    from camrender.model.fp8 import conv_linear

    out = conv_linear(x, block.mlp.inverted_conv.conv)
    assert cosine(out, torch.nn.functional.linear(x, mlp_before[:, :, 0, 0], block.mlp.inverted_conv.conv.fp8.bias)) \
        > 0.998


def test_fp8_stage_one_blocks_quantize_each_activation_in_the_kernel_that_writes_it(monkeypatch):
    """Under FP8 the fused stage-1 blocks hand their linears the inputs already quantized: the attention's input
    by the adaLN glue (once for qkv and the output gate, the bf16 rows beside for the gates and the camera
    branch), the cross-attention's query by the gated residual, the output projections' by the output gate and
    the head merge, the FFN's by the second adaLN glue. Only the FFN's point conv and the text keys' projection
    quantize their own input. The segment forward (GDN and softmax blocks, a cache written and read) gives the
    bits of quantizing each bf16 tensor after it is written."""
    fused_against_apart(monkeypatch, torch.device("cpu"))


@pytest.mark.gpu
def test_fp8_stage_one_quantizing_kernels_compiled(monkeypatch):
    """The same on the GPU, the kernels compiled and `torch._scaled_mm` on FP8 tensor cores."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA GPU with FP8 tensor cores")
    fused_against_apart(monkeypatch, torch.device("cuda"))


def fused_against_apart(monkeypatch, device):
    """Two segments' passes of a tiny FP8 stage 1 on `device`, with the quantizing kernels and with every FP8
    linear quantizing its own input: the same bits, and the passes each way counted."""
    import camrender.model.stage1.block as block_module
    import camrender.model.stage1.gdn_attention as gdn_module
    from camrender.model.stage1.recipes import get_recipe
    from camrender.model.stage1.segments import SegmentCache, SegmentOptions, segment_forward
    from camrender.model.stage1.tiny import build_tiny_transformer
    from test_segments_forward import camera_inputs, model_inputs

    model = patch_transformer(build_tiny_transformer(seed=3).to(device, torch.bfloat16), kernels="fused",
                              recipe="streaming")
    assert {type(block.attn).__name__ for block in model.blocks} == {"PatchedGDNAttention", "PatchedSoftmaxAttention"}
    quantize_blocks(model.blocks)
    options = SegmentOptions.for_recipe(get_recipe("streaming"))
    latents, text, mask = (t.to(device) for t in model_inputs(1, 7, 2, 4))
    cameras, plucker = (t.to(device) for t in camera_inputs(1, 7, 2, 4))

    def two_segments():
        cache, outputs = SegmentCache.empty(model), []
        for start, stop in ((0, 4), (4, 7)):
            for timestep, write in ((500.0, False), (0.0, True)):
                outputs.append(segment_forward(
                    model, latents[:, :, start:stop].bfloat16(), torch.full((1, 1, stop - start), timestep,
                                                                            device=device),
                    text.bfloat16(), mask, camera_conditions=cameras[:, start:stop],
                    chunk_plucker=plucker[:, :, start:stop].bfloat16(), frame_start=start, cache=cache,
                    write_cache=write, options=options))
        return outputs

    calls = []
    counted = fp8_module.quantize_rows
    monkeypatch.setattr(fp8_module, "quantize_rows", lambda *a, **k: calls.append(1) or counted(*a, **k))
    with torch.no_grad():
        fused = two_segments()
    forwards = 4
    assert len(calls) == 2 * forwards * len(model.blocks)  # the text keys (each call here) and the point conv
    calls.clear()
    for module in (block_module, gdn_module, fp8_module):
        monkeypatch.setattr(module, "takes_quantized", lambda linears: False)
    with torch.no_grad():
        apart = two_segments()
    assert len(calls) == 8 * forwards * len(model.blocks)  # every FP8 linear (the output gate too) on its own
    for a, b in zip(fused, apart):
        assert torch.equal(a, b)


def test_render_with_an_fp8_refiner_quantizes_at_load_and_stays_close(tmp_path, monkeypatch):
    """The library path (the CLI refuses FP8 on a CPU): `refiner_precision="fp8"` quantizes the refiner's block
    linears once at load; the video stays close to the bf16 render's."""
    import numpy as np

    monkeypatch.setattr(Fp8Linear, "backend", "torch")  # the kernel's bits are tested in tests/kernels
    from test_prompt_cache import frames_of, request_for

    reference, _ = frames_of(request_for(None))
    frames, pipe = frames_of(request_for(None, refiner_precision="fp8"))
    blocks = pipe._camrender_refiner.transformer.transformer_blocks
    assert all(isinstance(block.attn1.to_q, Fp8Linear) for block in blocks)
    assert frames.shape == reference.shape and not np.array_equal(frames, reference)
    assert np.abs(frames.astype(float) - reference.astype(float)).mean() < 4  # of 255


def test_stock_ffn_keeps_its_conv_weights():
    """Under --kernels torch the FFN runs diffusers' convs, which read their weights: they are not quantized."""
    pipe = build_tiny_pipeline(seed=0)
    patch_transformer(pipe.transformer, kernels="torch")
    block = pipe.transformer.blocks[0]
    quantize_blocks([block])
    conv = block.mlp.inverted_conv.conv
    assert getattr(conv, "fp8", None) is None and conv.weight.shape == (128, 32, 1, 1)
