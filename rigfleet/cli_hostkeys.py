"""`rigfleet hostkeys`: what each rig presents against its known_hosts; `--record` for first contact only."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from rigfleet import hostkeys, rollout
from rigfleet.cli_common import err, user_errors
from rigfleet.hostkeys import MISMATCH, MISSING, OK, UNREACHABLE, Check, fingerprint
from rigfleet.loader import load_fleet
from rigfleet.paths import inventory_dir

out = Console(highlight=False, soft_wrap=True)

# Every `rigfleet` command that connects (status, repin, rollback) reports a refused host key with
# the way out: check the fingerprint with `rigfleet hostkeys`, then record it.
hostkeys.install_hints()

_STYLE = {OK: "green", MISSING: "yellow", MISMATCH: "bold red", UNREACHABLE: "red"}


def _line(result: Check) -> str:
    where = result.target
    shown = fingerprint(result.key) if result.key is not None else "-"
    detail = {
        OK: "",
        MISSING: f"  no entry in {where.known_hosts} (first contact)",
        MISMATCH: (f"  {where.known_hosts} has {fingerprint(result.known)}: possible man-in-the-middle, "
                   f"or a reinstalled rig" if result.known is not None else ""),
        UNREACHABLE: f"  {result.reason}",
    }[result.state]
    style = _STYLE[result.state]
    return f"{where.rig}  [{style}]{result.state}[/{style}]  {where.entry}  {shown}{detail}"


@click.command(name="hostkeys")
@click.argument("rigs", nargs=-1)
@click.option("--group", help="only rigs of this inventory group")
@click.option("--record", is_flag=True,
              help="append the key of every rig with no entry yet (first contact); never replaces a key")
@user_errors
def hostkeys_command(rigs: tuple[str, ...], group: str | None, record: bool) -> None:
    """Per rig: the SSH host key it presents against the known_hosts file it is checked with.

    ok, missing (no entry: first contact), MISMATCH (the entry differs) or unreachable. Exit 0 when
    every rig is ok (or, with --record, was recorded), 1 otherwise. Only the key exchange runs: no
    login, nothing on the rig changes.
    """
    fleet = load_fleet(inventory_dir())
    names = rollout.scope(fleet, group, rigs)
    results = hostkeys.check_all(fleet, names)
    for result in results:
        out.print(_line(result))
    missing = [r for r in results if r.state == MISSING]
    mismatched = [r for r in results if r.state == MISMATCH]
    if not record:
        if missing:
            out.print(f"\n{len(missing)} rig(s) with no known_hosts entry: compare the fingerprints above with "
                      "each rig's own, out of band (on the rig: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), "
                      "then run `rigfleet hostkeys --record` to append them.")
        for result in mismatched:
            err.print(hostkeys.refusal(result).replace("; not recorded", ""), markup=False)
        sys.exit(0 if all(r.state == OK for r in results) else 1)

    recorded = 0
    for result in missing:
        where = result.target
        assert result.key is not None
        if hostkeys.append(where.known_hosts, where.entry, result.key):
            recorded += 1
            out.print(f"recorded: {where.rig} {where.entry} {fingerprint(result.key)} in {where.known_hosts}",
                      markup=False)
        else:
            err.print(f"error: {where.rig}: not recorded: {where.known_hosts} gained an entry for {where.entry} "
                      "meanwhile. Fix: run `rigfleet hostkeys` again", markup=False)
    for result in mismatched:
        err.print(hostkeys.refusal(result), markup=False)
    if recorded:
        out.print(f"\n{recorded} key(s) recorded. Compare each fingerprint above with the rig's own, out of band; "
                  "if one differs, remove its line (ssh-keygen -f FILE -R HOST) before converging.")
    unreachable = [r for r in results if r.state == UNREACHABLE]
    sys.exit(0 if not mismatched and not unreachable and recorded == len(missing) else 1)
