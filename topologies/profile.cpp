// topologies/profile.cpp: node profiles and the --memory / --link parsers.
#include "topologies/profile.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unistd.h>

namespace cellshard::topologies {

namespace {

constexpr uint64_t kib = 1024ull;
constexpr uint64_t mib = kib * 1024ull;
constexpr uint64_t gib = mib * 1024ull;
constexpr uint64_t tib = gib * 1024ull;

// One hop on a switched gigabit LAN: 100 us one way (HARDWARE.md, "assumptions
// where no source gave a number": typical LAN figures; measure where possible).
constexpr double lan_hop_latency_us = 100.0;
// Gigabit Ethernet line rate. TCP payload is about 941 Mbit/s at MTU 1500
// (HARDWARE.md, measured, itecnotes); the profile states the line rate and the
// run reports what it measured (DESIGN.md "Weak nodes").
constexpr uint64_t gigabit_bps = 1000000000ull;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Splits "12.5MiB" into the number (locale-free decimal: digits, optional
// '.', digits) and the rest (the unit, spaces trimmed). False when there is
// no number.
bool split_number(std::string_view text, long double& value, std::string& unit) {
  const std::string s = trim(text);
  size_t i = 0;
  long double v = 0;
  bool digits = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    v = v * 10 + (s[i] - '0');
    digits = true;
    ++i;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    long double scale = 0.1L;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      v += (s[i] - '0') * scale;
      scale /= 10;
      digits = true;
      ++i;
    }
  }
  if (!digits) return false;
  value = v;
  unit = trim(std::string_view(s).substr(i));
  return true;
}

}  // namespace

double link_spec::transfer_s(uint64_t bytes) const {
  const double wire = bandwidth_bps == 0 ? 0.0 : 8.0 * static_cast<double>(bytes) / static_cast<double>(bandwidth_bps);
  return latency_us * 1e-6 + wire;
}

profile host_profile() {
  profile p;
  p.name = "host";
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  p.memory_bytes = (pages > 0 && page_size > 0)
                       ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size)
                       : tib;  // the OS did not say: "large"
  p.spe_workers = 0;
  p.link = link_spec{0, 0.0};  // in-process / loopback: unshaped unless --link
  return p;                    // gflops, bandwidth, power: unknown (measure)
}

profile ps3_profile() {
  profile p;
  p.name = "ps3";
  // 256 MB XDR main memory (HARDWARE.md: ps3junction specs); the 256 MB GDDR3
  // is not usable from Linux (Sony slide via The Inquirer; t2sde): plan on
  // 256 MiB per node. (Linux itself takes some of it; --memory lowers the
  // budget where that matters.)
  p.memory_bytes = 256 * mib;
  // 8 SPEs, 7 enabled, 1 reserved by the hypervisor: 6 usable under Linux
  // (gamedevpensieve.com Cell page; t2sde.org PS3 page; Wikipedia).
  p.spe_workers = 6;
  // Gigabit Ethernet (ps3junction specs); 100 us per hop (LAN assumption).
  p.link = link_spec{gigabit_bps, lan_hop_latency_us};
  // 25.6 GFLOPS single precision per SPE at 3.2 GHz (IBM via ps3blog.net;
  // Wikipedia); 6 SPEs = 153.6 GFLOPS (derived).
  p.gflops = 6 * 25.6;
  // XDR at 25.6 GB/s (ps3junction specs).
  p.mem_bandwidth_gbs = 25.6;
  // Launch model: ~152-160 W playing discs, >200 W gaming (psxextreme;
  // pcprofessionale); a node running kernels on all SPEs is a gaming load.
  p.power_w = 200.0;
  return p;
}

profile ps3_slim_profile() {
  profile p = ps3_profile();  // same Cell, same 256 MB XDR, same GbE
  p.name = "ps3-slim";
  // Slim: ~96 W gaming, ~75 W idle (techcrunch 2009-08-27). Note the Slim
  // shipped without OtherOS, so Linux on it needs a modified firmware.
  p.power_w = 96.0;
  return p;
}

profile rpi5_profile() {
  profile p;
  p.name = "rpi5";
  // 8 GB model (HARDWARE.md assumptions: "8 GB RAM").
  p.memory_bytes = 8 * gib;
  p.spe_workers = 0;
  // The Pi 5's Gigabit Ethernet port; 100 us per hop (LAN assumption).
  p.link = link_spec{gigabit_bps, lan_hop_latency_us};
  // ~150 GFLOPS f32 peak: 4 Cortex-A76 at 2.4 GHz, 2 x 128-bit FMA each
  // (HARDWARE.md, derived).
  p.gflops = 150.0;
  // LPDDR4X-4267 on a 32-bit bus: about 17 GB/s (derived, theoretical; Jeff
  // Geerling's measurements).
  p.mem_bandwidth_gbs = 17.0;
  // 8.9-9.8 W under stress (Jeff Geerling's measurements): the upper figure.
  p.power_w = 9.8;
  return p;
}

const std::vector<std::string>& profile_names() {
  static const std::vector<std::string> names{"host", "ps3", "ps3-slim", "rpi5"};
  return names;
}

result<profile> find_profile(std::string_view name) {
  if (name == "host") return host_profile();
  if (name == "ps3") return ps3_profile();
  if (name == "ps3-slim") return ps3_slim_profile();
  if (name == "rpi5") return rpi5_profile();
  std::string valid;
  for (const auto& n : profile_names()) valid += (valid.empty() ? "" : ", ") + n;
  return make_error("unknown node profile '" + std::string(name) + "' (expected one of: " + valid + ")");
}

result<uint64_t> parse_memory(std::string_view text) {
  const std::string what = "--memory '" + std::string(text) + "'";
  long double value = 0;
  std::string unit;
  if (!split_number(text, value, unit)) {
    return make_error(what + ": expected a number of bytes with an optional unit, e.g. 256MiB, 1GiB, 512M");
  }
  const std::string u = lower(unit);
  uint64_t scale = 0;
  if (u.empty() || u == "b") scale = 1;
  else if (u == "k" || u == "kib") scale = kib;
  else if (u == "m" || u == "mib") scale = mib;
  else if (u == "g" || u == "gib") scale = gib;
  else if (u == "t" || u == "tib") scale = tib;
  else if (u == "kb") scale = 1000ull;
  else if (u == "mb") scale = 1000000ull;
  else if (u == "gb") scale = 1000000000ull;
  else if (u == "tb") scale = 1000000000000ull;
  else {
    return make_error(what + ": unknown unit '" + unit +
                      "' (expected B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or kB, MB, GB, TB (powers of 1000))");
  }
  const long double bytes = std::floor(value * static_cast<long double>(scale));
  if (bytes >= static_cast<long double>(std::numeric_limits<uint64_t>::max())) {
    return make_error(what + ": too large");
  }
  if (bytes < 1) return make_error(what + ": the memory budget must be at least 1 byte");
  return static_cast<uint64_t>(bytes);
}

result<link_spec> parse_link(std::string_view text) {
  const std::string what = "--link '" + std::string(text) + "'";
  const auto colon = text.find(':');
  if (colon == std::string_view::npos || text.find(':', colon + 1) != std::string_view::npos) {
    return make_error(what + ": expected BANDWIDTH:LATENCY, e.g. 1gbit:100us or 100mbit:1ms");
  }
  const std::string_view bw_text = text.substr(0, colon);
  const std::string_view lat_text = text.substr(colon + 1);
  link_spec l;

  if (lower(trim(bw_text)) == "unlimited") {
    l.bandwidth_bps = 0;
  } else {
    long double v = 0;
    std::string unit;
    if (!split_number(bw_text, v, unit)) {
      return make_error(what + ": bandwidth '" + std::string(bw_text) + "' is not a number with a unit, e.g. 1gbit");
    }
    const std::string u = lower(unit);
    long double scale = 0;
    if (u == "bit") scale = 1;
    else if (u == "kbit") scale = 1e3L;
    else if (u == "mbit") scale = 1e6L;
    else if (u == "gbit") scale = 1e9L;
    else if (u == "tbit") scale = 1e12L;
    else if (u == "bps" || u == "kbps" || u == "mbps" || u == "gbps" || u == "b/s" || u == "kb/s" ||
             u == "mb/s" || u == "gb/s") {
      return make_error(what + ": bandwidth unit '" + unit +
                        "' is ambiguous (bits or bytes?): write bit, kbit, mbit or gbit (bits per second)");
    } else {
      return make_error(what + ": unknown bandwidth unit '" + unit +
                        "' (expected bit, kbit, mbit, gbit or tbit per second, or 'unlimited')");
    }
    const long double bps = std::floor(v * scale);
    if (bps < 1) return make_error(what + ": bandwidth must be at least 1 bit/s (or 'unlimited')");
    if (bps >= static_cast<long double>(std::numeric_limits<uint64_t>::max())) {
      return make_error(what + ": bandwidth too large");
    }
    l.bandwidth_bps = static_cast<uint64_t>(bps);
  }

  long double v = 0;
  std::string unit;
  if (!split_number(lat_text, v, unit)) {
    return make_error(what + ": latency '" + std::string(lat_text) + "' is not a number with a unit, e.g. 100us");
  }
  const std::string u = lower(unit);
  long double scale = 0;
  if (u == "ns") scale = 1e-3L;
  else if (u == "us") scale = 1;
  else if (u == "ms") scale = 1e3L;
  else if (u == "s") scale = 1e6L;
  else if (u.empty() && v == 0) scale = 1;
  else if (u.empty()) {
    return make_error(what + ": latency '" + std::string(lat_text) + "' needs a unit (ns, us, ms or s)");
  } else {
    return make_error(what + ": unknown latency unit '" + unit + "' (expected ns, us, ms or s)");
  }
  l.latency_us = static_cast<double>(v * scale);
  return l;
}

std::string to_string(const link_spec& l) {
  char bw[64];
  if (l.bandwidth_bps == 0) {
    std::snprintf(bw, sizeof bw, "unlimited");
  } else if (l.bandwidth_bps % 1000000000ull == 0) {
    std::snprintf(bw, sizeof bw, "%llu Gbit/s", static_cast<unsigned long long>(l.bandwidth_bps / 1000000000ull));
  } else if (l.bandwidth_bps >= 1000000ull) {
    std::snprintf(bw, sizeof bw, "%g Mbit/s", static_cast<double>(l.bandwidth_bps) / 1e6);
  } else {
    std::snprintf(bw, sizeof bw, "%g kbit/s", static_cast<double>(l.bandwidth_bps) / 1e3);
  }
  char lat[64];
  if (l.latency_us >= 1000.0) std::snprintf(lat, sizeof lat, "%g ms", l.latency_us / 1000.0);
  else std::snprintf(lat, sizeof lat, "%g us", l.latency_us);
  return std::string(bw) + ", " + lat;
}

byte_unit natural_unit(uint64_t bytes) {
  if (bytes >= tib) return byte_unit::tib;
  if (bytes >= gib) return byte_unit::gib;
  if (bytes >= mib) return byte_unit::mib;
  if (bytes >= kib) return byte_unit::kib;
  return byte_unit::b;
}

namespace {
uint64_t unit_size(byte_unit u) {
  switch (u) {
    case byte_unit::b: return 1;
    case byte_unit::kib: return kib;
    case byte_unit::mib: return mib;
    case byte_unit::gib: return gib;
    case byte_unit::tib: return tib;
  }
  return 1;
}
const char* unit_name(byte_unit u) {
  switch (u) {
    case byte_unit::b: return "B";
    case byte_unit::kib: return "KiB";
    case byte_unit::mib: return "MiB";
    case byte_unit::gib: return "GiB";
    case byte_unit::tib: return "TiB";
  }
  return "B";
}
}  // namespace

std::string format_in(uint64_t bytes, byte_unit unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", static_cast<double>(bytes) / static_cast<double>(unit_size(unit)),
                unit_name(unit));
  return buf;
}

std::string format_bytes(uint64_t bytes) {
  const byte_unit u = natural_unit(bytes);
  const uint64_t size = unit_size(u);
  char buf[64];
  if (bytes % size == 0) {
    std::snprintf(buf, sizeof buf, "%llu %s", static_cast<unsigned long long>(bytes / size), unit_name(u));
    return buf;
  }
  return format_in(bytes, u);
}

}  // namespace cellshard::topologies
