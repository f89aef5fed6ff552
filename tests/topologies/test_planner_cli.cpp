// `cellshard plan` end to end: the JSON keys of CLI.md, usage errors (exit 2),
// config.json input and the calibration list. Runs the built binary.
#include "tests/support.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>

using cellshard::test::cellshard_bin;
using cellshard::test::run_command;

TEST_CASE("cellshard plan --json has the keys of CLI.md", "[planner][cli]") {
  auto r = run_command({cellshard_bin(), "plan", "--model", "stories110m", "--hardware", "ps3", "--nodes", "3",
                        "--context", "1024", "--json", "-"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"memory_fit", "memory_per_node_bytes", "bandwidth_bound_tokens_per_s",
                          "link_bytes_per_token", "per_token_latency_s", "tokens_per_s", "failures_per_hour",
                          "request_failure_probability", "goodput_tokens_per_s", "energy_per_token_j",
                          "cost_per_million_tokens_usd", "power_w", "baseline"}) {
    CHECK(j.contains(key));
  }
  CHECK(j["memory_fit"] == true);
  CHECK(j["memory_per_node_bytes"] == 236961792.0);  // as test_planner.cpp computes by hand
  CHECK(j["topology"] == "pipeline:3");
  CHECK(j["checks"].size() == 6);
  CHECK(j["baseline"]["hardware"] == "h200-8x");
  CHECK(j["baseline"]["nodes"] == 1);
}

TEST_CASE("cellshard plan --json: Kimi K3 total and active parameters within 2 percent of the published ones",
          "[planner][cli][kimi]") {
  // Published: 2.78T total, ~104B active per token (HARDWARE.md; model_presets.hpp).
  auto r = run_command({cellshard_bin(), "plan", "--model", "kimi-k3", "--hardware", "ps3", "--nodes", "100000",
                        "--topology", "expert", "--baseline", "none", "--json", "-"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.contains("total_params"));
  REQUIRE(j.contains("active_params"));
  CHECK(j["total_params"].get<double>() == Approx(2.78e12).epsilon(0.02));
  CHECK(j["active_params"].get<double>() == Approx(104e9).epsilon(0.02));
}

TEST_CASE("cellshard plan: calibration list and config.json", "[planner][cli]") {
  const std::string dir = cellshard::test::temp_dir("plan-cli");
  const std::string csv = dir + "/sweep.csv";
  {
    std::ofstream f(csv);
    f << "# host: 20 GB/s, 2 cores\n"
         "model,topology,nodes,stages,tp,link,batch,ttft_ms,tpot_ms_p50,tpot_ms_p99,tokens_per_s,comm_share,"
         "bytes_per_token\n"
         "stories260K.bin,pipeline,1,1,1,none,1,0.6,0.061,0.1,1,0,0\n"
         "stories260K.bin,pipeline,3,3,1,none,1,0.6,0.065,0.1,1,0,0\n"
         "stories260K.bin,tensor,2,1,2,none,1,0.6,0.084,0.1,1,0,0\n"
         "stories260K.bin,tensor,4,1,4,none,1,0.6,0.139,0.1,1,0,0\n";
  }
  const std::string cfg = dir + "/config.json";
  {
    std::ofstream f(cfg);
    f << R"({"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
             "torch_dtype": "float16"})";
  }
  auto r = run_command({cellshard_bin(), "plan", "--model", cfg, "--hardware", "rpi5", "--nodes", "4", "--calibrate",
                        csv, "--baseline", "none", "--json", "-"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["calibration"].size() == 4);
  for (const auto& p : j["calibration"]) {
    for (const char* key : {"nodes", "topology", "measured_tpot_ms", "predicted_tpot_ms", "error"}) {
      CHECK(p.contains(key));
    }
  }
  CHECK(j["calibration"][0]["topology"] == "pipeline:1");
  CHECK_FALSE(j.contains("baseline"));
  CHECK(j["model"] == cfg);
  CHECK(j["memory_fit"] == true);
}

TEST_CASE("cellshard plan: held-out validation, the rows' own model, the uncertainty band", "[planner][cli]") {
  // Issue #25: a sweep of a non-preset model (lab.bin, the shape of
  // stories260K given by --calibrate-model) calibrates a plan of another
  // model; --holdout every:2 predicts rows 1 and 3 from a fit on rows 0, 2
  // and 4 (batch 8: one sequence per station step, as the runtime steps).
  const std::string dir = cellshard::test::temp_dir("plan-holdout");
  const std::string csv = dir + "/lab.csv";
  {
    std::ofstream f(csv);
    f << "# host: 20 GB/s, 2 cores\n"
         "model,topology,nodes,stages,tp,link,batch,ttft_ms,tpot_ms_p50,tpot_ms_p99,tokens_per_s,comm_share,"
         "bytes_per_token\n"
         "lab.bin,pipeline,1,1,1,none,1,0.6,0.061,0.1,14000,0.2,0\n"
         "lab.bin,pipeline,3,3,1,none,1,0.6,0.065,0.1,13000,0.2,512\n"
         "lab.bin,tensor,2,1,2,none,1,0.6,0.084,0.1,11000,0.6,5376\n"
         "lab.bin,tensor,4,1,4,none,1,0.6,0.139,0.1,7000,0.8,15000\n"
         "lab.bin,tensor,4,1,4,none,8,0.6,0.5,0.1,7000,0.8,15000\n";
  }
  const std::string report = dir + "/report.md";
  auto r = run_command({cellshard_bin(), "plan", "--model", "llama2-7b", "--hardware", "rpi5", "--nodes", "8",
                        "--calibrate", csv, "--calibrate-model", "stories260k", "--holdout", "every:2",
                        "--baseline", "none", "--json", "-", "--report", report});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out.substr(0, r.out.rfind('}') + 1));
  REQUIRE(j["validation"]["held_out"].size() == 2);
  CHECK(j["validation"]["holdout"] == "every:2:1");
  CHECK(j["validation"]["held_out"][0]["line"] == 4);
  CHECK(j["validation"]["held_out"][1]["line"] == 6);
  CHECK(j["validation"]["held_out"][0]["model"] == "stories260k");
  CHECK(j["validation"]["fitted_points"] == 3);  // rows 0, 2 and the batch-8 row 4
  CHECK(j["validation"]["skipped_rows"] == 0);
  CHECK(j["uncertainty"]["refits"] == 5);
  const auto lat = j["uncertainty"]["per_token_latency_s"];
  CHECK(lat[0].get<double>() <= j["per_token_latency_s"].get<double>() * (1 + 1e-9));
  CHECK(lat[1].get<double>() >= lat[0].get<double>());
  const std::string md = cellshard::test::read_file(report);
  CHECK(md.find("Largest held-out error: ") != std::string::npos);
  CHECK(md.find("--calibrate-model stories260k --holdout every:2") != std::string::npos);
  CHECK(md.find("| uncertainty |") != std::string::npos);

  auto bad = run_command({cellshard_bin(), "plan", "--model", "llama2-7b", "--nodes", "8", "--calibrate", csv,
                          "--holdout", "every:9"});
  CHECK(bad.status != 0);
  CHECK(bad.err.find("holds out no row") != std::string::npos);
  auto no_cal = run_command({cellshard_bin(), "plan", "--model", "llama2-7b", "--nodes", "8", "--holdout", "every:2"});
  CHECK(no_cal.status == 2);
  CHECK(no_cal.err.find("--holdout needs --calibrate") != std::string::npos);
}

TEST_CASE("cellshard plan: usage errors exit 2 naming the flag", "[planner][cli]") {
  auto bad_model = run_command({cellshard_bin(), "plan", "--model", "gpt-9", "--nodes", "3"});
  CHECK(bad_model.status == 2);
  CHECK(bad_model.err.find("--model") != std::string::npos);
  auto bad_topo = run_command({cellshard_bin(), "plan", "--model", "stories260k", "--nodes", "3", "--topology",
                               "tensor:8"});
  CHECK(bad_topo.status == 2);
  CHECK(bad_topo.err.find("KV heads") != std::string::npos);
  auto no_nodes = run_command({cellshard_bin(), "plan", "--model", "stories260k"});
  CHECK(no_nodes.status == 2);
}

TEST_CASE("cellshard plan -m FILE.gguf: the file's shape and bytes", "[planner][cli][gguf]") {
  const std::string path = cellshard::test::shared_file("models/gguf/llama2-small-q8_0.gguf");
  if (path.empty()) return;
  auto r = run_command({cellshard_bin(), "plan", "--model", path, "--hardware", "ps3", "--nodes", "2",
                        "--baseline", "none", "--json", "-"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto j = nlohmann::json::parse(r.out);
  // Its tensors' bytes, from the GGUF header as `inspect --json` lists them.
  auto ins = run_command({cellshard_bin(), "inspect", path, "--json", "-"});
  INFO(ins.err);
  REQUIRE(ins.status == 0);
  auto ij = nlohmann::json::parse(ins.out);
  double bytes = 0;
  for (const auto& t : ij["tensors"]) bytes += t["bytes"].get<double>();
  CHECK(j["model_bytes"].get<double>() == Approx(bytes).epsilon(1e-9));
}
