"""Custom pyinfra facts for the host layer: `command()` + `process()`, one small parser each.

Every command here is written so that it never fails the host (a failing fact command marks the
host failed in pyinfra): tools that may be missing are probed with `command -v`, and commands that
can fail report their exit status on a final `rc=N` line that the parser reads.
"""
