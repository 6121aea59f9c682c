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
command -v patch >/dev/null 2>&1 || { printf 'rigfleet: the base image has no %s program, which the %s tree runs at apply time; install package %s in the base image\n' patch 'SNDR v12' patch >&2; exit 1; }
# Overlays over vllm's own files, then the SNDR v12 tree: kept in the image at its
# home and installed editable without dependencies (the way the tree itself installs); its vLLM
# plugin entry point must then be registered, or the workers would run vanilla vLLM.
if [ -d /tmp/rigfleet/overlays ]; then
  (cd /tmp/rigfleet/overlays && find . -type f -name '*.py' | while read -r f; do
    install -D -m 0644 "$f" "$VLLM_DIR/$f"; done)
fi
TREE=/opt/rigfleet/patch-tree
rm -rf "$TREE" && mkdir -p "$(dirname "$TREE")" && cp -a /tmp/rigfleet/genesis "$TREE"
python3 -m pip install --no-deps --no-index --find-links /tmp/rigfleet/wheels -e "$TREE"
python3 -c 'import sys; from importlib.metadata import entry_points; g, n, t = sys.argv[1:4]; found = [e.value for e in entry_points(group=g) if e.name == n]; sys.exit(0 if found == [t] else "rigfleet: plugin entry point %s %s is %s, the tree declares %s" % (g, n, found or "missing", t))' vllm.general_plugins genesis_v7 sndr.plugin:register
python3 -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1] + ".__main__") else "rigfleet: no module " + sys.argv[1] + " after the install")' sndr.apply
if [ "$#" -gt 0 ]; then
  python3 -m pip install --no-index --find-links /tmp/rigfleet/wheels -- "$@"
fi
chmod 0755 /usr/local/bin/rigfleet-entrypoint
rm -rf /tmp/rigfleet
