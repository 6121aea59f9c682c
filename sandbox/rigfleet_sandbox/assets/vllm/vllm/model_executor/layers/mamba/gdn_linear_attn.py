"""Gated-DeltaNet linear attention (SIMULATED stand-in): only carries Genesis anchor sites."""

# Genesis anchors (the stand-in Genesis replaces each line with its marker):
# [anchor P7]
# [anchor P28]
# [anchor P34]
# [anchor P39a]
# [anchor P46]
# [anchor P60]
# [anchor P60B]
# [anchor P103]
# [anchor PN11]
# [anchor PN30]
# [anchor PN32]
# [anchor PN50]
# [anchor PN54]
# [anchor PN55]
# [anchor PN59]
