"""n_threads=None counts the CPUs this process may use: its affinity mask, limited by its
cgroup's CPU quota (core/threads/cpus.hpp)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import uuid

import fastpar
import fastpar._testing as T
import pytest

HAS_AFFINITY = hasattr(os, "sched_getaffinity")


@pytest.fixture(scope="module")
def model_path() -> str:
    return fastpar.default_model_path()

# Prints n_threads=None's threads of a Context, and the test hook's count.
CHILD = """
import fastpar, fastpar._testing as T
ctx = fastpar.Context(fastpar.Model({path!r}), n_parallel=2, n_ctx_per_seq=64)
print(ctx.n_threads, T.available_cpus())
"""


def _child_threads(model_path, preexec_fn=None, affinity=None) -> tuple:
    code = CHILD.format(path=model_path)
    if affinity is not None:
        code = f"import os; os.sched_setaffinity(0, {sorted(affinity)!r})\n" + code
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         preexec_fn=preexec_fn)
    assert out.returncode == 0, out.stderr
    return tuple(int(x) for x in out.stdout.split())


@pytest.mark.parametrize("n_affinity, quota, want", [
    (8, 0.0, 8),      # no quota: the mask
    (8, 2.0, 2),      # a quota of 2 CPUs
    (8, 1.5, 2),      # rounded to the nearest
    (8, 1.4, 1),
    (8, 0.3, 1),      # at least 1
    (2, 16.0, 2),     # never more than the mask
    (0, 0.0, 1),
])
def test_cpus_within(n_affinity, quota, want):
    assert T.cpus_within(n_affinity, quota) == want


def _tree(tmp_path: pathlib.Path, cgroup: str, mountinfo: str, files: dict) -> str:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    for rel, text in files.items():
        p = tmp_path / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path)


MOUNT_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
MOUNT_V1 = ("31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n"
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
            "33 31 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")


def test_cgroup_v2_quota_of_the_group_and_above(tmp_path):
    root = _tree(tmp_path, "0::/user.slice/job\n", MOUNT_V2, {
        "/sys/fs/cgroup/user.slice/job/cpu.max": "max 100000\n",
        "/sys/fs/cgroup/user.slice/cpu.max": "150000 100000\n",   # the parent's limit counts
        "/sys/fs/cgroup/cpu.max": "400000 100000\n",
    })
    assert T.cgroup_cpu_quota(root) == pytest.approx(1.5)


def test_cgroup_v2_no_quota(tmp_path):
    root = _tree(tmp_path, "0::/job\n", MOUNT_V2, {"/sys/fs/cgroup/job/cpu.max": "max 100000\n"})
    assert T.cgroup_cpu_quota(root) == 0


def test_cgroup_v1_cpu_controller(tmp_path):
    root = _tree(tmp_path, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n", MOUNT_V1, {
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us": "-1\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n",
        # The memory controller's files are not a CPU quota.
        "/sys/fs/cgroup/memory/docker/abc/cpu.cfs_quota_us": "50000\n",
        "/sys/fs/cgroup/memory/docker/abc/cpu.cfs_period_us": "100000\n",
    })
    assert T.cgroup_cpu_quota(root) == pytest.approx(2.5)


def test_cgroup_v1_container_mounts_its_own_group(tmp_path):
    # Inside a container without a cgroup namespace: the mount's root is the container's
    # group, /proc/self/cgroup names it from the host's top.
    mountinfo = "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    root = _tree(tmp_path, "3:cpu:/docker/abc\n", mountinfo, {
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "100000\n",
        "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
    })
    assert T.cgroup_cpu_quota(root) == pytest.approx(1.0)


def test_cgroup_hybrid_smallest_counts_and_escaped_mount_point(tmp_path):
    mountinfo = (r"30 23 0:26 / /sys/fs/cgroup/uni\040fied rw - cgroup2 cgroup2 rw" "\n"
                 "32 23 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    root = _tree(tmp_path, "2:cpu:/a\n0::/b\n", mountinfo, {
        "/sys/fs/cgroup/uni fied/b/cpu.max": "300000 100000\n",
        "/sys/fs/cgroup/cpu/a/cpu.cfs_quota_us": "50000\n",
        "/sys/fs/cgroup/cpu/a/cpu.cfs_period_us": "100000\n",
    })
    assert T.cgroup_cpu_quota(root) == pytest.approx(0.5)


def test_cgroup_unreadable_is_no_quota(tmp_path):
    assert T.cgroup_cpu_quota(str(tmp_path)) == 0
    root = _tree(tmp_path, "garbage\n0::\n", "not a mount line\n", {})
    assert T.cgroup_cpu_quota(root) == 0


def test_default_threads_are_this_process_cpus():
    ctx_threads = T.available_cpus()
    if HAS_AFFINITY:
        assert 1 <= ctx_threads <= len(os.sched_getaffinity(0))
    else:
        assert ctx_threads == max(1, os.cpu_count() or 1)


@pytest.mark.skipif(not HAS_AFFINITY, reason="needs sched_setaffinity")
def test_default_threads_follow_the_affinity_mask(model_path):
    one = min(os.sched_getaffinity(0))
    assert _child_threads(model_path, affinity={one}) == (1, 1)
    # An explicit n_threads is kept as asked.
    out = subprocess.run([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{one}}})\n"
                          f"import fastpar; print(fastpar.Context(fastpar.Model({model_path!r}), n_parallel=2, "
                          f"n_ctx_per_seq=64, n_threads=3).n_threads)"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["3"], out.stderr


def _writable_cpu_cgroup():
    """A new cgroup with a CPU quota this process may create (root, cgroup v1's cpu
    controller or v2 with cpu delegated), as (directory, files to write the quota), or None."""
    name = f"fastpar-test-{uuid.uuid4().hex[:8]}"
    v1 = pathlib.Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        try:
            d = v1 / name
            d.mkdir()
            return d, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
        except OSError:
            return None
    v2 = pathlib.Path("/sys/fs/cgroup")
    try:
        if "cpu" in (v2 / "cgroup.controllers").read_text().split():
            d = v2 / name
            d.mkdir()
            return d, {"cpu.max": "100000 100000"}
    except OSError:
        return None
    return None


@pytest.mark.skipif(not HAS_AFFINITY, reason="Linux only")
def test_default_threads_follow_a_real_cgroup_quota(model_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to tell a 1-CPU quota from the mask")
    made = _writable_cpu_cgroup()
    if made is None:
        pytest.skip("cannot create a cgroup with a CPU quota here (needs root and a writable cgroup fs)")
    group, files = made
    try:
        try:
            for f, value in files.items():
                (group / f).write_text(value)
        except OSError as e:
            pytest.skip(f"cannot set a CPU quota here: {e}")

        def enter():
            (group / "cgroup.procs").write_text(str(os.getpid()))

        assert _child_threads(model_path, preexec_fn=enter) == (1, 1)
    finally:
        group.rmdir()
