#include "model/slice_cache.hpp"

#include "model/large_buffer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cellshard::model {

namespace {

struct slice_file {
  std::string path;
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};

std::vector<slice_file> list(const std::string& dir) {
  std::vector<slice_file> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  for (int guard = 0; guard < 1000000; ++guard) {  // bounded: a folder of at most a million entries is read
    dirent* e = ::readdir(d);
    if (!e) break;
    const std::string name = e->d_name;
    if (name.size() < 7 || name.compare(name.size() - 6, 6, ".slice") != 0) continue;
    struct stat sb;
    const std::string p = dir + "/" + name;
    if (::stat(p.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    out.push_back({p, static_cast<uint64_t>(sb.st_size),
                   static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec});
  }
  ::closedir(d);
  return out;
}

}  // namespace

result<slice_cache> slice_cache::open(const std::string& dir, uint64_t max_bytes) {
  if (dir.empty()) return make_error("--cache: no folder given");
  struct stat sb;
  if (::stat(dir.c_str(), &sb) != 0) {
    if (::mkdir(dir.c_str(), 0700) != 0)
      return make_error("--cache " + dir + ": cannot create the folder: " + std::strerror(errno));
  } else if (!S_ISDIR(sb.st_mode)) {
    return make_error("--cache " + dir + ": not a folder");
  }
  if (::access(dir.c_str(), W_OK) != 0) return make_error("--cache " + dir + ": not writable");
  slice_cache c;
  c.dir_ = dir;
  c.max_ = max_bytes;
  return c;
}

std::string slice_cache::path_of(const manifest& m) const { return dir_ + "/" + m.key() + ".slice"; }

uint64_t slice_cache::used() const {
  uint64_t n = 0;
  for (const auto& f : list(dir_)) n += f.bytes;
  return n;
}

slice_cache::usage_figures slice_cache::usage() const {
  usage_figures u;
  for (const auto& f : list(dir_)) {
    u.bytes += f.bytes;
    ++u.entries;
  }
  return u;
}

bool slice_cache::holds(uint64_t key) const {
  struct stat sb;
  const std::string p = dir_ + "/" + format_digest(key) + ".slice";
  return ::stat(p.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

result<slice_cache::lookup> slice_cache::get(const manifest& m) {
  lookup out;
  const std::string p = path_of(m);
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return out;  // a miss
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    ::close(fd);
    return make_error(p + ": cannot stat: " + std::strerror(errno));
  }
  std::vector<uint8_t> bytes = large_buffer(static_cast<uint64_t>(sb.st_size));
  uint64_t done = 0;
  while (done < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (r <= 0) break;
    done += static_cast<uint64_t>(r);
  }
  ::close(fd);
  bytes.resize(done);
  auto ok = verify_slice(m, bytes.data(), bytes.size(), "cache file " + p);
  if (!ok) {
    ::unlink(p.c_str());
    out.dropped = ok.message();
    return out;
  }
  ::utimensat(AT_FDCWD, p.c_str(), nullptr, 0);  // most recently used now
  out.found = true;
  out.bytes = std::move(bytes);
  return out;
}

result<void> slice_cache::put(const manifest& m, const uint8_t* bytes, uint64_t n) {
  if (!fits(n))
    return make_error("no room in --cache " + dir_ + ": the slice of " + m.model_name + " needs " +
                      std::to_string(n) + " bytes, --cache-max is " + std::to_string(max_));
  const std::string p = path_of(m);
  auto files = list(dir_);
  uint64_t used = 0;
  for (const auto& f : files)
    if (f.path != p) used += f.bytes;
  std::sort(files.begin(), files.end(), [](const slice_file& a, const slice_file& b) { return a.mtime_ns < b.mtime_ns; });
  for (const auto& f : files) {
    if (max_ == 0 || used + n <= max_) break;
    if (f.path == p) continue;
    ::unlink(f.path.c_str());
    used -= f.bytes;
  }
  const std::string tmp = p + ".tmp" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return make_error(tmp + ": cannot create: " + std::strerror(errno));
  uint64_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, bytes + done, n - done);
    if (w <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return make_error(tmp + ": write failed after " + std::to_string(done) + " of " + std::to_string(n) +
                        " bytes: " + why);
    }
    done += static_cast<uint64_t>(w);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), p.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return make_error(p + ": cannot store: " + std::strerror(errno));
  }
  return {};
}

}  // namespace cellshard::model
