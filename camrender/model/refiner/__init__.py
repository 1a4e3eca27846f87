"""Stage 2, the SANA-WM refiner (diffusers' LTX-2 `SanaWMLTX2Refiner`): loading and placement, the tiny offline
refiner, the block-by-block stream over stage 1's latents (`stream.RefinerStream`) and its fused path (adaLN
glue in `block`, the self-attention processor in `attention`, the [sink | history | current] KV `window`)."""
