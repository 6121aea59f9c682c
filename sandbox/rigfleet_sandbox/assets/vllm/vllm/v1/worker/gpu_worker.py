"""GPU worker (SIMULATED stand-in): only carries Genesis anchor sites; nothing runs here."""

# Genesis anchors (the stand-in Genesis replaces each line with its marker):
# [anchor P1]
# [anchor P17]
# [anchor P23]
# [anchor P24]
# [anchor P31]
# [anchor P81]
# [anchor PN19]
# [anchor PN25]
# [anchor PN60]
# [anchor PN63]
