#!/bin/sh
# rigfleet entrypoint for pin set seed-2026-05: Genesis apply_all (it needs the GPU, so it
# runs here and not at build time), then exec vllm serve with the compose command as arguments.
set -eu

if [ "${RIGFLEET_NEEDS_GENESIS:-0}" = "1" ]; then
  VLLM_DIR="$(python3 -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("vllm").origin))')"
  if [ ! -f "$VLLM_DIR/_genesis/patches/apply_all.py" ]; then
    # Without this check the engine would boot unpatched and fail later with a cryptic
    # "TurboQuant KV not supported for hybrid models" (or serve garbage).
    echo "rigfleet: this variant needs Genesis but $VLLM_DIR/_genesis is missing; refusing to start" >&2
    exit 3
  fi
  export GENESIS_VLLM_PIN_POLICY=strict
  python3 -m vllm._genesis.patches.apply_all
fi

exec vllm serve "$@"
