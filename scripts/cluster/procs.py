# SPDX-License-Identifier: Apache-2.0
"""procs.py: the processes of a W5 cluster run, started and always stopped.

A cluster run starts a dozen servers; whatever happens to the run (an
exception, Ctrl-C, SIGTERM, the orchestrator itself killed), none may
outlive it, or the next run (or the next engineer's test) meets busy ports
and stale stores. So every child:
- runs in a process group of its own (start_new_session), so a stop kills
  what it forked too;
- is started with PR_SET_PDEATHSIG = SIGKILL, so the kernel kills it when
  the orchestrator dies, even by kill -9 (the one case atexit cannot see);
- is stopped by Supervisor.stop_all (SIGTERM to its group, SIGKILL after a
  grace period), which atexit, the SIGTERM/SIGINT handlers and the run's
  wall-clock watchdog all call; its on_stop hooks then remove what is not a
  process (netfaults.py: the partition's namespace, the tmpfs mounts).
The supervisor also records every death (scheduled by the fault schedule
or not: the `crashed` invariant) and samples each process's peak resident
set (VmHWM) once a second while it lives, since a killed process's peak
goes with it.
"""
import atexit
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _child_setup():
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_port():
    """A loopback port nobody listens on now (the child binds it next)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def free_redis_port(rng=None):
    """A port P <= 55535 with P and P + 10000 free: Redis Cluster listens on
    P and talks to its peers on P + 10000 (it refuses to start above)."""
    import random
    rng = rng or random.Random()
    for _ in range(200):
        p = rng.randrange(20000, 55535)
        socks = []
        try:
            for q in (p, p + 10000):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError("no free port pair for Redis Cluster")


def wait_port(port, deadline, proc=None, host="127.0.0.1"):
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def vmhwm_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Proc:
    def __init__(self, name, cmd, log, budget_mb, env=None, clean_rcs=(0, -15, -9)):
        self.name, self.cmd, self.log_path, self.budget_mb, self.env = name, cmd, log, budget_mb, env
        self.clean_rcs = list(clean_rcs)  # exits that are clean at the stop
        self.popen = None
        self.expect_death = False  # the schedule is killing it
        self.starts = 0

    def alive(self):
        return self.popen is not None and self.popen.poll() is None


class Supervisor:
    def __init__(self, workdir, log=print):
        self.dir = workdir
        self.procs = {}
        self.deaths = []      # {"process", "rc", "scheduled", "at_stop", "t"}
        self.peaks = {}       # name -> VmHWM kB (the largest of its lives)
        self.lock = threading.RLock()
        self.stopping = False
        self.log = log
        self.on_stop = []     # called once every process has ended (netfaults' teardown)
        self.t0 = time.time()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        atexit.register(self.stop_all)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, sig, frame):
        self.stop_all()
        raise SystemExit(128 + sig)

    def start(self, name, cmd, budget_mb, env=None, cwd=None, clean_rcs=(0, -15, -9)):
        with self.lock:
            p = self.procs.get(name)
            if p is None:
                p = Proc(name, cmd, os.path.join(self.dir, "log", name + ".log"), budget_mb, env,
                         clean_rcs)
                self.procs[name] = p
            assert not p.alive(), name + " is running"
            os.makedirs(os.path.dirname(p.log_path), exist_ok=True)
            logf = open(p.log_path, "ab")
            p.popen = subprocess.Popen(p.cmd, stdout=logf, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       preexec_fn=_child_setup, env=p.env, cwd=cwd)
            logf.close()
            p.expect_death = False
            p.starts += 1
            return p

    def stop(self, name, grace=10.0):
        """The schedule's graceful stop (SIGTERM, SIGKILL after grace):
        recorded as scheduled."""
        with self.lock:
            p = self.procs[name]
            p.expect_death = True
            if p.alive():
                try:
                    os.killpg(p.popen.pid, signal.SIGTERM)
                    p.popen.wait(timeout=grace)
                except ProcessLookupError:
                    pass
                except subprocess.TimeoutExpired:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                    p.popen.wait()
            self._reap(p, at_stop=False)

    def kill9(self, name):
        """The schedule's kill -9: the death is recorded as scheduled."""
        with self.lock:
            p = self.procs[name]
            p.expect_death = True
            if p.alive():
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
            self._reap(p, at_stop=False)

    def _reap(self, p, at_stop):
        rc = p.popen.returncode
        if rc is None or getattr(p.popen, "_w5_reaped", False):
            return
        p.popen._w5_reaped = True
        self.deaths.append({"process": p.name, "rc": rc, "scheduled": p.expect_death,
                            "at_stop": at_stop, "clean_rcs": p.clean_rcs,
                            "t": round(time.time() - self.t0, 3)})

    def poll_deaths(self):
        """Records processes that exited since the last call; returns the
        unscheduled ones (names)."""
        out = []
        with self.lock:
            if self.stopping:
                return out
            for p in self.procs.values():
                if p.popen is not None and p.popen.poll() is not None:
                    before = len(self.deaths)
                    self._reap(p, at_stop=False)
                    if len(self.deaths) > before and not p.expect_death:
                        out.append(p.name)
        return out

    def _sample(self):
        while True:
            with self.lock:
                for p in list(self.procs.values()):
                    if p.alive():
                        v = vmhwm_kb(p.popen.pid)
                        if v is not None and v > self.peaks.get(p.name, 0):
                            self.peaks[p.name] = v
            time.sleep(1.0)

    def budgets(self):
        return {p.name: p.budget_mb for p in self.procs.values()}

    def stop_all(self, grace=5.0):
        with self.lock:
            if self.stopping:
                return
            self.poll_deaths()
            self.stopping = True
            live = [p for p in self.procs.values() if p.alive()]
            for p in live:  # one last peak sample before they go
                v = vmhwm_kb(p.popen.pid)
                if v is not None and v > self.peaks.get(p.name, 0):
                    self.peaks[p.name] = v
            for p in live:
                try:
                    os.killpg(p.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            end = time.time() + grace
            for p in live:
                try:
                    p.popen.wait(timeout=max(0.1, end - time.time()))
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(p.popen.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.popen.wait()
                self._reap(p, at_stop=True)
            for hook in self.on_stop:  # after the processes: nothing uses what they remove
                try:
                    hook()
                except Exception as e:  # noqa: BLE001 - a teardown must not stop the others
                    self.log("teardown failed: %s" % e)
