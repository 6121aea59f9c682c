"""The `vllm` console script (SIMULATED stand-in): `vllm serve ...`, `vllm --version`."""

from __future__ import annotations

import sys

from vllm import __version__

USAGE = "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ..."


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        print("\nvLLM CLI (SIMULATED stand-in, rigfleet sandbox). Only `serve` does anything.")
        return 0 if argv else 2
    if argv[0] in ("-v", "--version"):
        print(__version__)
        return 0
    if argv[0] == "serve":
        from vllm.entrypoints.openai.api_server import run_server

        return run_server(argv[1:])
    if argv[0] == "collect-env":
        from vllm._sim import platform

        print(f"vLLM Version: {__version__} (SIMULATED stand-in)")
        print(f"GPU models and configuration: {platform.visible_gpu_count()}x {platform.DEVICE_NAME}")
        return 0
    print(USAGE, file=sys.stderr)
    print(
        f"vllm: error: argument subparser: invalid choice: '{argv[0]}' (choose from 'chat', 'complete', "
        "'serve', 'bench', 'collect-env', 'run-batch')",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
