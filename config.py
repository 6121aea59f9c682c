"""pyinfra config file: pyinfra runs it first, from the directory it is started in, before it reads
`--data` itself. rigfleet checks the `--data` overrides here (a malformed one exits 2)."""
from rigfleet.context import check_cli_data as _check_cli_data

_check_cli_data()
