"""Inputs, op call and reference of the GDN main branch's cases in kernels/cases.py: the gates, the K short
convolution, the q / k prep and the whole branch (`_camera_cases` says how a call and a reference are made)."""
from ._camera_cases import floats
from ._random_inputs import Draw, middle_segment_start
from .gdn_gates import gdn_gates
from .gdn_gates_reference import gdn_gates_ref
from .main_branch import main_branch
from .main_branch_reference import main_branch_ref
from .main_prep import main_prep
from .main_prep_reference import main_prep_ref
from .short_conv import short_conv
from .short_conv_reference import short_conv_ref


def main_inputs(s, device, dtype):
    """A block's raw q (x) and the branch's k, v, beta, decay; the short conv's weight and cached frames (segment
    mode's left context); the RMSNorm weight, RoPE table and the branch's forward states (kv, z) with a cut."""
    d = Draw(4, device, dtype)
    shape = (s.batch, s.tokens, s.channels)
    x = dict(x=d.randn(shape), weight=d.randn((s.channels, 1, 4), 0.5, activation=False),
             norm_weight=d.rand((s.channels,), 0.5, 1.5, activation=False), rope=d.rope(s.tokens, s.dim // 2),
             frames=s.frames, heads=s.heads, dim=s.dim)
    x.update(k=d.randn(shape), v=d.randn(shape), beta=d.rand((s.batch, s.heads, s.frames, s.spatial)),
             decay=d.rand((s.batch, s.heads, s.frames), 0.5, 1.0, activation=False),
             context=d.randn((s.batch, 3 * s.spatial, s.channels)))
    x.update(states=(d.randn((s.batch, s.heads, s.dim, s.dim), 0.1, activation=False),
                     d.rand((s.batch, s.heads, s.dim, 1), activation=False)),
             segment_starts=middle_segment_start(s.frames, device))
    return x


def short_conv_call(x, backend, matmul_precision, state=False):
    out, final = short_conv(x["x"], x["weight"], x["frames"], initial_state=x["context"] if state else None,
                            output_final_state=state, backend=backend)
    return (out, final) if state else out


def short_conv_reference(x, state=False):
    x = floats(x, "x", "context")
    out, final = short_conv_ref(x["x"], x["weight"], x["frames"], initial_state=x["context"] if state else None,
                                output_final_state=state)
    return (out, final) if state else out


def main_prep_call(x, backend, matmul_precision):
    return main_prep(x["x"], x["norm_weight"], x["heads"], scale=x["dim"] ** -0.5, rope=x["rope"], backend=backend)


def main_prep_reference(x):
    return main_prep_ref(x["x"].float(), x["norm_weight"], x["heads"], scale=x["dim"] ** -0.5, rope=x["rope"])


def _branch_arguments(x):
    return dict(q_norm_weight=x["norm_weight"], k_norm_weight=x["norm_weight"], initial_state=x["states"],
                segment_starts=x["segment_starts"], output_final_state=True)


def main_branch_call(x, backend, matmul_precision):
    return main_branch(x["x"], x["k"], x["v"], x["beta"], x["decay"], x["rope"], **_branch_arguments(x),
                       matmul_precision=matmul_precision, backend=backend)


def main_branch_reference(x):
    x = floats(x, "x", "k", "v", "beta")
    return main_branch_ref(x["x"], x["k"], x["v"], x["beta"], x["decay"], x["rope"], **_branch_arguments(x))


def gates_inputs(s, device, dtype):
    """A GDN block's input (B, N, C), its per-head projections (H, C) and the decay's constants (H,), in the order of
    `gdn_gates`' arguments after x and the frame count."""
    d = Draw(9, device, dtype)
    per_head, weight = (s.heads,), (s.heads, s.channels)
    gates = (d.randn(weight, s.channels ** -0.5, activation=False), d.randn(per_head, activation=False),
             d.randn(weight, 4 * s.channels ** -0.5, activation=False), d.randn(per_head, activation=False),
             -d.rand(per_head, 0.1, 3.0, activation=False), d.randn(per_head, activation=False))
    return dict(x=d.randn((s.batch, s.tokens, s.channels)), frames=s.frames, gates=gates)


def gates_call(x, backend, matmul_precision):
    return gdn_gates(x["x"], x["frames"], *x["gates"], backend=backend, matmul_precision=matmul_precision)


def gates_reference(x):
    return gdn_gates_ref(x["x"].float(), x["frames"], *x["gates"])
