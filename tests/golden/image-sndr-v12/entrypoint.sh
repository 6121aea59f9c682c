#!/bin/sh
# rigfleet entrypoint for pin set sndr-v12: the SNDR v12 apply step (it needs the GPU, so
# it runs here and not at build time), then exec vllm serve with the compose command as arguments.
set -eu

if [ "${RIGFLEET_NEEDS_GENESIS:-0}" = "1" ]; then
  # A tree whose plugin is not registered boots plain vLLM in the workers ("silent vanilla").
  if ! python3 -c 'import sys; from importlib.metadata import entry_points; g, n, t = sys.argv[1:4]; sys.exit(0 if [e.value for e in entry_points(group=g) if e.name == n] == [t] else 1)' vllm.general_plugins genesis_v7 sndr.plugin:register; then
    echo "rigfleet: this variant needs the patch tree but its vLLM plugin entry point is not installed; refusing to start" >&2
    exit 3
  fi
  export GENESIS_VLLM_PIN_POLICY=strict
  python3 -m sndr.apply
fi

exec vllm serve "$@"
