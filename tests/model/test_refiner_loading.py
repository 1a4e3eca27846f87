"""--refiner sources: a saved tiny refiner loads back through the real loading code; bad folders stop with one line."""
import json
import shutil

import pytest
import torch
from helpers import rel

from camrender.errors import CamrenderError
from camrender.model.refiner.loading import is_layer_streamed, load_refiner, resolve_refiner, strip_audio, stream_layers
from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt
from camrender.model.refiner.tiny import build_tiny_refiner


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_refiner")
    original = build_tiny_refiner(seed=2)
    original.save_pretrained(folder)
    return folder, original


def refine(refiner, clip, device="cpu"):
    text = encode_refiner_prompt(refiner, "a cat", device, torch.float32)
    stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(0), device=device)
    return torch.cat([stream.push(clip), stream.finish()], dim=2)


def assert_same_refiner(loaded, original):
    expected = dict(original.transformer.state_dict())
    got = loaded.transformer.state_dict()
    assert got and set(got) <= set(expected)
    assert all(torch.equal(got[name], expected[name]) for name in got)
    clip = torch.randn(1, 8, 5, 4, 6, generator=torch.Generator().manual_seed(1))
    assert rel(refine(loaded, clip), refine(original, clip)) < 1e-6  # same weights; kernels may round differently


def test_saved_folder_round_trip(saved):
    folder, original = saved
    loaded = load_refiner(resolve_refiner(str(folder), latent_channels=8), dtype=torch.float32)
    assert not any("audio" in name for name in loaded.transformer.state_dict())
    assert_same_refiner(loaded, original)


def test_saved_folder_loads_without_diffusers_deprecation_warnings(saved):
    import warnings

    folder, _ = saved
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # diffusers 0.42 deprecates the pipelines' torch_dtype=
        load_refiner(resolve_refiner(str(folder), latent_channels=8), dtype=torch.float32)


def test_transformer_listed_as_plain_ltx2(saved, tmp_path):
    """A refiner folder whose transformer is saved as LTX2VideoTransformer3DModel loads as the refiner class."""
    folder, original = saved
    copy = tmp_path / "ltx2"
    shutil.copytree(folder, copy)
    for path in (copy / "model_index.json", copy / "transformer" / "config.json"):
        text = path.read_text().replace("SanaWMLTX2RefinerTransformer3DModel", "LTX2VideoTransformer3DModel")
        path.write_text(text)
    loaded = load_refiner(resolve_refiner(str(copy), latent_channels=8), dtype=torch.float32)
    assert type(loaded.transformer).__name__ == "SanaWMLTX2RefinerTransformer3DModel"
    assert_same_refiner(loaded, original)


def test_streaming_checkpoint_layout(saved, tmp_path):
    """refiner_diffusers/{transformer,connectors} with the Gemma-3 encoder (and its tokenizer) in gemma3_12b/ beside it."""
    folder, original = saved
    root = tmp_path / "SANA-WM_streaming"
    for part in ("transformer", "connectors"):
        shutil.copytree(folder / part, root / "refiner_diffusers" / part)
    shutil.copytree(folder / "text_encoder", root / "gemma3_12b")
    for item in (folder / "tokenizer").iterdir():
        shutil.copy(item, root / "gemma3_12b" / item.name)
    for spec in (root, root / "refiner_diffusers"):  # the checkpoint's root or its refiner folder
        loaded = load_refiner(resolve_refiner(str(spec), latent_channels=8), dtype=torch.float32)
        assert loaded.text_max_sequence_length == 1024  # diffusers' default (the layout has no model_index.json)
        loaded.text_max_sequence_length = original.text_max_sequence_length
        assert_same_refiner(loaded, original)


def test_strip_audio_keeps_the_video_forward():
    refiner = build_tiny_refiner(seed=4)
    clip = torch.randn(1, 8, 4, 4, 6, generator=torch.Generator().manual_seed(2))
    before = refine(refiner, clip)
    total = sum(p.numel() for p in refiner.transformer.parameters())
    removed = strip_audio(refiner.transformer)
    assert 0 < removed < total and sum(p.numel() for p in refiner.transformer.parameters()) == total - removed
    assert torch.equal(refine(refiner, clip), before)


def test_layer_streaming_gives_the_same_latents():
    """The group-offload wiring of --refiner-offload layers (on the CPU here: no stream, same device)."""
    pytest.importorskip("accelerate")  # diffusers' group offloading needs it, as --offload does
    refiner = build_tiny_refiner(seed=4)
    clip = torch.randn(1, 8, 4, 4, 6, generator=torch.Generator().manual_seed(2))
    before = refine(refiner, clip)
    assert not is_layer_streamed(refiner.transformer) and not is_layer_streamed(refiner.text_encoder)
    stream_layers(refiner, torch.device("cpu"), use_stream=False)
    assert is_layer_streamed(refiner.transformer) and is_layer_streamed(refiner.text_encoder)
    assert torch.equal(refine(refiner, clip), before)
    stream_layers(refiner, torch.device("cpu"), use_stream=False)  # placed again for a second render: a no-op
    assert torch.equal(refine(refiner, clip), before)


def test_layer_streaming_never_nests_streamed_offloads(monkeypatch):
    """diffusers 0.42.1 cannot stream (use_stream) an offload with nested block_modules, and offloads a
    nested model's embedding while the tied LM head still needs it: the transformer is offloaded as one
    flat block list, the text encoder one decoder layer at a time, the rest of it resident."""
    import diffusers.hooks

    calls = []
    monkeypatch.setattr(diffusers.hooks, "apply_group_offloading",
                        lambda module, **options: calls.append((module, options)))
    refiner = build_tiny_refiner(seed=4)
    stream_layers(refiner, torch.device("cpu"), use_stream=True)
    layers = [module for name, module in refiner.text_encoder.named_modules()
              if name.endswith("language_model.layers") or name == "model.layers"][0]
    assert [module for module, _ in calls] == [refiner.transformer, *layers]
    assert calls[0][1]["use_stream"] and all(not options["use_stream"] for _, options in calls[1:])
    assert all(options.get("block_modules") is None for _, options in calls)


def bad(spec, match, latent_channels=8):
    with pytest.raises(CamrenderError, match=match) as error:
        resolve_refiner(str(spec), latent_channels=latent_channels)
    assert "\n" not in str(error.value) and str(spec) in str(error.value)


def test_bad_folders(saved, tmp_path):
    folder, _ = saved
    bad(tmp_path / "missing", "refiner: refiner folder not found")
    bad(tmp_path, "not an LTX-2 refiner: no transformer/config.json")
    bad(folder, "refiner works on 8 latent channels but the VAE makes 128", latent_channels=128)
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    index = json.loads((other / "model_index.json").read_text())
    (other / "model_index.json").write_text(json.dumps({**index, "_class_name": "SanaWMPipeline"}))
    bad(other, "model_index.json is a SanaWMPipeline")
    (other / "model_index.json").unlink()
    config = json.loads((other / "transformer" / "config.json").read_text())
    (other / "transformer" / "config.json").write_text(json.dumps({**config, "_class_name": "SanaWMTransformer3DModel"}))
    bad(other, "its transformer is a SanaWMTransformer3DModel")
    (other / "transformer" / "config.json").write_text(json.dumps(config))
    shutil.rmtree(other / "text_encoder")
    bad(other, "no Gemma-3 text encoder")


def test_tiny_and_none():
    assert resolve_refiner("none") is None and resolve_refiner(None) is None
    assert resolve_refiner("tiny", latent_channels=8) == "tiny"
    with pytest.raises(CamrenderError, match="tiny refiner works on 8 latent channels.*--model tiny"):
        resolve_refiner("tiny", latent_channels=128)


def test_hub_id_download_failure_is_one_line(monkeypatch):
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise OSError("Cannot reach https://huggingface.co:\nconnection refused")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    assert resolve_refiner("Efficient-Large-Model/SANA-WM_streaming") == "Efficient-Large-Model/SANA-WM_streaming"
    with pytest.raises(CamrenderError) as error:
        load_refiner("Efficient-Large-Model/SANA-WM_streaming", dtype=torch.float32)
    message = str(error.value)
    assert message.startswith("Efficient-Large-Model/SANA-WM_streaming: refiner: cannot download the refiner")
    assert "\n" not in message and "connection refused" in message
