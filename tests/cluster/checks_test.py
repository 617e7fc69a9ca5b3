#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The W5 invariant checkers (scripts/cluster/checks.py) against synthetic
runs: each broken run must be caught, each clean one must pass, so that a
green W5 run means something. Run by test_checks.sh."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.environ.get("KVBM_SOURCE_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")), "scripts", "cluster"))
import checks  # noqa: E402
import cluster  # noqa: E402
import netfaults  # noqa: E402


class WrongBytes(unittest.TestCase):
    def test_clean(self):
        self.assertEqual(checks.check_wrong_bytes({0: 0, 1: 0}, {0: 0, 1: 0}), (0, []))

    def test_from_answers(self):
        total, bad = checks.check_wrong_bytes({0: 0, 1: 4096}, {0: 0, 1: 0})
        self.assertEqual(total, 4096)
        self.assertEqual(len(bad), 1)
        self.assertIn("worker 1", bad[0])

    def test_from_metrics_of_a_worker_with_no_answer(self):
        # a worker whose answers never came back (killed) still has its metric
        total, bad = checks.check_wrong_bytes({0: 0}, {0: 0, 3: 7})
        self.assertEqual((total, len(bad)), (7, 1))

    def test_not_double_counted(self):
        self.assertEqual(checks.check_wrong_bytes({2: 10}, {2: 10})[0], 10)


class Requests(unittest.TestCase):
    def test_every_outcome_counted(self):
        self.assertEqual(checks.check_requests(100, 97, 3), [])
        self.assertEqual(checks.uncounted_losses(100, 97, 3), 0)

    def test_a_lost_request(self):
        self.assertEqual(checks.uncounted_losses(100, 97, 2), 1)
        self.assertEqual(len(checks.check_requests(100, 97, 2)), 1)

    def test_counted_twice(self):
        self.assertIn("more outcomes", checks.check_requests(10, 10, 1)[0])


class Index(unittest.TestCase):
    blocks = {0: {"g1": [1, 2, 3], "g2": [4], "g3": []}, 1: {"g1": [], "g2": [], "g3": [9]}}

    def views(self, **change):
        v = {r: {w: {t: list(self.blocks[w][t]) for t in checks.TIERS} for w in self.blocks}
             for r in (0, 1)}
        for k, f in change.items():
            f(v)
        return v

    def test_equal(self):
        self.assertEqual(checks.check_index(self.views(), self.blocks), [])

    def test_order_and_strings_do_not_matter(self):
        v = self.views()
        v[0][0]["g1"] = ["3", "1", "2"]
        self.assertEqual(checks.check_index(v, self.blocks), [])

    def test_a_missing_block(self):
        v = self.views()
        v[1][0]["g1"] = [1, 2]
        bad = checks.check_index(v, self.blocks)
        self.assertEqual(len(bad), 1)
        self.assertIn("router 1, worker 0, g1: 1 blocks missing, 0 extra", bad[0])

    def test_an_extra_block_in_another_tier(self):
        v = self.views()
        v[0][1]["g2"] = [9]  # held in G3, indexed in G2 too
        bad = checks.check_index(v, self.blocks)
        self.assertEqual(bad, ["router 0, worker 1, g2: 0 blocks missing, 1 extra"])

    def test_unknown_worker_is_empty(self):
        v = self.views()
        v[0][1] = None  # the router answered 404
        self.assertEqual(len(checks.check_index(v, self.blocks)), 1)
        empty = {0: {"g1": [], "g2": [], "g3": []}}
        self.assertEqual(checks.check_index({0: {0: None}}, empty), [])

    def test_a_worker_not_queried(self):
        v = self.views()
        del v[0][1]
        self.assertIn("not queried", checks.check_index(v, self.blocks)[0])


class Memory(unittest.TestCase):
    def test_under(self):
        self.assertEqual(checks.check_memory({"worker0": 100 * 1024}, {"worker0": 100}), [])

    def test_over(self):
        bad = checks.check_memory({"worker0": 100 * 1024 + 1}, {"worker0": 100})
        self.assertEqual(len(bad), 1)

    def test_no_budget(self):
        self.assertIn("no memory budget", checks.check_memory({"x": 1}, {})[0])


class Crashes(unittest.TestCase):
    def test_scheduled_and_stopped(self):
        deaths = [{"process": "worker1", "rc": -9, "scheduled": True, "at_stop": False},
                  {"process": "router0", "rc": -15, "scheduled": False, "at_stop": True},
                  {"process": "nats", "rc": 1, "scheduled": False, "at_stop": True,
                   "clean_rcs": [0, 1, -15, -9]}]
        self.assertEqual(checks.check_crashes(deaths), [])

    def test_unscheduled_death(self):
        deaths = [{"process": "worker2", "rc": -11, "scheduled": False, "at_stop": False}]
        bad = checks.check_crashes(deaths)
        self.assertEqual(len(bad), 1)
        self.assertIn("worker2", bad[0])

    def test_bad_exit_at_stop(self):
        # a process that crashes on SIGTERM (an abort in its cleanup) is a crash
        deaths = [{"process": "router1", "rc": -6, "scheduled": False, "at_stop": True},
                  {"process": "nats", "rc": 1, "scheduled": False, "at_stop": True}]
        self.assertEqual(len(checks.check_crashes(deaths)), 2)


class Helpers(unittest.TestCase):
    def test_percentile(self):
        self.assertIsNone(checks.percentile([], 50))
        xs = list(range(1, 101))
        self.assertEqual(checks.percentile(xs, 50), 50)
        self.assertEqual(checks.percentile(xs, 99), 99)
        self.assertEqual(checks.percentile([5], 99), 5)

    def test_prefix_overlap(self):
        self.assertEqual(checks.prefix_overlap([1, 2, 3, 4], {1, 2, 4}), 2)
        self.assertEqual(checks.prefix_overlap([1, 2], set()), 0)

    def test_tokens_are_w1s(self):
        r = {"hash_ids": [7, 9], "input_length": 514}
        t = cluster.tokens_of(r)
        self.assertEqual((len(t), t[0], t[511], t[512], t[513]), (514, 7 * 512, 7 * 512 + 511,
                                                                    9 * 512, 9 * 512 + 1))


class Schedule(unittest.TestCase):
    def write(self, text):
        import tempfile
        f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_default_has_every_fault_in_the_load(self):
        s = cluster.read_schedule("default", 100.0, 4)
        kinds = {e["fault"] for e in s}
        self.assertEqual(kinds, {"worker_kill", "redis_master_kill", "router_kill", "nats_restart",
                                 "g3_slow", "g3_full", "publish_off", "partition"})
        self.assertTrue(all(e["at_s"] + e["duration_s"] < 100.0 for e in s))

    def test_file(self):
        p = self.write('{"at_s": 2, "fault": "worker_kill", "target": "worker:1"}\n\n'
                       '{"at_s": 1, "fault": "publish_off", "target": "worker:0", "duration_s": 3}\n')
        s = cluster.read_schedule(p, 10, 2)
        self.assertEqual([e["fault"] for e in s], ["publish_off", "worker_kill"])
        self.assertEqual(s[1]["duration_s"], 2.0)

    def test_hostile_files(self):
        for text in ["not json\n", '{"at_s": 1, "fault": "meteor"}\n', '[1]\n',
                     '{"at_s": -1, "fault": "nats_restart"}\n',
                     '{"at_s": "1", "fault": "nats_restart"}\n',
                     '{"at_s": 1, "fault": "worker_kill", "target": "worker:9"}\n',
                     '{"at_s": 1, "fault": "worker_kill", "target": "router:0"}\n',
                     '{"at_s": 1, "fault": "router_kill", "target": "router:2"}\n',
                     '{"at_s": 1, "fault": "g3_full", "target": "worker:0", "duration_s": 1e9}\n',
                     '{"at_s": 1, "fault": "partition", "target": "router:0"}\n',
                     '{"at_s": 1, "fault": "partition", "target": "worker:0"}\n'
                     '{"at_s": 2, "fault": "partition", "target": "worker:1"}\n']:
            with self.assertRaises(cluster.UsageError, msg=text):
                cluster.read_schedule(self.write(text), 10, 2)
        with self.assertRaises(cluster.UsageError):
            cluster.read_schedule("/nonexistent/schedule", 10, 2)


class Partition(unittest.TestCase):
    """check_partitions over the counters of a partitioned worker."""

    def fault(self, **window):
        w = {"ok": 0, "counted": 12, "computed": 640, "wrong_bytes": 0, "requests": 5}
        w.update(window)
        return [{"fault": "partition", "target": "worker:2", "injected": True, "window": w}]

    def test_clean(self):
        self.assertEqual(checks.check_partitions(self.fault()), [])

    def test_idle_worker_is_clean(self):
        self.assertEqual(checks.check_partitions(self.fault(counted=0, computed=0)), [])

    def test_a_write_done_through_the_partition(self):
        bad = checks.check_partitions(self.fault(ok=3))
        self.assertTrue(bad and "3 G4 writes or onboards reported done" in bad[0], bad)

    def test_writes_lost_without_a_count(self):
        bad = checks.check_partitions(self.fault(counted=0))
        self.assertTrue(bad and "no G4 write counted" in bad[0], bad)

    def test_wrong_bytes(self):
        bad = checks.check_partitions(self.fault(wrong_bytes=1))
        self.assertTrue(bad and "wrong bytes" in bad[0], bad)

    def test_no_counters_read(self):
        f = self.fault()
        del f[0]["window"]
        self.assertEqual(len(checks.check_partitions(f)), 1)

    def test_skipped_and_other_faults_are_not_checked(self):
        f = [{"fault": "partition", "target": "worker:2", "injected": False,
              "skipped": "unavailable: not root"},
             {"fault": "g3_full", "target": "worker:3", "injected": True, "window": {"ok": 9}}]
        self.assertEqual(checks.check_partitions(f), [])

    METRICS = "\n".join([
        '# TYPE kvbm_offload_blocks_total counter',
        'kvbm_offload_blocks_total{worker="2",tier="G2"} 100',
        'kvbm_offload_blocks_total{worker="2",tier="G4"} 7',
        'kvbm_onboard_blocks_total{worker="2",tier="G4"} 3',
        'kvbm_offload_skipped_total{worker="2",tier="G4",cause="io"} 4',
        'kvbm_offload_skipped_total{worker="2",tier="G4",cause="queue"} 1',
        'kvbm_offload_skipped_total{worker="2",tier="G3",cause="io"} 50',
        'kvbm_lookup_failures_total{worker="2",tier="G4",cause="timeout"} 2',
        'kvbm_worker_prefill_tokens_total{worker="2"} 320',
        'kvbm_worker_wrong_bytes_total{worker="2"} 0'])

    def test_g4_counts_take_g4_only(self):
        c = cluster.g4_counts(self.METRICS)
        self.assertEqual((c["ok"], c["counted"], c["computed"], c["wrong_bytes"]), (10, 7, 320, 0))
        self.assertEqual(cluster.prom_sample(self.METRICS, "kvbm_offload_skipped_total", tier="G3",
                                             cause="io"), 50)
        self.assertEqual(cluster.prom_sample("garbage {", "kvbm_offload_blocks_total"), 0)

    def test_partition_in_a_schedule_file(self):
        import tempfile
        f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        f.write('{"at_s": 1, "fault": "partition", "target": "worker:1", "duration_s": 2}\n')
        f.close()
        self.addCleanup(os.unlink, f.name)
        self.assertEqual(cluster.read_schedule(f.name, 10, 2)[0]["fault"], "partition")


class NetFaults(unittest.TestCase):
    """The parts of netfaults.py that need no root."""

    def test_slot_file_is_disk_cs(self):
        # src/volume/disk.c: (1024 + 64) rounded to 4096, plus a 4 KiB superblock
        self.assertEqual(netfaults.slot_file_bytes(32768, 1024), 4096 + 32768 * 4096)
        self.assertEqual(netfaults.slot_file_bytes(10, 4096), 4096 + 10 * 8192)

    def test_stale_names(self):
        self.assertIsNone(netfaults._stale_pid("kvbmw5-%d" % os.getpid()))  # this run
        self.assertIsNone(netfaults._stale_pid("kvbmw5-1"))                 # init lives
        self.assertIsNone(netfaults._stale_pid("other-123"))
        self.assertIsNone(netfaults._stale_pid("kvbmw5-12x"))
        self.assertEqual(netfaults._stale_pid("kvbmw5-4194999"), 4194999)  # above pid_max

    def test_forced_fallbacks_say_why(self):
        os.environ["KVBM_W5_NO_NETNS"] = os.environ["KVBM_W5_NO_MOUNT"] = "1"
        try:
            p = netfaults.Partition()
            self.assertFalse(p.setup())
            self.assertTrue(p.describe().startswith("unavailable: "), p.describe())
            p.teardown()  # nothing made, nothing to do
            d = netfaults.G3Disk()
            self.assertFalse(d.usable())
            self.assertTrue(d.available.startswith("emulated: "), d.available)
        finally:
            del os.environ["KVBM_W5_NO_NETNS"], os.environ["KVBM_W5_NO_MOUNT"]

    def test_ballast_fills_a_real_tmpfs(self):
        import tempfile
        g = netfaults.G3Disk()
        if not g.usable():
            self.skipTest(g.available)
        d = tempfile.mkdtemp()
        self.addCleanup(os.rmdir, d)
        self.addCleanup(g.teardown)
        self.assertTrue(g.mount(d, 1 << 20), g.available)
        self.assertEqual(os.stat(d).st_mode & 0o777, 0o700)
        n = g.fill(d)
        self.assertEqual(g.free_bytes(d), 0)
        self.assertGreater(n, (1 << 20) - 65536)
        with self.assertRaises(OSError):  # the filesystem's own ENOSPC
            with open(os.path.join(d, "more"), "wb") as f:
                f.write(b"x" * 8192)
                f.flush()
        g.unfill(d)
        self.assertGreater(g.free_bytes(d), (1 << 20) - 65536)

if __name__ == "__main__":
    unittest.main(verbosity=1)
