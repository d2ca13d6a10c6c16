"""The /proc check reads the mount table: hidepid=2 (or invisible, or the stricter ptraceable) hides
other accounts' processes from a pod; anything else, or an exemption of the pods' own group, does
not, and says how to remount."""

from __future__ import annotations

from pathlib import Path

from gpupool.agent.procfs import ProcMount, parse_mountinfo, proc_visibility, why_visible

ROOT = "22 1 0:5 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
PLAIN = ROOT + "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw\n"
# Linux 5.8 and later list procfs options per mount, among the superblock options.
INVISIBLE = ROOT + ("23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc "
                    "rw,hidepid=invisible,gid=1001\n")
# Older kernels: hidepid as a number.
NUMERIC = ROOT + "23 22 0:3 / /proc rw,relatime - proc proc rw,hidepid=2\n"
OTHER_PROC = ROOT + ("23 22 0:21 / /proc rw - proc proc rw\n"
                     "40 22 0:40 / /srv/chroot/proc rw - proc proc rw,hidepid=2\n"
                     "41 22 0:41 / /proc\\040x rw - proc proc rw,hidepid=2\n")
STACKED = INVISIBLE + "50 23 0:50 / /proc rw,relatime - proc proc rw,hidepid=0\n"
OPTIONAL_FIELDS = ROOT + ("23 22 0:21 / /proc rw shared:13 master:2 propagate_from:3 - proc proc "
                          "rw,hidepid=ptraceable\n")
MOUNTS = "sysfs /sys sysfs rw 0 0\nproc /proc proc rw,nosuid,relatime,hidepid=2,gid=27 0 0\n"


def test_the_proc_mount_and_its_hidepid_are_read_from_mountinfo_or_mounts() -> None:
    assert parse_mountinfo(PLAIN) == ProcMount(hidepid="", gid=None)
    assert parse_mountinfo(INVISIBLE) == ProcMount(hidepid="invisible", gid=1001)
    assert parse_mountinfo(NUMERIC) == ProcMount(hidepid="2", gid=None)
    assert parse_mountinfo(OPTIONAL_FIELDS) == ProcMount(hidepid="ptraceable", gid=None)
    assert parse_mountinfo(MOUNTS) == ProcMount(hidepid="2", gid=27)
    assert parse_mountinfo(OTHER_PROC) == ProcMount(hidepid="", gid=None)  # only /proc itself counts
    assert parse_mountinfo(STACKED) == ProcMount(hidepid="0", gid=None)  # the top mount wins
    assert parse_mountinfo(ROOT) is None
    assert parse_mountinfo("garbage\n\n1 2\n") is None


def test_only_a_hiding_proc_that_does_not_exempt_the_pods_group_is_enforced() -> None:
    for text in (INVISIBLE, NUMERIC, OPTIONAL_FIELDS, MOUNTS):
        assert why_visible(parse_mountinfo(text), pod_gid=995) == ""
    for text, words in ((PLAIN, "without hidepid"), (STACKED, "hidepid=0"), (ROOT, "no procfs"),
                        (ROOT + "23 22 0:3 / /proc rw - proc proc rw,hidepid=1\n", "still lists")):
        why = why_visible(parse_mountinfo(text), pod_gid=995)
        assert words in why and "mount -o remount,hidepid=2,gid=GROUP /proc" in why, why
    exempt = why_visible(parse_mountinfo(INVISIBLE), pod_gid=1001)
    assert "exempts gid 1001" in exempt and "gpupool-pods" in exempt


def test_this_machine_is_checked_from_its_mount_table(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(NUMERIC)
    assert proc_visibility(str(table)) == ""
    table.write_text(PLAIN)
    assert "without hidepid" in proc_visibility(str(table))
    assert "cannot read" in proc_visibility(str(tmp_path / "missing"))
