"""TurboQuant attention backend (SIMULATED stand-in of vllm/v1/attention/backends/turboquant_attn.py).

Upstream's spec-decode K+1 verify batches go through `_prefill_attention`, which on a hybrid model
with MTP produces the seed report's failure signature (`!` floods, first-word repetition, silent
empty replies, missed needles). Genesis P67 patches the flag below to route them to a multi-query
kernel that reads the compressed cache; the stand-in engine reads the flag after plugins load.
"""

from __future__ import annotations

_MULTI_QUERY_VERIFY_KERNEL = False  # [anchor P67]

# Upstream v0.20 already reserves the decode workspace before the cudagraph lock:
_tq_workspace_reserved_before_lock = True

# Genesis anchors (the stand-in Genesis replaces each line with its marker):
# [anchor P3]
# [anchor P5]
# [anchor P6]
# [anchor P18b]
# [anchor P20]
# [anchor P40]
# [anchor P51]
# [anchor P98]
# [anchor P101]
# [anchor PN14]
# [anchor PN26]
# [anchor PN57]


def multi_query_verify_kernel() -> bool:
    return _MULTI_QUERY_VERIFY_KERNEL
