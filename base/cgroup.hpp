// base/cgroup.hpp: a CPU quota for a child process, the way a weak node's
// compute is capped (issue #25): one cgroup per process with the CPU
// controller's bandwidth limit, PCT% of one core over 10 ms periods. The same
// mechanism as scripts/lab.sh --cpu, for the tools that start daemons
// themselves (actors::local_daemons, `bench failures --cpu`).
//
//   cpu_cap c;  auto r = c.create("cellshard-1234-d0", 25.0);  // 25% of a core
//   r = c.add(pid);   // the whole process (every thread) joins it
//   c.remove();       // also in the destructor; the group must be empty by then
//
// cgroup v2 (/sys/fs/cgroup/cgroup.controllers present): NAME under
// /sys/fs/cgroup with cpu.max "QUOTA 10000"; the root's cgroup.subtree_control
// must enable `cpu` (create() tries to enable it). cgroup v1: NAME under
// /sys/fs/cgroup/cpu with cpu.cfs_period_us 10000 and cpu.cfs_quota_us QUOTA.
// QUOTA = PCT * 100 us, at least 1000 us (the kernel's minimum is 1 ms).
// Needs root (or a delegated hierarchy). Errors name the file written and
// errno's text; nothing is left behind by a failed create(). Thread safety:
// one object per thread; distinct names do not interact. Linux only.
#pragma once

#include <cellshard/result.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace cellshard {

class cpu_cap {
public:
  cpu_cap() = default;
  cpu_cap(const cpu_cap&) = delete;
  cpu_cap& operator=(const cpu_cap&) = delete;
  cpu_cap(cpu_cap&& o) noexcept : dir_(std::move(o.dir_)) { o.dir_.clear(); }
  cpu_cap& operator=(cpu_cap&& o) noexcept {
    if (this != &o) {
      remove();
      dir_ = std::move(o.dir_);
      o.dir_.clear();
    }
    return *this;
  }
  ~cpu_cap() { remove(); }

  /// Makes the cgroup `name` with a quota of `percent`% of one core (0 < percent <= 10000).
  result<void> create(const std::string& name, double percent) {
    if (!(percent > 0) || percent > 10000 || !std::isfinite(percent))
      return make_error("cpu quota for " + name + ": " + std::to_string(percent) +
                        "% is not a share of a core (expected 0 < PCT <= 10000)");
    remove();
    const long quota = std::max(1000L, std::lround(percent * 100.0));  // us per 10,000 us
    struct stat sb;
    std::string dir;
    if (::stat("/sys/fs/cgroup/cgroup.controllers", &sb) == 0) {
      // v2: the cpu controller must be enabled for the root's children (may already be).
      write_file("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
      dir = "/sys/fs/cgroup/" + name;
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return fail(dir, "mkdir");
      if (auto r = write_file(dir + "/cpu.max", std::to_string(quota) + " 10000"); !r) {
        ::rmdir(dir.c_str());
        return r;
      }
    } else if (::stat("/sys/fs/cgroup/cpu", &sb) == 0) {
      dir = "/sys/fs/cgroup/cpu/" + name;
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return fail(dir, "mkdir");
      auto r = write_file(dir + "/cpu.cfs_period_us", "10000");
      if (r) r = write_file(dir + "/cpu.cfs_quota_us", std::to_string(quota));
      if (!r) {
        ::rmdir(dir.c_str());
        return r;
      }
    } else {
      return make_error("cpu quota for " + name +
                        ": no cgroup CPU controller (neither /sys/fs/cgroup/cgroup.controllers nor /sys/fs/cgroup/cpu)");
    }
    dir_ = dir;
    return {};
  }

  /// Moves process `pid` (all its threads) into the cgroup.
  result<void> add(pid_t pid) const {
    if (dir_.empty()) return make_error("cpu quota: add(" + std::to_string(pid) + ") before create()");
    return write_file(dir_ + "/cgroup.procs", std::to_string(pid));
  }

  /// Removes the cgroup (its processes must have ended; a live one keeps it: ignored).
  void remove() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());
    dir_.clear();
  }

  const std::string& dir() const { return dir_; }

private:
  static result<void> fail(const std::string& path, const char* what) {
    return make_error("cpu quota: " + std::string(what) + " " + path + ": " + std::strerror(errno) +
                      " (needs root and a cgroup CPU controller)");
  }
  static result<void> write_file(const std::string& path, const std::string& text) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return fail(path, "open");
    const ssize_t n = ::write(fd, text.data(), text.size());
    const int e = errno;
    ::close(fd);
    errno = e;
    if (n != static_cast<ssize_t>(text.size())) return fail(path, "write");
    return {};
  }
  std::string dir_;
};

}  // namespace cellshard
