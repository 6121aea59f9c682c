"""`python -m vllm ...` == the `vllm` console script (SIMULATED stand-in)."""

import sys

from vllm.entrypoints.cli.main import main

sys.exit(main())
