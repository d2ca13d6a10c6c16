"""Whether `/proc` hides other accounts' processes from a pod (`hidepid=2`).

Without it every pod reads every process's command line, the server's and other tenants' pods'
included (`ps`, `/proc/PID/cmdline`), and sees who runs what. With `hidepid=2` (`invisible`; or
`4`, `ptraceable`, stricter) a process sees only the processes of its own account; the group
named by `gid=` is exempt, so that group must be none of a pod account's (`gpupool-pods`, the pool
accounts' group, above all: pods drop supplementary groups, so only the primary one counts). The
agent, as root, sees every process either way. The check reads the mount table as the agent's
mount namespace, which its pods share, has it: the mount last listed on `/proc`, which hides the
ones below it.
"""

from __future__ import annotations

import grp
from dataclasses import dataclass

from gpupool.agent.identity import POD_GROUP

MOUNTINFO = "/proc/self/mountinfo"
REMEDY = ("mount -o remount,hidepid=2,gid=GROUP /proc as root (and add hidepid=2,gid=GROUP to "
          "/proc's options in /etc/fstab), GROUP being one for the tools that must see every "
          f"process and never {POD_GROUP}")
_HIDING = {"2", "invisible", "4", "ptraceable"}


@dataclass(frozen=True, slots=True)
class ProcMount:
    """The options of the procfs mounted on /proc (mount and superblock options together)."""

    hidepid: str
    """As written ('0', '2', 'invisible', ...); '' when the option is absent (nothing hidden)."""
    gid: int | None

    @property
    def hides(self) -> bool:
        return self.hidepid in _HIDING


def _unescape(field: str) -> str:
    """A mount table's path, whose space, tab, newline and backslash are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mountinfo(text: str) -> ProcMount | None:
    """The procfs on /proc as `/proc/self/mountinfo` (or `/proc/mounts`) text lists it; the last
    such mount wins (it hides those below). None when no procfs is mounted on /proc."""
    found: ProcMount | None = None
    for line in text.splitlines():
        fields = line.split()
        if "-" in fields[6:]:  # mountinfo: ID PARENT DEV ROOT POINT OPTS [TAGS...] - TYPE SOURCE SUPER
            dash = fields.index("-", 6)
            if len(fields) < dash + 4 or len(fields) < 6:
                continue
            point, fstype, options = fields[4], fields[dash + 1], f"{fields[5]},{fields[dash + 3]}"
        elif len(fields) >= 4:  # /proc/mounts: SOURCE POINT TYPE OPTS DUMP PASS
            point, fstype, options = fields[1], fields[2], fields[3]
        else:
            continue
        if _unescape(point) != "/proc" or fstype != "proc":
            continue
        hidepid, gid = "", None
        for option in options.split(","):
            key, _, value = option.partition("=")
            if key == "hidepid":
                hidepid = value
            elif key == "gid" and value.isdigit():
                gid = int(value)
        found = ProcMount(hidepid=hidepid, gid=gid)
    return found


def _pod_group_gid() -> int | None:
    try:
        return grp.getgrnam(POD_GROUP).gr_gid
    except KeyError:
        return None


def why_visible(mount: ProcMount | None, pod_gid: int | None) -> str:
    """'' when pods see only their own account's processes, else why not, with the remedy."""
    if mount is None:
        return f"no procfs is mounted on /proc here, so nothing can be said of it; {REMEDY}"
    if mount.hidepid in ("1", "noaccess"):
        return (f"/proc is mounted hidepid={mount.hidepid}, which hides other accounts' command lines "
                f"but still lists their processes and owners to every pod; {REMEDY}")
    if not mount.hides:
        shown = f"hidepid={mount.hidepid}" if mount.hidepid else "without hidepid"
        return (f"/proc is mounted {shown}, so every pod can read every process's command line, "
                f"the server's and other tenants' included; {REMEDY}")
    if mount.gid is not None and pod_gid is not None and mount.gid == pod_gid:
        return (f"/proc is mounted hidepid={mount.hidepid} but exempts gid {mount.gid}, {POD_GROUP}, "
                f"the group of every pool account, so pods still see every process; {REMEDY}")
    return ""


def proc_visibility(path: str = MOUNTINFO) -> str:
    """why_visible() for this machine's /proc ('' = hidden)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError as exc:
        return f"cannot read {path} ({exc.strerror or exc}); {REMEDY}"
    return why_visible(parse_mountinfo(text), _pod_group_gid())
