"""pyinfra deploy: converge each rig with rigfleet's packaged deploy. `pyinfra inventory.py deploy.py`"""
from rigfleet.deploy import run

run()
