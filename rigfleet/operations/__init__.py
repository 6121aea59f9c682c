"""Custom pyinfra operations for the host layer, in pyinfra's style: small generators that read
facts at execute time, call `host.noop(...)` when there is nothing to do, and yield commands.

None of them raises OperationError (that aborts the run for every rig): a rig that must stop
gets a failing command or a failing callback, which fails that rig only.
"""
