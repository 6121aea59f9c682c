"""Genesis vLLM plugin (SIMULATED stand-in): vLLM calls register() in every process it starts.

Text patches made here land after the API server imported its modules (the v7.70 "F2" finding),
which is why the entrypoint must still run the apply_all pre-pass before `exec vllm serve`.
"""

from __future__ import annotations

import os


def register() -> None:
    if os.environ.get("GENESIS_DISABLE", "") == "1":
        print("[Genesis plugin] GENESIS_DISABLE=1: not registering", flush=True)
        return
    if os.environ.get("GENESIS_FORCE_MARLIN_W8A16", "") == "1":
        kernels = [k for k in os.environ.get("VLLM_DISABLED_KERNELS", "").split(",") if k]
        if "AllSparkLinearKernel" not in kernels:
            os.environ["VLLM_DISABLED_KERNELS"] = ",".join([*kernels, "AllSparkLinearKernel"])
    try:
        from vllm._genesis.patches.apply_all import run
    except ImportError:
        print(
            "[Genesis plugin] vllm._genesis is not installed in the vllm package: nothing to register",
            flush=True,
        )
        return
    run(quiet=True, source="plugin register()", dry_run=os.environ.get("GENESIS_WIRING_APPLY", "1") == "0")
