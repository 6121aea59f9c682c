"""Real-upstream knowledge of a pin set: the vLLM CLI surface from its release wheel and the patch
registry from its patch tree, derived by parsing their sources (nothing is imported or run)."""
