#include "supervision/checkpoint.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <xxhash.h>

namespace cellshard::supervision {

namespace fs = std::filesystem;

namespace {

constexpr char magic[4] = {'C', 'S', 'C', 'K'};
constexpr std::uint16_t format_version = 1;
constexpr std::uint8_t kind_snapshot = 1;
constexpr std::uint8_t kind_delta = 2;
constexpr std::size_t header_size = 16;
constexpr std::size_t trailer_size = 8;

void set_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string hex(std::uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string pad20(std::uint64_t v) {
  char buf[21];
  std::snprintf(buf, sizeof(buf), "%020llu", static_cast<unsigned long long>(v));
  return buf;
}

// '%' and '/' escaped so the key cannot reach into the name's structure.
std::string escape_key(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '%') out += "%25";
    else if (c == '/') out += "%2F";
    else out += c;
  }
  return out;
}

// File names: everything outside [A-Za-z0-9._-] percent-escaped (prefix-preserving).
std::string escape_file(const std::string& name) {
  static const char* digits = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string unescape_file(const std::string& file) {
  std::string out;
  for (std::size_t i = 0; i < file.size(); ++i) {
    int hi = -1, lo = -1;
    if (file[i] == '%' && i + 2 < file.size()) {
      hi = hex_digit(file[i + 1]);
      lo = hex_digit(file[i + 2]);
    }
    if (hi >= 0 && lo >= 0) {
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += file[i];
    }
  }
  return out;
}

std::string snapshot_prefix(const std::string& key) { return escape_key(key) + "/full/"; }
std::string delta_prefix(const std::string& key) { return escape_key(key) + "/delta/"; }

// Parses the numeric tail of a snapshot or delta name.
bool parse_u64(const std::string& s, std::uint64_t& out) {
  if (s.size() != 20) return false;
  out = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return true;
}

struct delta_ref {
  std::string name;
  std::uint64_t begin, end;
};

result<std::vector<delta_ref>> list_deltas(const blob_store& store, const std::string& key) {
  auto prefix = delta_prefix(key);
  auto names = store.list(prefix);
  if (!names) return names.err();
  std::vector<delta_ref> out;
  for (auto& n : *names) {
    auto tail = n.substr(prefix.size());
    std::uint64_t b, e;
    if (tail.size() != 41 || tail[20] != '-' || !parse_u64(tail.substr(0, 20), b) ||
        !parse_u64(tail.substr(21), e))
      continue;  // not ours
    out.push_back({n, b, e});
  }
  std::sort(out.begin(), out.end(), [](auto& x, auto& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  return out;
}

}  // namespace

// -- archive format -------------------------------------------------------------

bytes encode_archive(std::uint8_t kind, const std::string& key, std::uint64_t begin,
                     std::uint64_t end, const bytes& payload) {
  std::ostringstream os(std::ios::binary);
  {
    // Little-endian whatever the host: cereal's default is the host's order,
    // which made a big-endian node's archives (and their XXH64) differ.
    cereal::PortableBinaryOutputArchive ar(os, cereal::PortableBinaryOutputArchive::Options::LittleEndian());
    ar(key, begin, end, payload);
  }
  auto body = os.str();
  // Sized up front and filled in place (GCC 12 warns falsely on small inserts).
  bytes out(header_size + body.size() + trailer_size);
  std::memcpy(out.data(), magic, 4);
  set_le(out.data() + 4, format_version, 2);
  out[6] = kind;
  out[7] = 0;
  set_le(out.data() + 8, body.size(), 8);
  std::memcpy(out.data() + header_size, body.data(), body.size());
  set_le(out.data() + header_size + body.size(),
         XXH64(out.data(), header_size + body.size(), 0), 8);
  return out;
}

result<decoded_archive> decode_archive(const bytes& a) {
  if (a.size() < header_size + trailer_size)
    return make_error("truncated archive (" + std::to_string(a.size()) + " bytes, need at least " +
                      std::to_string(header_size + trailer_size) + ")");
  if (std::memcmp(a.data(), magic, 4) != 0) return make_error("bad magic (not a CSCK archive)");
  std::uint64_t body_len = get_le(a.data() + 8, 8);
  if (body_len != a.size() - header_size - trailer_size)
    return make_error("length mismatch (header says " + std::to_string(body_len) +
                      " body bytes, archive holds " +
                      std::to_string(a.size() - header_size - trailer_size) + ")");
  std::uint64_t stored = get_le(a.data() + a.size() - trailer_size, 8);
  std::uint64_t computed = XXH64(a.data(), a.size() - trailer_size, 0);
  if (stored != computed)
    return make_error("checksum mismatch (stored " + hex(stored) + ", computed " + hex(computed) +
                      ")");
  auto version = get_le(a.data() + 4, 2);
  if (version != format_version)
    return make_error("unsupported archive format version " + std::to_string(version));
  decoded_archive d;
  d.kind = a[6];
  if (d.kind != kind_snapshot && d.kind != kind_delta)
    return make_error("unknown archive kind " + std::to_string(d.kind));
  try {
    std::istringstream is(std::string(a.begin() + header_size, a.end() - trailer_size),
                          std::ios::binary);
    cereal::PortableBinaryInputArchive ar(is);
    ar(d.key, d.begin, d.end, d.payload);
  } catch (const std::exception& e) {
    return make_error(std::string("undecodable body: ") + e.what());
  }
  return d;
}

// -- memory_blob_store ------------------------------------------------------------

result<void> memory_blob_store::put(const std::string& name, const bytes& data) {
  std::lock_guard<std::mutex> lock(mu_);
  blobs_[name] = data;
  return {};
}

result<bytes> memory_blob_store::get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blobs_.find(name);
  if (it == blobs_.end()) return make_error("no blob named '" + name + "'");
  return it->second;
}

result<std::vector<std::string>> memory_blob_store::list(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (auto it = blobs_.lower_bound(prefix); it != blobs_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(it->first);
  }
  return out;
}

result<void> memory_blob_store::erase(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  blobs_.erase(name);
  return {};
}

std::size_t memory_blob_store::bytes_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (auto& [k, v] : blobs_) n += v.size();
  return n;
}

// -- file_blob_store --------------------------------------------------------------

result<std::shared_ptr<file_blob_store>> file_blob_store::open(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error("checkpoint dir '" + dir + "': " + ec.message());
  if (!fs::is_directory(dir, ec)) return make_error("checkpoint dir '" + dir + "' is not a directory");
  return std::shared_ptr<file_blob_store>(new file_blob_store(dir));
}

std::string file_blob_store::path_of(const std::string& name) const {
  return (fs::path(dir_) / (escape_file(name) + ".ckpt")).string();
}

result<void> file_blob_store::put(const std::string& name, const bytes& data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto path = path_of(name);
  auto tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return make_error("cannot write '" + tmp + "': " + std::strerror(errno));
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) return make_error("write to '" + tmp + "' failed: " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return make_error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  return {};
}

result<bytes> file_blob_store::get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto path = path_of(name);
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read '" + path + "': " + std::strerror(errno));
  bytes data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return make_error("read of '" + path + "' failed");
  return data;
}

result<std::vector<std::string>> file_blob_store::list(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto efx = escape_file(prefix);
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    auto file = it->path().filename().string();
    if (file.size() < 5 || file.compare(file.size() - 5, 5, ".ckpt") != 0) continue;
    if (file.compare(0, efx.size(), efx) != 0) continue;
    out.push_back(unescape_file(file.substr(0, file.size() - 5)));
  }
  if (ec) return make_error("cannot list '" + dir_ + "': " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

result<void> file_blob_store::erase(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ec;
  fs::remove(path_of(name), ec);
  if (ec) return make_error("cannot remove '" + path_of(name) + "': " + ec.message());
  return {};
}

// -- checkpoint_store ---------------------------------------------------------------

bytes delta_chain::concatenated() const {
  bytes out;
  for (auto& d : parts) out.insert(out.end(), d.payload.begin(), d.payload.end());
  return out;
}

checkpoint_store::checkpoint_store(std::shared_ptr<blob_store> backend, checkpoint_options opts)
    : backend_(backend ? std::move(backend) : std::make_shared<memory_blob_store>()),
      opts_(opts) {}

std::string checkpoint_store::snapshot_name(const std::string& key, std::uint64_t end) {
  return snapshot_prefix(key) + pad20(end);
}

std::string checkpoint_store::delta_name(const std::string& key, std::uint64_t begin,
                                         std::uint64_t end) {
  return delta_prefix(key) + pad20(begin) + "-" + pad20(end);
}

result<void> checkpoint_store::save(const std::string& key, std::uint64_t end,
                                    const bytes& payload) {
  auto r = backend_->put(snapshot_name(key, end), encode_archive(kind_snapshot, key, 0, end, payload));
  if (!r) return make_error("checkpoint '" + key + "' end " + std::to_string(end) + ": " + r.message());
  if (opts_.keep_snapshots > 0) return prune(key, opts_.keep_snapshots);
  return {};
}

result<std::vector<std::uint64_t>> checkpoint_store::snapshots(const std::string& key) const {
  auto prefix = snapshot_prefix(key);
  auto names = backend_->list(prefix);
  if (!names) return names.err();
  std::vector<std::uint64_t> out;
  for (auto& n : *names) {
    std::uint64_t e;
    if (parse_u64(n.substr(prefix.size()), e)) out.push_back(e);
  }
  std::sort(out.begin(), out.end());
  return out;
}

result<checkpoint> checkpoint_store::restore_exact(const std::string& key, std::uint64_t end) const {
  auto where = "checkpoint '" + key + "' end " + std::to_string(end) + ": ";
  auto blob = backend_->get(snapshot_name(key, end));
  if (!blob) return make_error(where + blob.message());
  auto d = decode_archive(*blob);
  if (!d) return make_error(where + d.message());
  if (d->kind != kind_snapshot || d->key != key || d->end != end)
    return make_error(where + "archive holds '" + d->key + "' end " + std::to_string(d->end) +
                      " (misfiled)");
  checkpoint c;
  c.key = key;
  c.end = end;
  c.payload = std::move(d->payload);
  return c;
}

result<checkpoint> checkpoint_store::restore(const std::string& key, std::uint64_t at_most) const {
  auto ends = snapshots(key);
  if (!ends) return make_error("checkpoint '" + key + "': " + ends.message());
  std::vector<std::string> skipped;
  for (auto it = ends->rbegin(); it != ends->rend(); ++it) {
    if (*it > at_most) continue;
    auto c = restore_exact(key, *it);
    if (c) {
      c->skipped = std::move(skipped);
      return c;
    }
    skipped.push_back(c.message());
  }
  if (skipped.empty())
    return make_error("no checkpoint for '" + key + "'" +
                      (at_most == std::numeric_limits<std::uint64_t>::max()
                           ? std::string()
                           : " with end <= " + std::to_string(at_most)));
  std::string all;
  for (auto& s : skipped) all += (all.empty() ? "" : "; ") + s;
  return make_error("no valid checkpoint for '" + key + "': " + all);
}

result<void> checkpoint_store::prune(const std::string& key, std::size_t keep) {
  auto ends = snapshots(key);
  if (!ends) return ends.err();
  if (ends->size() <= keep) return {};
  for (std::size_t i = 0; i + keep < ends->size(); ++i)
    if (auto r = backend_->erase(snapshot_name(key, (*ends)[i])); !r) return r;
  return {};
}

result<void> checkpoint_store::append_delta(const std::string& key, std::uint64_t begin,
                                            std::uint64_t end, const bytes& payload) {
  auto where = "delta '" + key + "' [" + std::to_string(begin) + ", " + std::to_string(end) + "): ";
  if (end <= begin) return make_error(where + "empty or reversed range");
  auto existing = list_deltas(*backend_, key);
  if (!existing) return make_error(where + existing.message());
  for (auto& d : *existing)
    if (d.end > begin)
      if (auto r = backend_->erase(d.name); !r) return make_error(where + r.message());
  auto r = backend_->put(delta_name(key, begin, end),
                         encode_archive(kind_delta, key, begin, end, payload));
  if (!r) return make_error(where + r.message());
  return {};
}

result<delta_chain> checkpoint_store::restore_deltas(const std::string& key, std::uint64_t from,
                                                     std::uint64_t up_to) const {
  auto refs = list_deltas(*backend_, key);
  if (!refs) return make_error("deltas of '" + key + "': " + refs.message());
  delta_chain chain;
  chain.key = key;
  chain.begin = chain.end = from;
  // Skip deltas wholly before `from`.
  std::size_t i = 0;
  while (i < refs->size() && (*refs)[i].end <= from) ++i;
  for (; i < refs->size(); ++i) {
    const auto& r = (*refs)[i];
    auto label = "delta [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
    if (r.begin != chain.end) {
      chain.stopped = "gap: next " + label + " does not begin at " + std::to_string(chain.end);
      return chain;
    }
    if (r.end > up_to) {
      chain.stopped = label + " ends past the limit " + std::to_string(up_to);
      return chain;
    }
    auto blob = backend_->get(r.name);
    if (!blob) {
      chain.stopped = label + ": " + blob.message();
      return chain;
    }
    auto d = decode_archive(*blob);
    if (!d) {
      chain.stopped = label + ": " + d.message();
      return chain;
    }
    if (d->kind != kind_delta || d->key != key || d->begin != r.begin || d->end != r.end) {
      chain.stopped = label + ": archive holds '" + d->key + "' [" + std::to_string(d->begin) +
                      ", " + std::to_string(d->end) + ") (misfiled)";
      return chain;
    }
    chain.parts.push_back(delta{r.begin, r.end, std::move(d->payload)});
    chain.end = r.end;
  }
  return chain;
}

result<void> checkpoint_store::drop_deltas_before(const std::string& key, std::uint64_t before) {
  auto refs = list_deltas(*backend_, key);
  if (!refs) return refs.err();
  for (auto& d : *refs)
    if (d.end <= before)
      if (auto r = backend_->erase(d.name); !r) return r;
  return {};
}

result<void> checkpoint_store::erase(const std::string& key) {
  for (auto prefix : {snapshot_prefix(key), delta_prefix(key)}) {
    auto names = backend_->list(prefix);
    if (!names) return names.err();
    for (auto& n : *names)
      if (auto r = backend_->erase(n); !r) return r;
  }
  return {};
}

}  // namespace cellshard::supervision
