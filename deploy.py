"""pyinfra deploy entry file: converge every rig of the inventory (`pyinfra inventory.py deploy.py`)."""

from rigfleet.deploy import run

run()
