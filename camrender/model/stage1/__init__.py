"""Stage 1, the SANA-WM DiT: loading (hub id, folder, original-format weights), the tiny offline model, the
checkpoint recipes, and the patched transformer (blocks, GDN and softmax attentions, FFN) with its one
transformer-level forward (`segments.segment_forward`), the per-block state and the RoPE / UCPE tables."""
