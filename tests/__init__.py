"""rigfleet's test tiers: unit, plan and sandbox."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout: deploy.py, inventory.py, inventory/
