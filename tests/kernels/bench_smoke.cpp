// `bench kernels` as a library function: it runs, reports every backend and
// baseline, and its JSON has the documented shape. No timed assertions.
#include "bench/kernels_bench.hpp"
#include "kernels/native.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <set>
#include <sstream>

TEST_CASE("bench kernels runs a small shape and emits rows", "[bench][kernels]") {
  cellshard::bench::kernels_bench_options o;
  o.rows = 64;
  o.cols = 96;
  o.workers = 2;
  o.min_seconds = 0.001;
  o.probe_mib = 1;
  std::ostringstream out;
  std::string json;
  REQUIRE(cellshard::bench::run_kernels_bench(o, out, &json) == 0);
  CHECK(out.str().find("read bandwidth probe") != std::string::npos);
  const auto j = nlohmann::json::parse(json);
  std::set<std::string> names, backends;
  for (const auto& r : j) {
    names.insert(r.at("name").get<std::string>());
    CHECK(r.at("value").get<double>() > 0);
    if (r.at("params").contains("backend")) backends.insert(r.at("params").at("backend").get<std::string>());
    if (r.contains("baseline")) CHECK(r.at("ratio").get<double>() > 0);
  }
  CHECK(names.count("read_bandwidth") == 1);
  CHECK(names.count("sgemv_f32") == 1);
  CHECK(names.count("matvec_f32_speed") == 1);
  CHECK(names.count("matvec_q8_bandwidth") == 1);
  CHECK(names.count("matvec_q4_bandwidth") == 1);
  CHECK(backends == std::set<std::string>{"reference", "blas", "native", "spe"});

  o.backends = {"no-such-backend"};
  CHECK(cellshard::bench::run_kernels_bench(o, out, &json) == 1);
}

TEST_CASE("bench kernels --isa runs native at that level and restores it", "[bench][kernels]") {
  cellshard::bench::kernels_bench_options o;
  o.rows = 32;
  o.cols = 64;
  o.workers = 1;
  o.min_seconds = 0.001;
  o.probe_mib = 1;
  o.backends = {"native"};
  const auto before = cellshard::kernels::native::active_isa();
  o.isa = "portable";  // every CPU runs it
  std::ostringstream out;
  std::string json;
  REQUIRE(cellshard::bench::run_kernels_bench(o, out, &json) == 0);
  CHECK(out.str().find("native level portable") != std::string::npos);
  CHECK(cellshard::kernels::native::active_isa() == before);
  o.isa = "avx3";
  std::ostringstream bad;
  CHECK(cellshard::bench::run_kernels_bench(o, bad, &json) == 1);
  CHECK(bad.str().find("--isa 'avx3'") != std::string::npos);
  CHECK(cellshard::kernels::native::active_isa() == before);
}
