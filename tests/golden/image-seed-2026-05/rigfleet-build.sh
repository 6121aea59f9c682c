#!/bin/sh
# rigfleet image build step (run by the Dockerfile's exec-form RUN, so no value of the pin set is
# ever parsed by a shell): $1 is the vLLM version the pin set expects, the other arguments are
# pinned Python requirements (NAME==VERSION) installed from the verified wheels only.
set -eu
expected="$1"; shift
VLLM_DIR="$(python3 -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("vllm").origin))')"
found="$(python3 -c 'import vllm; print(vllm.__version__)')"
if [ "$found" != "$expected" ]; then
  printf 'rigfleet: base image carries vllm %s, pin set says %s\n' "$found" "$expected" >&2
  exit 1
fi
# Overlays over vllm's own files, then the Genesis package and its vLLM plugin (non-editable, so
# the entry point exists).
if [ -d /tmp/rigfleet/overlays ]; then
  (cd /tmp/rigfleet/overlays && find . -type f -name '*.py' | while read -r f; do
    install -D -m 0644 "$f" "$VLLM_DIR/$f"; done)
fi
if [ -d /tmp/rigfleet/genesis/vllm/_genesis ]; then
  rm -rf "$VLLM_DIR/_genesis" && cp -a /tmp/rigfleet/genesis/vllm/_genesis "$VLLM_DIR/_genesis"
  if [ -d /tmp/rigfleet/genesis/tools/genesis_vllm_plugin ]; then
    python3 -m pip install --no-deps --no-index --no-build-isolation /tmp/rigfleet/genesis/tools/genesis_vllm_plugin
  fi
fi
if [ "$#" -gt 0 ]; then
  python3 -m pip install --no-index --find-links /tmp/rigfleet/wheels -- "$@"
fi
chmod 0755 /usr/local/bin/rigfleet-entrypoint
rm -rf /tmp/rigfleet
