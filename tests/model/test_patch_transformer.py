"""patch_transformer: same parameters, same outputs as the stock diffusers transformer (tiny configs, CPU)
under the bidirectional-diffusers recipe; the other bidirectional recipes differ from it where they should.

The fused kernels run through the Triton interpreter (conftest sets TRITON_INTERPRET=1) at
ieee matmul precision.
"""
import pytest
import torch
from diffusers.models.transformers.transformer_sana_wm import (
    BidirectionalGDNUCPESinglePathLiteLA,
    _SoftmaxUCPESinglePathLiteLA,
)

from camrender import kernels

from camrender.model.settings import KernelSettings, model_settings
from camrender.model.stage1.gdn_attention import PatchedGDNAttention
from camrender.model.stage1.patch import patch_transformer
from camrender.model.stage1.tiny import build_tiny_transformer

DIFFUSERS = "bidirectional-diffusers"  # the recipe whose full mode is diffusers' model: the parity anchor

HEAD_DIM_CONFIGS = {
    16: {},  # the tiny default: hidden 32, 2 heads of 16
    24: dict(hidden_size=48, linear_head_dim=24),  # 2 heads of 24 (D/2 = 12 groups of 4 + RoPE)
}


def transformer_inputs(model, frames=3, height=2, width=4, seed=1):
    """Latents, timesteps, text and camera inputs for a forward of `model` (B=2, like CFG)."""
    g = torch.Generator().manual_seed(seed)
    batch, channels = 2, model.config.in_channels
    c2w = torch.eye(4).repeat(batch, frames, 1, 1)
    c2w[..., 0, 3] = torch.linspace(0, 1, frames)
    angle = torch.linspace(0, 0.4, frames)
    c2w[..., 0, 0], c2w[..., 0, 2], c2w[..., 2, 0], c2w[..., 2, 2] = angle.cos(), angle.sin(), -angle.sin(), angle.cos()
    intrinsics = torch.tensor([3.0, 3.0, width / 2, height / 2]).repeat(batch, frames, 1)
    intrinsics[..., :2] *= torch.linspace(1.0, 1.5, frames)[:, None]  # a zoom: per-frame focal lengths
    mask = torch.ones(batch, 7)
    mask[0, 5:] = 0
    timestep = torch.full((batch, 1, frames), 600.0)
    timestep[..., 0] = 0
    return dict(
        hidden_states=torch.randn(batch, channels, frames, height, width, generator=g),
        timestep=timestep,
        encoder_hidden_states=torch.randn(batch, 1, 7, model.config.caption_channels, generator=g),
        encoder_attention_mask=mask,
        camera_conditions=torch.cat([c2w.reshape(batch, frames, 16), intrinsics], dim=-1),
        chunk_plucker=torch.randn(batch, 48, frames, height, width, generator=g),
        return_dict=False,
    )


def forward(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def relative_error(out, ref):
    return float((out - ref).abs().max() / ref.abs().max())


def ulp_up(tensor):
    """The tensor moved up by one ulp, element by element."""
    return torch.nextafter(tensor, torch.tensor(float("inf")))


def one_ulp_floor(run, inputs) -> float:
    """How far `run(inputs)` moves when the latents move by one ulp: the reference's own rounding noise, the
    bar for agreement with it (it depends on the machine's BLAS kernels: 2e-6 to 2e-5 on the tiny models)."""
    return relative_error(run(dict(inputs, hidden_states=ulp_up(inputs["hidden_states"]))), run(inputs))


def test_patch_keeps_every_parameter_and_buffer():
    model = build_tiny_transformer(seed=0)
    before = model.state_dict()
    values = {name: tensor.clone() for name, tensor in before.items()}
    parameters = dict(model.named_parameters())
    patch_transformer(model, kernels="fused", recipe=DIFFUSERS)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(model.get_parameter(name) is parameter for name, parameter in parameters.items())
    for name in before:
        assert torch.equal(after[name], values[name]), name
        if not name.endswith("mlp.t_conv.weight"):  # laid out channels-last once (ffn.channels_last_kernel)
            assert after[name].data_ptr() == before[name].data_ptr(), name  # shared, not copied
    kinds = [type(block.attn) for block in model.blocks]
    assert kinds[0] is PatchedGDNAttention
    assert issubclass(kinds[1], _SoftmaxUCPESinglePathLiteLA)
    # patching again only updates the settings
    patch_transformer(model, kernels="torch", matmul_precision="ieee", recipe=DIFFUSERS)
    settings = KernelSettings(backend="torch", matmul_precision="ieee")
    assert model_settings(model) == settings
    assert all(module.settings is model_settings(model) for block in model.blocks for module in (block, block.attn, block.mlp))
    assert list(model.state_dict()) == list(before)
    with pytest.raises(ValueError):
        patch_transformer(model, kernels="cuda")


def test_patched_model_loads_stock_weights():
    stock = build_tiny_transformer(seed=3)
    patched = patch_transformer(build_tiny_transformer(seed=4), kernels="torch", recipe=DIFFUSERS)
    patched.load_state_dict(stock.state_dict())
    inputs = transformer_inputs(stock)
    assert relative_error(forward(patched, inputs), forward(stock, inputs)) <= 1e-5


def _stock_softmax_blocks(model):
    """Keep the softmax blocks on the stock forward (their SDPA runs in bf16 in stock)."""
    for block in model.blocks:
        if not isinstance(block.attn, BidirectionalGDNUCPESinglePathLiteLA):
            block.attn.settings = KernelSettings(backend="torch", matmul_precision=block.attn.settings.matmul_precision)


@pytest.mark.parametrize("head_dim", sorted(HEAD_DIM_CONFIGS))
def test_fused_gdn_blocks_match_stock(head_dim):
    model = build_tiny_transformer(seed=0, **HEAD_DIM_CONFIGS[head_dim])
    assert model.blocks[0].attn.cam_head_dim == head_dim
    inputs = transformer_inputs(model)
    reference = forward(model, inputs)

    patch_transformer(model, kernels="fused", matmul_precision="ieee", recipe=DIFFUSERS)
    _stock_softmax_blocks(model)
    patched = forward(model, inputs)
    assert relative_error(patched, reference) <= 1e-4

    # the comparison is sensitive to the camera branch: without it the output moves far more
    gdn = model.blocks[0].attn
    saved = gdn.out_proj_cam.weight.detach().clone()
    with torch.no_grad():
        gdn.out_proj_cam.weight.zero_()
    try:
        assert relative_error(forward(model, inputs), reference) > 100 * 1e-4
    finally:
        with torch.no_grad():
            gdn.out_proj_cam.weight.copy_(saved)


def test_whole_fused_model_matches_stock():
    """All blocks fused. Stock softmax blocks cast q, k, v to bf16 before SDPA even in fp32, so the
    patched softmax blocks agree with them to bf16 rounding, not to 1e-4."""
    model = build_tiny_transformer(seed=0)
    inputs = transformer_inputs(model)
    reference = forward(model, inputs)
    patch_transformer(model, kernels="fused", matmul_precision="ieee", recipe=DIFFUSERS)
    assert relative_error(forward(model, inputs), reference) <= 2e-3


def test_torch_kernels_match_stock():
    model = build_tiny_transformer(seed=2)
    inputs = transformer_inputs(model, frames=5)
    reference = forward(model, inputs)
    patch_transformer(model, kernels="torch", recipe=DIFFUSERS)
    assert relative_error(forward(model, inputs), reference) <= 1e-5


def test_fused_falls_back_to_torch_reference_on_cpu(monkeypatch):
    """Without TRITON_INTERPRET=1 and without a GPU, kernels='fused' runs the PyTorch reference."""
    model = patch_transformer(build_tiny_transformer(seed=0), kernels="fused", recipe=DIFFUSERS)
    calls = []
    reference = kernels.camera_branch_reference.camera_branch_ref

    def spy(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    monkeypatch.setattr(kernels.camera_branch_reference, "camera_branch_ref", spy)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    forward(model, transformer_inputs(model))
    assert calls == [1]  # one GDN block, one reference call
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    forward(model, transformer_inputs(model))
    assert calls == [1]  # interpreter: the Triton path, not the reference


def test_patched_blocks_run_the_glue_kernels(monkeypatch):
    """kernels='fused' blocks run their adaLN steps through kernels.block_glue and still match the
    stock model; kernels='torch' blocks run the same steps on the glue's PyTorch backend. The glue entry
    points are what is counted, so the PyTorch backend stands in for the interpreter (the kernels have
    their own tests)."""
    import camrender.kernels.block_glue as glue
    import camrender.model.stage1.block as block_module  # it imports the glue's entry points by name
    from camrender.model.stage1.block import PatchedBlock

    monkeypatch.setenv("TRITON_INTERPRET", "0")

    model = build_tiny_transformer(seed=5)
    inputs = transformer_inputs(model)
    reference = forward(model, inputs)
    calls = []
    for name in ("ada_norm", "gated_residual"):
        original = getattr(glue, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append((_name, kwargs.get("backend", "auto")))
            return _original(*args, **kwargs)

        monkeypatch.setattr(glue, name, counted)  # residual_ada_norm's own ada_norm
        monkeypatch.setattr(block_module, name, counted)
    patch_transformer(model, kernels="fused", matmul_precision="ieee", recipe=DIFFUSERS)
    _stock_softmax_blocks(model)
    assert all(isinstance(block, PatchedBlock) for block in model.blocks)
    assert relative_error(forward(model, inputs), reference) <= 1e-4
    # per block: ada_norm for the attention and (through residual_ada_norm) after the cross-attention,
    # gated_residual after the attention and after the FFN
    steps = sorted([("ada_norm", "auto"), ("gated_residual", "auto")] * 2 * len(model.blocks))
    assert sorted(calls) == steps
    calls.clear()
    patch_transformer(model, kernels="torch", recipe=DIFFUSERS)
    assert relative_error(forward(model, inputs), reference) <= 1e-4
    assert sorted(calls) == [(name, "torch") for name, _ in steps]


@pytest.mark.parametrize("kernels", ["torch", "fused"])
def test_full_mode_forward_is_the_transformers_forward_through_the_patched_blocks(kernels, monkeypatch):
    """Full mode runs camrender's forward (`segment_forward`, one whole-clip segment, FULL_MODE) on the
    conditioning built once (`prepare_conditioning`: its RoPE rows are the transformer's own table). Called
    without a segment, as diffusers' transformer forward calls them, the patched blocks run that same
    whole-clip segment: both forwards agree bit for bit, on either backend."""
    from camrender.model.stage1.segments import prepare_conditioning, segment_forward
    from camrender.model.stage1.state import FULL_MODE

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the fused backend on the PyTorch references: the same ops
    model = patch_transformer(build_tiny_transformer(seed=6), kernels=kernels)
    inputs = transformer_inputs(model)
    grid = inputs["hidden_states"].shape[2:]
    conditioning = prepare_conditioning(model, grid, inputs["encoder_hidden_states"], inputs["encoder_attention_mask"],
                                        camera_conditions=inputs["camera_conditions"],
                                        chunk_plucker=inputs["chunk_plucker"])
    assert torch.equal(conditioning.rope, model.rope(tuple(grid), device="cpu").reshape(conditioning.rope.shape))
    with torch.no_grad():
        ours = segment_forward(model, inputs["hidden_states"], inputs["timestep"], options=FULL_MODE,
                               conditioning=conditioning)
    assert torch.equal(ours, forward(model, inputs))


def test_fixed_plucker_gives_the_same_output(monkeypatch):
    """Per-block Plucker projections computed once (camrender.model.stage1.block.fixed_plucker) == per call,
    for a batch-1 Plucker row broadcast over the guidance rows as a render passes it; cleared after.
    On the glue's PyTorch backend (its kernel, with a broadcast extra and bias, has its own tests)."""
    from camrender.model.stage1.block import fixed_plucker

    monkeypatch.setenv("TRITON_INTERPRET", "0")

    model = patch_transformer(build_tiny_transformer(seed=7), kernels="fused", matmul_precision="ieee",
                              recipe=DIFFUSERS)
    inputs = transformer_inputs(model)
    inputs["chunk_plucker"] = inputs["chunk_plucker"][:1]
    want = forward(model, inputs)
    with fixed_plucker(model, inputs["chunk_plucker"]):
        assert all(block.fixed_plucker is not None for block in model.blocks)
        got = forward(model, inputs)
        inputs_moved = {**inputs, "chunk_plucker": inputs["chunk_plucker"] + 1.0}
        assert relative_error(forward(model, inputs_moved), want) < 1e-6  # the fixed projection is used
    assert all(block.fixed_plucker is None for block in model.blocks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert relative_error(forward(model, inputs_moved), want) > 1e-3  # and outside, the inputs' again


def _stock_without_gdn_block_rescale(model, inputs, monkeypatch):
    """diffusers' model with `_downscale_to_reference_rms` skipped inside its GDN camera attention only
    (transformer_sana_wm.py:1601-1603): NVlabs 40151c8's arithmetic, the default recipe's."""
    import diffusers.models.transformers.transformer_sana_wm as sana

    original, cam_forward, inside = sana._downscale_to_reference_rms, sana.SanaWMBidirectionalGDNCamAttention.forward, []

    def downscale(reference, transformed, eps=1e-6):
        return transformed if inside else original(reference, transformed, eps)

    def gdn_cam_forward(self, *args, **kwargs):
        inside.append(True)
        try:
            return cam_forward(self, *args, **kwargs)
        finally:
            inside.pop()

    with monkeypatch.context() as patched:
        patched.setattr(sana, "_downscale_to_reference_rms", downscale)
        patched.setattr(sana.SanaWMBidirectionalGDNCamAttention, "forward", gdn_cam_forward)
        return forward(model, inputs)


@pytest.mark.parametrize("kernels", ["torch", "fused"])
def test_default_recipe_is_diffusers_without_its_gdn_block_rescale(kernels, monkeypatch):
    model = build_tiny_transformer(seed=2)
    inputs = transformer_inputs(model, frames=5)
    stock = forward(model, inputs)
    expected = _stock_without_gdn_block_rescale(model, inputs, monkeypatch)
    assert relative_error(expected, stock) > 1e-3  # the rescale matters on this input
    # the bar: the kernels' own, or twice a reference's one-ulp noise where this machine's BLAS makes it larger
    tolerance = 1e-5 if kernels == "torch" else 1e-4
    floors = (one_ulp_floor(lambda moved: _stock_without_gdn_block_rescale(model, moved, monkeypatch), inputs),
              one_ulp_floor(lambda moved: forward(model, moved), inputs))
    assert max(floors) < 1e-4  # far below the rescale's effect
    patch_transformer(model, kernels=kernels, matmul_precision="ieee")  # the default recipe: bidirectional
    if kernels == "fused":
        _stock_softmax_blocks(model)  # stock rounds the softmax q/k/v to bf16
    assert relative_error(forward(model, inputs), expected) <= max(tolerance, 2 * floors[0])
    patch_transformer(model, kernels=kernels, matmul_precision="ieee", recipe="bidirectional-diffusers")
    if kernels == "fused":
        _stock_softmax_blocks(model)
    assert relative_error(forward(model, inputs), stock) <= max(tolerance, 2 * floors[1])
