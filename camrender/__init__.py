"""camrender: render videos along camera paths with SANA-WM and fused Triton kernels."""

__version__ = "0.1.0"


def patch_transformer(transformer, kernels: str = "fused", **kwargs):
    """Replace the attention of every GDN block in place; see `camrender.patch`."""
    from camrender.patch import patch_transformer as _patch

    return _patch(transformer, kernels=kernels, **kwargs)
