"""`python -m camrender ...` (what torchrun runs: `torchrun --nproc-per-node N -m camrender render ...`)."""
from camrender.cli.main import main

main()
