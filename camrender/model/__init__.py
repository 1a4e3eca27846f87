"""The model: stage 1 (`stage1/`, the SANA-WM DiT) and stage 2 (`refiner/`, the LTX-2 refiner), and what both
use here: the render's settings (`settings`), the device and dtype words (`device`), FP8 linears (`fp8`),
module adoption (`adopt`) and CUDA-graph replay (`graphs`)."""
