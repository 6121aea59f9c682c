"""Genesis v7.72.2 — SIMULATED stand-in (rigfleet sandbox); contains no Genesis code.

Runtime patcher for an installed (stand-in) vLLM: text patches replace anchors in the vllm
package's files with marker lines, which the stand-in engine reads back.
"""

GENESIS_RELEASE = "v7.72.2-sim"
SIMULATED = True
