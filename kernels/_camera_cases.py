"""Inputs, op call and reference of the camera ops' cases in kernels/cases.py: the delta scan, the GDN blocks'
camera branch and its prep and decode, and the softmax blocks' camera encode and decode.

Each `<op>_call(x, backend, matmul_precision)` runs the op on `backend`; each `<op>_reference(x)` its `<op>_ref` on
fp32 copies of the activations. The stateful ops take an initial state and return their final state."""
from ._random_inputs import Draw, middle_segment_start
from .cam_decode import cam_decode
from .cam_decode_reference import cam_decode_ref
from .cam_prep import cam_prep
from .cam_prep_reference import cam_prep_ref
from .camera_branch import camera_branch
from .camera_branch_reference import camera_branch_ref
from .delta_scan import delta_scan
from .delta_scan_reference import delta_scan_ref
from .softmax_cam import cam_softmax_decode, cam_softmax_encode
from .softmax_cam_reference import cam_softmax_decode_ref, cam_softmax_encode_ref


def floats(x: dict, *names) -> dict:
    """x with the tensors `names` as fp32 copies (the references' inputs)."""
    return dict(x, **{name: x[name].float() for name in names})


# ----------------------------------------------------------------------------- delta scan
def scan_inputs(s, device, dtype):
    d = Draw(1, device, dtype)
    shape = (s.batch, s.heads, s.frames, s.spatial, s.dim)
    return dict(q=d.randn(shape, 0.3), k=d.randn(shape, 0.3), v=d.randn(shape),
                beta=d.rand(shape[:-1]), decay=d.rand(shape[:3], 0.5, 1.0, activation=False),
                initial_state=d.randn((s.batch, s.heads, s.dim, s.dim), 0.1, activation=False),
                segment_starts=middle_segment_start(s.frames, device))


def scan_call(x, backend, matmul_precision):
    return delta_scan(**x, output_final_state=True, matmul_precision=matmul_precision, backend=backend)


def scan_reference(x):
    return delta_scan_ref(**floats(x, "q", "k", "v", "beta"), output_final_state=True)


# ----------------------------------------------------------------------------- GDN camera branch
def camera_inputs(s, device, dtype):
    d = Draw(2, device, dtype)
    shape = (s.batch, s.tokens, s.heads, s.dim)
    return dict(q=d.randn(shape), k=d.randn(shape), v=d.randn(shape),
                beta=d.rand((s.batch, s.heads, s.frames, s.spatial)),
                decay=d.rand((s.batch, s.heads, s.frames), 0.5, 1.0, activation=False),
                rays=d.rays(s.batch, s.tokens, s.dim),
                q_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False),
                k_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False),
                initial_state=d.randn((s.batch, s.heads, s.dim, s.dim), 0.1, activation=False),
                num_frames=s.frames)


def cam_prep_call(x, backend, matmul_precision):
    return cam_prep(x["q"], x["k"], x["v"], x["rays"], num_frames=x["num_frames"],
                    q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"], backend=backend)


def cam_prep_reference(x):
    x = floats(x, "q", "k", "v")
    return cam_prep_ref(x["q"], x["k"], x["v"], x["rays"], num_frames=x["num_frames"],
                        q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"])


def camera_branch_call(x, backend, matmul_precision, downscale=True):
    return camera_branch(x["q"], x["k"], x["v"], x["beta"], x["decay"], x["rays"],
                         q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"],
                         initial_state=x["initial_state"], downscale=downscale, matmul_precision=matmul_precision,
                         backend=backend, output_final_state=True)


def camera_branch_reference(x, downscale=True):
    x = floats(x, "q", "k", "v", "beta")
    return camera_branch_ref(x["q"], x["k"], x["v"], x["beta"], x["decay"], x["rays"],
                             q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"],
                             initial_state=x["initial_state"], downscale=downscale, output_final_state=True)


def cam_decode_inputs(s, device, dtype):
    d = Draw(3, device, dtype)
    p, _, _, rope = d.rays(s.batch, s.tokens, s.dim)
    return dict(x=d.randn((s.batch, s.heads, s.tokens, s.dim)), p=p, rope_cam=rope)


def cam_decode_call(x, backend, matmul_precision):
    return cam_decode(x["x"], x["p"], x["rope_cam"], backend=backend)


def cam_decode_reference(x):
    return cam_decode_ref(x["x"].float(), x["p"], x["rope_cam"])


# ----------------------------------------------------------------------------- softmax blocks' camera SDPA
def softmax_encode_inputs(s, device, dtype):
    d = Draw(5, device, dtype)
    shape = (s.batch, s.tokens, s.channels)
    return dict(q=d.randn(shape), k=d.randn(shape), v=d.randn(shape), rays=d.rays(s.batch, s.tokens, s.dim),
                q_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False),
                k_norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False), heads=s.heads)


def softmax_encode_call(x, backend, matmul_precision):
    return cam_softmax_encode(x["q"], x["k"], x["v"], x["rays"], heads=x["heads"], q_norm_weight=x["q_norm_weight"],
                              k_norm_weight=x["k_norm_weight"], backend=backend)


def softmax_encode_reference(x):
    x = floats(x, "q", "k", "v")
    return cam_softmax_encode_ref(x["q"], x["k"], x["v"], x["rays"], heads=x["heads"],
                                  q_norm_weight=x["q_norm_weight"], k_norm_weight=x["k_norm_weight"])


def softmax_decode_inputs(s, device, dtype):
    d = Draw(6, device, dtype)
    return dict(o=d.randn((s.batch, s.heads, s.tokens, 128)), rays=d.rays(s.batch, s.tokens, s.dim), dim=s.dim)


def softmax_decode_call(x, backend, matmul_precision):
    return cam_softmax_decode(x["o"], x["rays"], dim=x["dim"], backend=backend)


def softmax_decode_reference(x):
    return cam_softmax_decode_ref(x["o"].float(), x["rays"], dim=x["dim"])
