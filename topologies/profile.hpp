// topologies/profile.hpp: what a node can hold and how fast it computes and
// talks: node profiles (host, ps3, ps3-slim, rpi5) and the parsers of the
// shared CLI flags `--memory BYTES` and `--link BANDWIDTH:LATENCY` (CLI.md).
//
// Pure value types and functions: no CAF, no global state, thread-safe.
// Errors are values (cellshard::result) whose message names the flag text and
// what was expected. Figures come from /work/shared/docs/HARDWARE.md; each
// constant below names the source HARDWARE.md cites for it.
#pragma once

#include "model/result.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cellshard::topologies {

/// A network link as the transport shapes it. bandwidth_bps == 0 means
/// unshaped (no rate limit); latency is the one-way delay per hop.
struct link_spec {
  uint64_t bandwidth_bps = 0;  // bits per second (decimal: 1 Gbit/s = 1e9)
  double latency_us = 0;       // one-way, microseconds

  /// Seconds to move `bytes` across one hop: latency + 8 * bytes / bandwidth.
  double transfer_s(uint64_t bytes) const;
};

/// One kind of node. Compute figures are peaks for the planner, not limits
/// the runtime enforces; memory_bytes is the budget the placement and the
/// shard's allocator accounting enforce. A value of 0 in a compute or power
/// field means "unknown: measure it" (host).
struct profile {
  std::string name;           // "host", "ps3", "ps3-slim", "rpi5"
  uint64_t memory_bytes = 0;  // memory budget for shards on this node, bytes
  int spe_workers = 0;        // Cell SPEs usable for kernels (0: not a Cell)
  link_spec link;             // the node's network link
  double gflops = 0;          // peak single-precision GFLOP/s
  double mem_bandwidth_gbs = 0;  // main-memory bandwidth, GB/s (1e9 bytes/s)
  double power_w = 0;         // wall power under load, watts
};

/// The machine this runs on: budget = physical memory (sysconf), or 1 TiB when
/// the OS does not say; link unshaped; compute and power unknown (0).
profile host_profile();
/// Sony PS3 (launch model) under Linux: 256 MiB, 6 SPEs, GbE, ~200 W.
profile ps3_profile();
/// PS3 Slim: same Cell and memory as the launch model; ~96 W gaming.
profile ps3_slim_profile();
/// Raspberry Pi 5, 8 GB: ~150 GFLOPS f32 peak, ~17 GB/s, GbE, ~9.8 W.
profile rpi5_profile();

/// Names accepted by find_profile, in CLI order: host, ps3, ps3-slim, rpi5.
const std::vector<std::string>& profile_names();
/// The profile called `name` (exact, lower case); error lists the valid names.
result<profile> find_profile(std::string_view name);

/// Parses a byte count for `--memory`: a number (fraction allowed) and an
/// optional unit, case-insensitive, optional space between:
///   (none) or B = bytes;  K, KiB = 1024;  M, MiB = 1024^2;  G, GiB = 1024^3;
///   T, TiB = 1024^4 (single letters are binary, as qemu/docker read them);
///   kB, MB, GB, TB = powers of 1000 (SI).
/// The result is rounded down to whole bytes and must be at least 1.
/// Examples: "256MiB" -> 268435456, "512M" -> 536870912, "1GB" -> 1e9.
result<uint64_t> parse_memory(std::string_view text);

/// Parses `--link BANDWIDTH:LATENCY`, e.g. "1gbit:100us", "100mbit:1ms".
/// BANDWIDTH: a number and one of bit, kbit, mbit, gbit, tbit (bits per second,
/// powers of 1000, as tc writes them), or "unlimited" (bandwidth_bps = 0).
/// Byte rates ("mbps", "MB/s") are rejected as ambiguous.
/// LATENCY: a number and one of ns, us, ms, s; a bare "0" is allowed.
result<link_spec> parse_link(std::string_view text);

/// "1 Gbit/s:100 us"-style text of a link (for tables and messages).
std::string to_string(const link_spec& l);

/// Bytes in the largest binary unit that keeps the value >= 1: "256 MiB",
/// "8 GiB", "23.4 GiB", "512 B". Whole values print without decimals, others
/// with one decimal.
std::string format_bytes(uint64_t bytes);

enum class byte_unit { b, kib, mib, gib, tib };
/// Bytes in a fixed unit with one decimal: format_in(432328704, mib) = "412.3 MiB".
std::string format_in(uint64_t bytes, byte_unit unit);
/// The largest binary unit in which `bytes` is at least 1 (b for 0).
byte_unit natural_unit(uint64_t bytes);

}  // namespace cellshard::topologies
