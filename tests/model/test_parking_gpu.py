"""Parked weights on a GPU (`python3 -m pytest -m gpu`): they leave the GPU's memory for page-locked CPU memory,
visit it for a call and give the same bits; the refiner's render on CUDA equals its unparked render."""
import pytest
import torch

from camrender.model import parking

pytestmark = pytest.mark.gpu


def allocated() -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def test_parked_linear_leaves_the_gpu_and_computes_the_same():
    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 2048, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    expected = linear(x)
    before = allocated()
    assert parking.park(linear)
    assert before - allocated() == (1024 * 2048 + 2048) * 2  # the weight and bias are off the GPU
    assert linear.weight.device.type == "cpu" and linear.weight.is_pinned()
    assert torch.equal(linear(x), expected)
    assert linear.weight.device.type == "cpu" and before - allocated() >= (1024 * 2048 + 2048) * 2
    linear.to("cuda")  # back for good: the wrapper runs it in place
    assert linear.weight.device.type == "cuda" and torch.equal(linear(x), expected)


def test_refiner_on_cuda_equals_its_unparked_render(monkeypatch):
    from camrender.model.refiner.stream import RefinerStream, encode_refiner_prompt
    from camrender.model.refiner.tiny import build_tiny_refiner

    clip = torch.randn(1, 8, 10, 4, 6, generator=torch.Generator().manual_seed(5)).cuda()
    outputs = {}
    for parked in (False, True):
        with monkeypatch.context() as patch:
            if not parked:
                patch.setattr(parking, "PARKED_DEVICE_TYPES", ())
            refiner = build_tiny_refiner(seed=3)
            refiner.transformer.to("cuda")
            text = encode_refiner_prompt(refiner, "a sunlit room", "cuda", torch.float32)
            stream = RefinerStream(refiner, text, fps=16.0, generator=torch.Generator().manual_seed(0))
            outputs[parked] = torch.cat([stream.push(clip[:, :, :4]), stream.push(clip[:, :, 4:]), stream.finish()],
                                        dim=2)
            to_k = refiner.transformer.transformer_blocks[0].attn2.to_k
            assert parking.is_parked(to_k) == parked and to_k.weight.device.type == ("cpu" if parked else "cuda")
    assert torch.equal(outputs[True], outputs[False])
