"""load_pipeline / load_transformer_weights on tiny models saved by the tests (no hub access)."""
import pytest
import torch
from safetensors.torch import save_file

from camrender.errors import CamrenderError
from camrender.model.stage1.loading import load_pipeline, load_transformer_weights, read_original_state_dict
from camrender.model.stage1.tiny import build_tiny_pipeline, build_tiny_transformer


@pytest.fixture(scope="module")
def saved_pipeline(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_pipeline")
    pipe = build_tiny_pipeline(seed=5)
    pipe.save_pretrained(folder)
    return folder, pipe


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def test_local_folder_round_trip(saved_pipeline):
    folder, original = saved_pipeline
    pipe = load_pipeline(str(folder), dtype="float32", device="cpu")
    for component in ("transformer", "vae", "text_encoder"):
        assert_same_weights(getattr(pipe, component), getattr(original, component))
    assert pipe.tokenizer("a cat").input_ids == original.tokenizer("a cat").input_ids
    assert pipe.vae_spatial_compression_ratio == 8 and pipe.vae_temporal_compression_ratio == 8
    assert pipe.transformer.dtype == torch.float32


def test_local_folder_dtype(saved_pipeline):
    folder, _ = saved_pipeline
    pipe = load_pipeline(str(folder), dtype="bfloat16", device="cpu")
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.bfloat16


def test_tiny_model_is_seeded():
    a = load_pipeline("tiny", dtype="auto", device="cpu")
    b = load_pipeline("tiny", dtype="float32", device="cpu")
    assert_same_weights(a.transformer, b.transformer)
    assert a.transformer.dtype == torch.float32  # auto on CPU


def test_missing_folder_says_what_to_do(tmp_path):
    with pytest.raises(CamrenderError) as error:
        load_pipeline(str(tmp_path / "no_such_model"), device="cpu")
    message = str(error.value)
    assert "not found" in message and "--model PATH" in message and "--model tiny" in message
    assert "\n" not in message


def test_folder_without_pipeline(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(CamrenderError, match="no model_index.json.*--model tiny"):
        load_pipeline(str(tmp_path), device="cpu")


def test_unreachable_hub_says_what_to_do():
    # conftest sets HF_HUB_OFFLINE=1: the hub cannot be reached and nothing is cached
    with pytest.raises(CamrenderError) as error:
        load_pipeline("Efficient-Large-Model/SANA-WM_bidirectional-diffusers", device="cpu")
    message = str(error.value)
    assert "hub" in message and "--model PATH" in message and "--model tiny" in message
    assert "\n" not in message


def test_offload_needs_a_gpu():
    with pytest.raises(CamrenderError, match="offload"):
        load_pipeline("tiny", device="cpu", offload=True)


def original_format(state_dict):
    """What the original training code saves: the original class's names (timestep MLP as
    `t_embedder.mlp.0/2`), `model.` prefixes, a `pos_embed` buffer and the caption-dropout embedding."""
    def original_name(name):
        return name.replace("t_embedder.linear_1.", "t_embedder.mlp.0.").replace("t_embedder.linear_2.", "t_embedder.mlp.2.")

    wrapped = {f"model.{original_name(name)}": tensor.clone() for name, tensor in state_dict.items()}
    wrapped["model.pos_embed"] = torch.zeros(1, 8, 32)
    wrapped["model.y_embedder.y_embedding"] = torch.zeros(4, 32)
    return wrapped


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_original_format_weights_load(tmp_path, suffix):
    source = build_tiny_transformer(seed=11)
    target = build_tiny_transformer(seed=12)
    state = original_format(source.state_dict())
    dropped = "blocks.0.attn.q_proj_cam.bias"
    del state[f"model.{dropped}"]
    state["model.extra_head.weight"] = torch.ones(3)
    path = tmp_path / f"dit{suffix}"
    if suffix == ".pt":
        torch.save({"generator": state, "step": 1000}, path)
    else:
        save_file(state, str(path))

    before = target.state_dict()[dropped].clone()
    with pytest.raises(CamrenderError, match=f"leaves 1 transformer weights unloaded \\({dropped}\\).*--allow-missing"):
        load_transformer_weights(target, path)
    assert torch.equal(target.state_dict()[dropped], before)  # refused before loading anything
    report = load_transformer_weights(target, path, allow_missing=True)
    assert report.missing == [dropped]
    assert "t_embedder.linear_1.weight" in report.loaded and "y_embedder.y_embedding" not in report.unexpected
    assert report.unexpected == ["extra_head.weight"]
    assert "pos_embed" not in report.unexpected
    for name, tensor in source.state_dict().items():
        if name != dropped:
            assert torch.equal(target.state_dict()[name], tensor), name
    assert torch.equal(target.state_dict()[dropped], before)  # missing keys keep their values
    lines = report.summary_lines()
    assert any("1 missing" in line and dropped in line for line in lines)


def test_weights_through_load_pipeline(tmp_path):
    source = build_tiny_transformer(seed=21)
    path = tmp_path / "model.pt"
    torch.save({"generator": original_format(source.state_dict())}, path)
    messages = []
    pipe = load_pipeline("tiny", device="cpu", transformer_weights=path, log=messages.append)
    assert_same_weights(pipe.transformer, source)
    assert messages and "loaded" in messages[0]


def test_bad_weight_files(tmp_path):
    target = build_tiny_transformer(seed=1)
    with pytest.raises(CamrenderError, match="not found"):
        load_transformer_weights(target, tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(CamrenderError, match="not a safetensors file: .*expected original-format DiT weights"):
        load_transformer_weights(target, garbage)
    unrelated = tmp_path / "other.pt"
    torch.save({"encoder.weight": torch.ones(2)}, unrelated)
    with pytest.raises(CamrenderError, match="no tensor"):
        load_transformer_weights(target, unrelated)
    wrong_shape = tmp_path / "shape.pt"
    torch.save({"model.final_layer.linear.weight": torch.ones(5, 5)}, wrong_shape)
    with pytest.raises(CamrenderError, match="does not match"):
        load_transformer_weights(target, wrong_shape)


def test_state_dict_unwrapping(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"state_dict": {"model.a": torch.ones(1), "pos_embed": torch.ones(1), "b": torch.zeros(1)}}, path)
    assert sorted(read_original_state_dict(path)) == ["a", "b"]


def test_vae_folder_replaces_the_pipeline_vae(saved_pipeline):
    folder, original = saved_pipeline  # seed 5: its VAE differs from the seed-0 tiny model's
    pipe = load_pipeline("tiny", dtype="float32", device="cpu", vae=folder / "vae")
    assert_same_weights(pipe.vae, original.vae)
    stock = load_pipeline("tiny", dtype="float32", device="cpu")
    assert any(not torch.equal(a, b) for a, b in zip(stock.vae.state_dict().values(), pipe.vae.state_dict().values()))


def test_vae_folder_missing(tmp_path):
    with pytest.raises(CamrenderError, match="not a diffusers VAE folder") as error:
        load_pipeline("tiny", dtype="float32", device="cpu", vae=tmp_path)
    assert error.value.field == "vae"
