"""pyinfra inventory: the rigs of ./inventory (RIGFLEET_INVENTORY overrides). `pyinfra inventory.py deploy.py`"""
from pathlib import Path as _Path

from rigfleet.inventory import groups as _groups

globals().update(_groups(_Path(__file__).resolve().parent / "inventory"))
