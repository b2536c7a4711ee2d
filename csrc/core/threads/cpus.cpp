#include "core/threads/cpus.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace fastpar {
namespace {

bool read_text(const std::string & path, std::string & out) {
    std::ifstream in(path);
    if (!in) {
        return false;
    }
    std::ostringstream text;
    text << in.rdbuf();
    out = text.str();
    return true;
}

std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> parts;
    std::string part;
    std::istringstream in(s);
    while (std::getline(in, part, sep)) {
        parts.push_back(part);
    }
    return parts;
}

// mountinfo writes a space, tab, newline and backslash in a path as \040, \011, \012, \134.
std::string unescape(const std::string & s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])) &&
            std::isdigit(static_cast<unsigned char>(s[i + 2])) && std::isdigit(static_cast<unsigned char>(s[i + 3]))) {
            out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
            i += 3;
        } else {
            out += s[i];
        }
    }
    return out;
}

// A group's quota in CPUs from its files in `dir` (0: none or unreadable).
double group_quota(const std::string & dir, bool v2) {
    std::string text;
    double quota = 0, period = 0;
    if (v2) {
        if (!read_text(dir + "/cpu.max", text)) {
            return 0;
        }
        std::istringstream in(text);  // "max 100000" or "150000 100000"
        std::string q;
        if (!(in >> q >> period) || q == "max") {
            return 0;
        }
        quota = std::atof(q.c_str());
    } else {
        std::string p;
        if (!read_text(dir + "/cpu.cfs_quota_us", text) || !read_text(dir + "/cpu.cfs_period_us", p)) {
            return 0;
        }
        quota = std::atof(text.c_str());  // -1: none
        period = std::atof(p.c_str());
    }
    return quota > 0 && period > 0 ? quota / period : 0;
}

// The smallest quota of the group at `path` (as /proc/self/cgroup names it) and the groups
// above it, in a hierarchy whose `mount_root` is mounted at `mount_point`.
double hierarchy_quota(const std::string & root, const std::string & mount_root, const std::string & mount_point,
                       std::string path, bool v2) {
    // The mount shows the hierarchy from mount_root down (a container's own group, say).
    if (mount_root != "/") {
        if (path.compare(0, mount_root.size(), mount_root) == 0 &&
            (path.size() == mount_root.size() || path[mount_root.size()] == '/')) {
            path = path.substr(mount_root.size());
        } else {
            path.clear();  // a group outside what is mounted: only the mount's own top
        }
    }
    while (path.size() > 1 && path.back() == '/') {
        path.pop_back();
    }
    double smallest = 0;
    for (;;) {
        const double q = group_quota(root + mount_point + (path == "/" ? "" : path), v2);
        if (q > 0 && (smallest == 0 || q < smallest)) {
            smallest = q;
        }
        const size_t slash = path.rfind('/');
        if (path.empty() || path == "/" || slash == std::string::npos) {
            break;
        }
        path = path.substr(0, slash);
    }
    return smallest;
}

int32_t affinity_cpus() {
#if defined(__linux__)
    for (int n = 1024; n <= (1 << 16); n *= 4) {
        cpu_set_t * set = CPU_ALLOC(n);
        if (set == nullptr) {
            break;
        }
        const size_t size = CPU_ALLOC_SIZE(n);
        CPU_ZERO_S(size, set);
        if (sched_getaffinity(0, size, set) == 0) {
            const int count = CPU_COUNT_S(size, set);
            CPU_FREE(set);
            if (count > 0) {
                return count;
            }
            break;
        }
        CPU_FREE(set);  // EINVAL: the kernel's mask is larger; try a larger one
    }
#endif
    return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

double cgroup_cpu_quota(const std::string & root) {
    std::string cgroups, mountinfo;
    if (!read_text(root + "/proc/self/cgroup", cgroups) || !read_text(root + "/proc/self/mountinfo", mountinfo)) {
        return 0;
    }
    // The groups: "0::/path" (v2), "N:cpu,cpuacct:/path" (v1 with the cpu controller).
    std::string v2_path, v1_path;
    bool have_v2 = false, have_v1 = false;
    for (const auto & line : split(cgroups, '\n')) {
        const size_t a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) {
            continue;
        }
        const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (line.compare(0, a, "0") == 0 && controllers.empty()) {
            v2_path = path;
            have_v2 = true;
        }
        for (const auto & c : split(controllers, ',')) {
            if (c == "cpu") {
                v1_path = path;
                have_v1 = true;
            }
        }
    }
    // The mounts: "id parent major:minor root mount-point options [optional...] - type source super-options".
    double smallest = 0;
    auto take = [&](double q) {
        if (q > 0 && (smallest == 0 || q < smallest)) {
            smallest = q;
        }
    };
    bool done_v2 = false, done_v1 = false;
    for (const auto & line : split(mountinfo, '\n')) {
        std::istringstream in(line);
        std::vector<std::string> f;
        for (std::string w; in >> w;) {
            f.push_back(w);
        }
        const auto dash = std::find(f.begin(), f.end(), "-");
        if (f.size() < 5 || dash == f.end() || dash + 1 == f.end()) {
            continue;
        }
        const std::string & type = *(dash + 1);
        const std::string super = dash + 3 < f.end() ? *(dash + 3) : std::string();
        if (type == "cgroup2" && have_v2 && !done_v2) {
            take(hierarchy_quota(root, unescape(f[3]), unescape(f[4]), v2_path, true));
            done_v2 = true;
        } else if (type == "cgroup" && have_v1 && !done_v1) {
            const auto opts = split(super, ',');
            if (std::find(opts.begin(), opts.end(), "cpu") != opts.end()) {
                take(hierarchy_quota(root, unescape(f[3]), unescape(f[4]), v1_path, false));
                done_v1 = true;
            }
        }
    }
    return smallest;
}

int32_t cpus_within(int32_t n_affinity, double quota) {
    int32_t n = std::max(1, n_affinity);
    if (quota > 0) {
        n = std::min(n, static_cast<int32_t>(std::max(1.0, std::floor(quota + 0.5))));
    }
    return n;
}

int32_t available_cpus() {
    return cpus_within(affinity_cpus(), cgroup_cpu_quota(""));
}

}  // namespace fastpar
