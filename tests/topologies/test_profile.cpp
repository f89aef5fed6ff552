// Node profiles (figures from HARDWARE.md) and the --memory / --link parsers.
#include "topologies/profile.hpp"

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

using namespace cellshard::topologies;

TEST_CASE("profiles carry HARDWARE.md's figures", "[profile]") {
  const profile ps3 = ps3_profile();
  CHECK(ps3.name == "ps3");
  CHECK(ps3.memory_bytes == 256ull * 1024 * 1024);
  CHECK(ps3.spe_workers == 6);
  CHECK(ps3.link.bandwidth_bps == 1000000000ull);
  CHECK(ps3.link.latency_us == 100.0);
  CHECK(ps3.gflops == Approx(153.6));  // 6 SPEs x 25.6
  CHECK(ps3.mem_bandwidth_gbs == Approx(25.6));
  CHECK(ps3.power_w > 0);

  const profile slim = ps3_slim_profile();
  CHECK(slim.name == "ps3-slim");
  CHECK(slim.memory_bytes == ps3.memory_bytes);
  CHECK(slim.spe_workers == ps3.spe_workers);
  CHECK(slim.gflops == ps3.gflops);
  CHECK(slim.power_w < ps3.power_w);

  const profile pi = rpi5_profile();
  CHECK(pi.memory_bytes == 8ull * 1024 * 1024 * 1024);
  CHECK(pi.spe_workers == 0);
  CHECK(pi.mem_bandwidth_gbs == Approx(17.0));
  CHECK(pi.gflops == Approx(150.0));
  CHECK(pi.link.bandwidth_bps == 1000000000ull);
}

TEST_CASE("host profile's budget is the physical memory", "[profile]") {
  const profile h = host_profile();
  CHECK(h.name == "host");
  REQUIRE(h.memory_bytes > 0);
  CHECK(h.link.bandwidth_bps == 0);  // unshaped
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      std::istringstream s(line.substr(9));
      unsigned long long kb = 0;
      s >> kb;
      CHECK(static_cast<double>(h.memory_bytes) == Approx(kb * 1024.0).epsilon(0.01));
    }
  }
}

TEST_CASE("find_profile", "[profile]") {
  for (const auto& n : profile_names()) {
    const auto p = find_profile(n);
    REQUIRE(p);
    CHECK(p->name == n);
  }
  const auto bad = find_profile("ps4");
  REQUIRE_FALSE(bad);
  CHECK(bad.message() == "unknown node profile 'ps4' (expected one of: host, ps3, ps3-slim, rpi5)");
}

TEST_CASE("parse_memory", "[profile]") {
  struct c {
    const char* text;
    uint64_t bytes;
  };
  for (const c& k : {c{"256MiB", 268435456ull}, c{"1GiB", 1073741824ull}, c{"512M", 536870912ull},
                     c{"512m", 536870912ull}, c{"1GB", 1000000000ull}, c{"2kB", 2000ull}, c{"64k", 65536ull},
                     c{"1024", 1024ull}, c{"1024B", 1024ull}, c{"1.5GiB", 1610612736ull},
                     c{" 256 MiB ", 268435456ull}, c{"1T", 1099511627776ull}, c{"0.5K", 512ull}}) {
    INFO(k.text);
    const auto r = parse_memory(k.text);
    REQUIRE(r);
    CHECK(*r == k.bytes);
  }
  for (const char* bad : {"", "abc", "MiB", "-5", "12XB", "0", "0.1", "1e9", "99999999999999999999999"}) {
    INFO(bad);
    CHECK_FALSE(parse_memory(bad));
  }
  CHECK(parse_memory("12XB").message() ==
        "--memory '12XB': unknown unit 'XB' (expected B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or kB, MB, "
        "GB, TB (powers of 1000))");
  CHECK(parse_memory("0").message() == "--memory '0': the memory budget must be at least 1 byte");
}

TEST_CASE("parse_link", "[profile]") {
  struct c {
    const char* text;
    uint64_t bps;
    double us;
  };
  for (const c& k : {c{"1gbit:100us", 1000000000ull, 100}, c{"100mbit:1ms", 100000000ull, 1000},
                     c{"941mbit:0", 941000000ull, 0}, c{"1.5gbit:2.5ms", 1500000000ull, 2500},
                     c{"10kbit:1s", 10000ull, 1e6}, c{"1Gbit:500ns", 1000000000ull, 0.5},
                     c{"unlimited:50us", 0ull, 50}, c{"64bit:0us", 64ull, 0}}) {
    INFO(k.text);
    const auto r = parse_link(k.text);
    REQUIRE(r);
    CHECK(r->bandwidth_bps == k.bps);
    CHECK(r->latency_us == Approx(k.us));
  }
  CHECK(parse_link("1gbit").message() == "--link '1gbit': expected BANDWIDTH:LATENCY, e.g. 1gbit:100us or 100mbit:1ms");
  CHECK(parse_link("1gbps:100us").message() ==
        "--link '1gbps:100us': bandwidth unit 'gbps' is ambiguous (bits or bytes?): write bit, kbit, mbit or gbit "
        "(bits per second)");
  CHECK(parse_link("1gbit:100").message() == "--link '1gbit:100': latency '100' needs a unit (ns, us, ms or s)");
  CHECK(parse_link("1gbit:5min").message() == "--link '1gbit:5min': unknown latency unit 'min' (expected ns, us, ms or s)");
  CHECK(parse_link("fast:1ms").message() ==
        "--link 'fast:1ms': bandwidth 'fast' is not a number with a unit, e.g. 1gbit");
  CHECK_FALSE(parse_link("0bit:1ms"));
  CHECK_FALSE(parse_link("1gbit:1ms:2"));
  CHECK_FALSE(parse_link("1zbit:1ms"));
}

TEST_CASE("link arithmetic and text", "[profile]") {
  const link_spec l{1000000000ull, 100};
  CHECK(l.transfer_s(125000) == Approx(100e-6 + 1e-3));
  CHECK(link_spec{}.transfer_s(1 << 20) == 0.0);
  CHECK(to_string(l) == "1 Gbit/s, 100 us");
  CHECK(to_string(link_spec{100000000ull, 1000}) == "100 Mbit/s, 1 ms");
  CHECK(to_string(link_spec{}) == "unlimited, 0 us");
}

TEST_CASE("byte formatting", "[profile]") {
  CHECK(format_bytes(268435456ull) == "256 MiB");
  CHECK(format_bytes(8ull << 30) == "8 GiB");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_in(432328704ull, byte_unit::mib) == "412.3 MiB");
  CHECK(format_in(209715ull, byte_unit::mib) == "0.2 MiB");
  CHECK(natural_unit(1023) == byte_unit::b);
  CHECK(natural_unit(1ull << 30) == byte_unit::gib);
}
