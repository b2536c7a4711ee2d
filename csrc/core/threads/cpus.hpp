// How many CPUs this process may use: the default number of threads of a Context.
#pragma once

#include <cstdint>
#include <string>

namespace fastpar {

// The CPUs of this process's affinity mask, limited by the CPU quota of its cgroup. In a
// container limited to 2 CPUs of a 64-core host, or under `taskset -c 0`, llama.cpp's
// threads wait for one another at every step of a forward pass: more threads than CPUs
// leave some of them waiting for a partner that is not running. At least 1.
int32_t available_cpus();

// The parts, for tests. The CPU quota (in CPUs; 0: none) of the cgroups this process is in,
// read under `root` ("" for the real system; a made-up tree in tests): the groups that
// <root>/proc/self/cgroup names, found where <root>/proc/self/mountinfo mounts them, and
// every group above them (the smallest quota counts). cgroup v2: cpu.max; v1: the cpu
// controller's cpu.cfs_quota_us / cpu.cfs_period_us.
double cgroup_cpu_quota(const std::string & root);

// CPUs to use from the affinity mask's count and a quota (0: none): the quota rounded to
// the nearest whole CPU, at least 1 and at most n_affinity.
int32_t cpus_within(int32_t n_affinity, double quota);

}  // namespace fastpar
