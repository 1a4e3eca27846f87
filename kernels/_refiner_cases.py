"""Inputs, op call and reference of the refiner kernels' cases in kernels/cases.py (the refiner's q/k RMSNorm +
RoPE and RoPE alone, kernels.rms_rope, and block_glue's norm="rms" adaLN in `_glue_cases`)."""
from ._random_inputs import Draw
from .rms_rope import rms_rope_qk, rope_rows
from .rms_rope_reference import rms_rope_qk_ref, rope_rows_ref


def rms_rope_inputs(s, device, dtype, rope_type="interleaved"):
    """q, k (B, N, C) as GEMM outputs, RMSNorm weights (C,), fp32 cos/sin in diffusers' layout for rope_type."""
    d = Draw(9, device, dtype)
    tokens = (s.batch, s.tokens, s.channels)
    angles = d.rand((s.batch, s.tokens, s.channels // 2), 0.0, 6.3, activation=False)
    if rope_type == "interleaved":
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    else:  # (B, H, N, D/2) views, as diffusers' split RoPE
        per_head = angles.reshape(s.batch, s.tokens, s.heads, -1)
        cos, sin = per_head.cos().swapaxes(1, 2), per_head.sin().swapaxes(1, 2)
    return dict(q=d.randn(tokens, 3.0), k=d.randn(tokens), wq=d.randn((s.channels,), 0.2, activation=False) + 1,
                wk=d.randn((s.channels,), 0.2, activation=False) + 1, cos=cos, sin=sin, head_dim=s.dim,
                rope_type=rope_type)


def rms_rope_call(x, backend, matmul_precision):
    return rms_rope_qk(x["q"], x["k"], x["wq"].to(x["q"].dtype), x["wk"].to(x["q"].dtype), x["cos"], x["sin"],
                       eps=1e-6, head_dim=x["head_dim"], rope_type=x["rope_type"], return_k_pre=True,
                       backend=backend)


def rms_rope_reference(x):
    return rms_rope_qk_ref(x["q"].float(), x["k"].float(), x["wq"], x["wk"], x["cos"], x["sin"], eps=1e-6,
                           rope_type=x["rope_type"])


def rope_rows_call(x, backend, matmul_precision):
    return rope_rows(x["k"], x["cos"], x["sin"], head_dim=x["head_dim"], rope_type=x["rope_type"], backend=backend)


def rope_rows_reference(x):
    return rope_rows_ref(x["k"].float(), x["cos"], x["sin"], rope_type=x["rope_type"])
