# SPDX-License-Identifier: Apache-2.0
"""netfaults.py: the W5 run's real faults below the processes: a network
partition between one worker and Redis, a G3 filesystem that is really
full, and a G3 device that is really slow (issue 23; docs/areas/cluster.md,
"Partition and real disk faults").

What and why. The other faults of the schedule act on processes (kill -9,
SIGTERM) or on the worker's own fault knobs. Two of issue 23's faults are
about the world around a process, and a knob only imitates them:
- a partition: the worker's packets to Redis no longer arrive, while its
  HTTP, NATS and everything else still work. Here it is real: the worker
  runs in a network namespace of its own, joined to the root namespace by a
  veth pair with addresses the run picks from 10.213.0.0/16 (a /29 nobody
  on the machine uses), and the cut is a route inside the namespace that
  sends Redis's address to a next hop that does not exist: its packets go
  nowhere, its connections time out, as through a dead switch. Healing
  deletes that route.
- a full disk: the worker's G3 directory is a tmpfs of its own, a little
  smaller than the G3 slot file (so the slot file's fallocate fails and the
  file grows as slots are written, like a sparse file on a real disk), and
  "full" is a ballast file that takes every free page: the next slot
  written fails with the filesystem's ENOSPC. Healing removes the ballast.
- a slow disk: the worker's G3 is an ext4 filesystem on a loop device and
  the worker runs in a blkio cgroup of its own; "slow" is the kernel's
  I/O throttle on that device for that cgroup (G3Slow).

All need root (CAP_NET_ADMIN, CAP_SYS_ADMIN). Without it, or without the
tools, they say why and the run goes on: the partition is skipped and said
"unavailable: <why>", G3 full and slow fall back to the worker's knobs and
are said "emulated: <why>". KVBM_W5_NO_NETNS=1 and KVBM_W5_NO_MOUNT=1 force
those fallbacks (the tests run both ways on one machine).

Teardown. Everything carries the orchestrator's pid in its name: namespace
`kvbmw5-PID`, veth `kw5PIDr` (root side) and `kw5PIDn`, tmpfs mounts with
source `kvbmw5-PID`, loop images `kvbmw5-PID-wK.img`, blkio cgroups
`kvbmw5-PID-wK`. Deleting the namespace deletes the veth pair and its
addresses with it; nothing else is changed in the root namespace (no
route, no rule). teardown() runs from the supervisor's stop (atexit, the
signal handlers, the watchdog). A run killed with -9 cannot tear down, so
every run first removes what runs whose pid is gone left behind
(cleanup_stale), before it picks its own addresses.
"""
import errno
import ipaddress
import os
import re
import shutil
import subprocess

PREFIX = "kvbmw5-"
BLKIO = "/sys/fs/cgroup/blkio"  # cgroup v1's block I/O controller (the slow G3)
RANGE = ipaddress.ip_network("10.213.0.0/16")


def _run(*cmd, timeout=10):
    """(ok, message) of one command."""
    try:
        r = subprocess.run(list(cmd), capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, "%s: %s" % (cmd[0], e)
    msg = (r.stderr or r.stdout).decode("utf-8", "replace").strip()
    return r.returncode == 0, msg


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _stale_pid(name):
    """The pid in a kvbmw5-PID[-SUFFIX] name when that process is gone,
    else None."""
    m = re.fullmatch(re.escape(PREFIX) + r"(\d+)(-[A-Za-z0-9.]+)?", name)
    if not m:
        return None
    pid = int(m.group(1))
    return None if pid == os.getpid() or _pid_alive(pid) else pid


def cleanup_stale(log=lambda *x: None):
    """Removes namespaces and tmpfs mounts of W5 runs that died without
    their teardown (kill -9). Returns what it removed."""
    gone = []
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        mounts = []
    for m in mounts:
        if len(m) >= 3 and m[2] == "tmpfs" and _stale_pid(m[0]) is not None:
            path = m[1].replace("\\040", " ")
            ok, msg = _run("umount", "-l", path)
            gone.append("mount %s%s" % (path, "" if ok else " (%s)" % msg))
    if shutil.which("ip"):
        ok, out = _run("ip", "netns", "list")
        for line in out.splitlines() if ok else []:
            name = line.split()[0] if line.split() else ""
            if _stale_pid(name) is not None:
                ok2, msg = _run("ip", "netns", "del", name)
                gone.append("netns %s%s" % (name, "" if ok2 else " (%s)" % msg))
    # slow G3s: the loop device's filesystem, the device, the blkio cgroup
    ok, out = _run("losetup", "-l", "-n", "-O", "NAME,BACK-FILE") if shutil.which("losetup") \
        else (False, "")
    for line in out.splitlines() if ok else []:
        f = line.split(None, 1)
        if len(f) == 2 and _stale_pid(os.path.basename(f[1].strip()).split(".img")[0]) is not None:
            for m in mounts:
                if len(m) >= 2 and m[0] == f[0]:
                    _run("umount", "-l", m[1])
            ok2, msg = _run("losetup", "-d", f[0])
            gone.append("loop %s%s" % (f[0], "" if ok2 else " (%s)" % msg))
    if os.path.isdir(BLKIO):
        for name in os.listdir(BLKIO):
            if _stale_pid(name) is not None:
                try:
                    os.rmdir(os.path.join(BLKIO, name))
                    gone.append("cgroup %s" % name)
                except OSError as e:
                    gone.append("cgroup %s (%s)" % (name, e))
    for g in gone:
        log("w5: removed a dead run's %s" % g)
    return gone


def _used_networks():
    """Every IPv4 network the machine has an address or a route in."""
    nets = []
    for cmd in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        ok, out = _run(*cmd)
        for tok in out.split() if ok else []:
            try:
                n = ipaddress.ip_network(tok, strict=False)
            except ValueError:
                continue
            if n.prefixlen > 0:
                nets.append(n)
    return nets


def pick_block(seed):
    """A /29 of 10.213.0.0/16 that overlaps no address or route here."""
    used = _used_networks()
    blocks = list(RANGE.subnets(new_prefix=29))
    for i in range(len(blocks)):
        b = blocks[(seed + i * 7919) % len(blocks)]
        if not any(b.overlaps(u) for u in used):
            return b
    raise OSError("no free /29 in %s" % RANGE)


class Partition:
    """One worker in a namespace of its own; Redis on an address the cut
    can take away from it alone.

    Addresses of the block B (a /29): B+1 root side of the veth (NATS and
    what the worker reaches besides Redis), B+2 the worker's side, B+3 Redis
    (a second address on the root side), B+4 the orchestrator's control
    calls to the worker (so that they are not counted with the load's,
    which come from B+1), B+5 the void next hop of the cut (never
    assigned)."""

    def __init__(self, log=lambda *x: None):
        self.log = log
        pid = os.getpid()
        self.ns = "%s%d" % (PREFIX, pid)
        self.veth_root, self.veth_ns = "kw5%dr" % pid, "kw5%dn" % pid
        self.available = None   # True, or "unavailable: why"
        self.cut_now = False
        self.made = False

    def setup(self):
        """True when the namespace is ready; else self.available says why."""
        why = None
        if os.environ.get("KVBM_W5_NO_NETNS"):
            why = "KVBM_W5_NO_NETNS is set"
        elif not shutil.which("ip"):
            why = "no ip command"
        elif os.geteuid() != 0:
            why = "not root (network namespaces need CAP_NET_ADMIN)"
        if why:
            self.available = "unavailable: " + why
            return False
        try:
            b = pick_block(os.getpid())
        except OSError as e:
            self.available = "unavailable: %s" % e
            return False
        h = [str(b.network_address + i) for i in range(8)]
        self.services, self.worker_addr, self.redis_addr, self.control_addr, self.void = \
            h[1], h[2], h[3], h[4], h[5]
        self.block = str(b)
        steps = [
            ("ip", "netns", "add", self.ns),
            ("ip", "link", "add", self.veth_root, "type", "veth", "peer", "name", self.veth_ns),
            ("ip", "link", "set", self.veth_ns, "netns", self.ns),
            ("ip", "addr", "add", self.services + "/29", "dev", self.veth_root),
            ("ip", "addr", "add", self.redis_addr + "/29", "dev", self.veth_root),
            ("ip", "addr", "add", self.control_addr + "/29", "dev", self.veth_root),
            ("ip", "link", "set", self.veth_root, "up"),
            ("ip", "-n", self.ns, "addr", "add", self.worker_addr + "/29", "dev", self.veth_ns),
            ("ip", "-n", self.ns, "link", "set", self.veth_ns, "up"),
            ("ip", "-n", self.ns, "link", "set", "lo", "up"),
        ]
        for s in steps:
            if s[:3] == ("ip", "link", "add"):
                self.made = True  # from here on teardown has something to do
            ok, msg = _run(*s)
            if s[:3] == ("ip", "netns", "add"):
                self.made = ok
            if not ok:
                self.teardown()
                self.available = "unavailable: `%s` failed: %s" % (" ".join(s), msg[:200])
                return False
        self.available = True
        return True

    def prefix(self):
        """What runs a command inside the namespace (its own mount
        namespace is not needed: nsenter enters the network one only)."""
        return ["nsenter", "--net=/run/netns/" + self.ns, "--"]

    def cut(self):
        """The worker's packets to Redis go to a next hop nobody has."""
        ok, msg = _run("ip", "-n", self.ns, "route", "add", self.redis_addr + "/32", "via", self.void,
                       "dev", self.veth_ns)
        if not ok:
            raise OSError("partition: %s" % msg)
        self.cut_now = True

    def heal(self):
        ok, msg = _run("ip", "-n", self.ns, "route", "del", self.redis_addr + "/32")
        if not ok:
            raise OSError("partition heal: %s" % msg)
        self.cut_now = False

    def describe(self):
        if self.available is not True:
            return self.available
        return {"namespace": self.ns, "block": self.block, "worker_addr": self.worker_addr,
                "services_addr": self.services, "redis_addr": self.redis_addr,
                "control_addr": self.control_addr, "cut": "route %s/32 via %s (no such host)" %
                (self.redis_addr, self.void)}

    def teardown(self):
        """Deletes the namespace (its end of the veth goes with it, and the
        root end with its addresses with that). Idempotent."""
        if not self.made:
            return
        _run("ip", "netns", "del", self.ns)
        _run("ip", "link", "del", self.veth_root)  # already gone unless the move failed
        self.made = False


class G3Disk:
    """A size-limited tmpfs as a worker's G3 directory, and its ballast."""

    def __init__(self, log=lambda *x: None):
        self.log = log
        self.source = "%s%d" % (PREFIX, os.getpid())
        self.mounts = []
        self.available = None  # True or "emulated: why"

    def usable(self):
        why = None
        if os.environ.get("KVBM_W5_NO_MOUNT"):
            why = "KVBM_W5_NO_MOUNT is set"
        elif os.geteuid() != 0:
            why = "not root (mounting a tmpfs needs CAP_SYS_ADMIN)"
        elif not shutil.which("mount"):
            why = "no mount command"
        self.available = True if why is None else "emulated: " + why
        return why is None

    def mount(self, path, size_bytes):
        """Mounts a tmpfs of size_bytes (rounded to pages) on path, mode
        0700; False (and self.available says why) when it fails."""
        ok, msg = _run("mount", "-t", "tmpfs", "-o", "size=%d,mode=0700" % size_bytes,
                       self.source, path)
        if not ok:
            self.available = "emulated: mount failed: %s" % msg[:200]
            return False
        self.mounts.append(path)
        return True

    def fill(self, path):
        """Writes a ballast file until the filesystem says ENOSPC; returns
        its size in bytes."""
        ballast = os.path.join(path, "w5-ballast")
        n = 0
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for chunk in (1 << 20, 4096):
                buf = b"\xa5" * chunk
                while True:
                    try:
                        w = os.write(fd, buf)
                    except OSError as e:
                        if e.errno in (errno.ENOSPC, errno.EDQUOT):
                            break
                        raise
                    n += w
                    if w < chunk:
                        break
        finally:
            os.close(fd)
        return n

    def unfill(self, path):
        try:
            os.unlink(os.path.join(path, "w5-ballast"))
        except FileNotFoundError:
            pass

    def free_bytes(self, path):
        s = os.statvfs(path)
        return s.f_bavail * s.f_frsize

    def teardown(self):
        for p in reversed(self.mounts):
            ok, msg = _run("umount", p)
            if not ok:
                _run("umount", "-l", p)
        self.mounts = []


def slot_file_bytes(blocks, block_bytes):
    """Size of the G3 slot file (src/volume/disk.c): a 4 KiB superblock and
    one slot per block, the block and its header rounded up to 4 KiB."""
    slot = (block_bytes + 64 + 4095) & ~4095
    return 4096 + blocks * slot


class G3Slow:
    """A worker's G3 on a real device whose I/O the kernel throttles.

    The G3 directory is an ext4 filesystem on a loop device over an image
    file of the run's directory (`kvbmw5-PID-wK.img`), and the worker runs
    in a blkio cgroup of its own (`kvbmw5-PID-wK`; it joins it before it
    execs, so every thread and io_uring worker it makes is in it). Slow is
    the cgroup's `blkio.throttle.read_iops_device` and `write_iops_device`
    for that loop device: 1000 / delay_ms operations a second (a 4 KiB
    slot is one operation), so each G3 read and write waits its turn at
    the block layer, as on a saturated disk; normal is the limit removed
    (0). Needs root, losetup, mkfs.ext4 and cgroup v1's blkio controller
    (this machine's; cgroup v2's io.max would be the same with another
    file)."""

    def __init__(self, log=lambda *x: None):
        self.log = log
        self.available = None  # True or "emulated: why"
        self.made = {}         # k -> {"img", "loop", "dir", "cg", "dev"}

    def usable(self):
        why = None
        if os.environ.get("KVBM_W5_NO_MOUNT"):
            why = "KVBM_W5_NO_MOUNT is set"
        elif os.geteuid() != 0:
            why = "not root (a loop device and a blkio cgroup need CAP_SYS_ADMIN)"
        elif not (shutil.which("losetup") and shutil.which("mkfs.ext4")):
            why = "no losetup or mkfs.ext4"
        elif not os.path.exists(os.path.join(BLKIO, "blkio.throttle.read_iops_device")):
            why = "no cgroup v1 blkio throttling at %s" % BLKIO
        self.available = True if why is None else "emulated: " + why
        return why is None

    def setup(self, k, path, size_bytes):
        """path (an empty directory) becomes an ext4 of size_bytes on a loop
        device; returns the command prefix that puts the worker in its
        cgroup, or None (self.available says why)."""
        name = "%s%d-w%d" % (PREFIX, os.getpid(), k)
        img = os.path.join(os.path.dirname(path), name + ".img")
        m = {"img": img, "dir": path, "cg": os.path.join(BLKIO, name)}
        self.made[k] = m
        try:
            with open(img, "wb") as f:
                f.truncate(size_bytes)
        except OSError as e:
            return self._fail(k, "image: %s" % e)
        ok, msg = _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", img,
                       timeout=60)
        if not ok:
            return self._fail(k, "mkfs.ext4: %s" % msg)
        ok, loop = _run("losetup", "-f", "--show", img)
        if not ok:
            return self._fail(k, "losetup: %s" % loop)
        m["loop"] = loop.strip()
        ok, msg = _run("mount", m["loop"], path)
        if not ok:
            return self._fail(k, "mount: %s" % msg)
        m["mounted"] = True
        os.chmod(path, 0o700)
        st = os.stat(m["loop"])
        m["dev"] = "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
        try:
            os.mkdir(m["cg"])
        except OSError as e:
            return self._fail(k, "cgroup: %s" % e)
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(m["cg"], "cgroup.procs")]

    def _fail(self, k, why):
        self.available = "emulated: %s" % why[:200]
        self._undo(k)
        return None

    def throttle(self, k, iops):
        """iops operations a second each way for worker k's G3 (0: none)."""
        m = self.made[k]
        for f in ("blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device"):
            with open(os.path.join(m["cg"], f), "w") as fh:
                fh.write("%s %d\n" % (m["dev"], iops))

    def _undo(self, k):
        m = self.made.pop(k, None)
        if not m:
            return
        if m.get("mounted"):
            ok, _ = _run("umount", m["dir"])
            if not ok:
                _run("umount", "-l", m["dir"])
        if m.get("loop"):
            _run("losetup", "-d", m["loop"])
        try:
            os.rmdir(m["cg"])
        except OSError:
            pass
        try:
            os.unlink(m["img"])
        except OSError:
            pass

    def teardown(self):
        for k in list(self.made):
            self._undo(k)
