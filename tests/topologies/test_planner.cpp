// Tests of the planner's presets and its six checks (topologies/planner.hpp)
// against numbers computed here by hand from the architectures and the
// HARDWARE.md figures, and against the runtime's own placement.
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/gguf.hpp"
#include "topologies/model_presets.hpp"
#include "topologies/placement.hpp"
#include "topologies/plan_hardware.hpp"
#include "topologies/planner.hpp"

#include "tests/support.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <string>

using namespace cellshard;
using namespace cellshard::topologies;

namespace {

model_spec preset(const char* name) {
  auto m = find_model_preset(name);
  REQUIRE(m);
  return *m;
}

hardware_spec hardware(const char* name) {
  auto h = find_hardware_preset(name);
  REQUIRE(h);
  return *h;
}

plan_request request(const char* model, const char* hw, int nodes, const char* topo, int batch = 1,
                     int context = 4096) {
  plan_request r;
  r.model = preset(model);
  r.hw = hardware(hw);
  r.nodes = nodes;
  auto t = parse_plan_topology(topo);
  REQUIRE(t);
  r.topology = *t;
  r.batch = batch;
  r.context = context;
  return r;
}

plan_result run(const plan_request& r) {
  auto p = plan(r);
  INFO((p ? std::string() : p.message()));
  REQUIRE(p);
  return *p;
}

// GbE payload rate: 1e9 x 0.941 / 8 bytes/s (HARDWARE.md, itecnotes).
constexpr double gbe_Bps = 1e9 * 0.941 / 8;

}  // namespace

TEST_CASE("model presets count the weights their sources state", "[planner][presets]") {
  SECTION("stories presets count exactly what model::config counts") {
    const model::config c110{768, 2048, 12, 12, 12, 32000, 1024, true};
    CHECK(total_params(preset("stories110m")) == static_cast<double>(c110.total_params()));
    const model::config c260{64, 172, 5, 8, 4, 512, 512, true};
    CHECK(total_params(preset("stories260k")) == static_cast<double>(c260.total_params()));
    CHECK(total_params(spec_from_config(c260, "x")) == static_cast<double>(c260.total_params()));
  }
  SECTION("Kimi K2 MLA layer: q 7168x1536 + 1536 + 1536x64x192, kv_a 7168x576 + 512, kv_b 512x64x256, o 64x128x7168") {
    const model_spec k2 = preset("kimi-k2");
    const double hand = 7168.0 * 1536 + 1536 + 1536.0 * 64 * 192 + 7168.0 * 576 + 512 + 512.0 * 64 * 256 +
                        64.0 * 128 * 7168 + 2 * 7168;
    CHECK(attention_params(k2, 0) == hand);
    CHECK(hand == 101138432.0);
    // 60 MoE layers of 384 experts of 3 x 7168 x 2048.
    CHECK(expert_params(k2) == 3.0 * 7168 * 2048);
    CHECK(total_params(k2) == Approx(1.04e12).epsilon(0.03));
    CHECK(active_params(k2) == Approx(32e9).epsilon(0.03));
  }
  SECTION("Kimi K3: latent experts 3 x 3584 x 3072, 92 x 896 of them; 69 KDA + 24 MLA layers") {
    const model_spec k3 = preset("kimi-k3");
    CHECK(expert_params(k3) == 33030144.0);
    CHECK(expert_bytes(k3) == 33030144.0 * 17 / 32);  // MXFP4: 17 bytes per 32 weights
    double routed = 0;
    int kda = 0, mla = 0;
    for (int l = 0; l < k3.n_layers; ++l) {
      routed += layer_routed_params(k3, l);
      kda += k3.attention_of(l) == attention_kind::kda;
      mla += k3.attention_of(l) == attention_kind::mla;
    }
    CHECK(routed == 92.0 * 896 * 33030144.0);
    CHECK(kda == 69);
    CHECK(mla == 24);
    CHECK(k3.attention_of(3) == attention_kind::mla);
    CHECK(k3.attention_of(92) == attention_kind::mla);
    // Stated 2.78T / ~104B and a 1.56 TB checkpoint (HARDWARE.md: BF16, MXFP4
    // experts); the counted figures are within 2%.
    CHECK(k3.stated_total_params == 2.78e12);
    CHECK(total_params(k3) == Approx(2.78e12).epsilon(0.02));
    CHECK(active_params(k3) == Approx(104e9).epsilon(0.02));
    CHECK(weight_bytes_total(k3) == Approx(1.56e12).epsilon(0.02));
    // KV per position of an MLA layer: (512 + 64) x 2 bytes; KDA: a fixed state.
    CHECK(kv_bytes_per_position(k3, 3) == 1152.0);
    CHECK(kv_bytes_per_position(k3, 0) == 0.0);
    CHECK(state_bytes(k3, 0) == 96.0 * 128 * 128 * 4);
  }
  SECTION("unknown names are errors listing the presets") {
    auto m = find_model_preset("gpt-5");
    REQUIRE_FALSE(m);
    CHECK(m.message().find("kimi-k3") != std::string::npos);
    CHECK_FALSE(find_hardware_preset("ps4"));
  }
}

TEST_CASE("config.json and hw.json", "[planner][presets]") {
  const std::string cfg = R"({"hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
    "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 163840, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "torch_dtype": "bfloat16"})";
  auto m = spec_from_hf_json(cfg, "k2.json");
  REQUIRE(m);
  const model_spec k2 = preset("kimi-k2");
  CHECK(total_params(*m) == total_params(k2));
  CHECK(active_params(*m) == active_params(k2));
  CHECK(m->weight_bytes == 2.0);
  auto bad = spec_from_hf_json(R"({"hidden_size": 8})", "bad.json");
  REQUIRE_FALSE(bad);
  CHECK(bad.message().find("num_hidden_layers") != std::string::npos);

  auto h = hardware_from_json(R"({"base": "ps3", "memory_bytes": 209715200, "link": "10gbit:50us", "price_usd": 40})",
                              "hw.json");
  REQUIRE(h);
  CHECK(h->node.memory_bytes == 209715200u);
  CHECK(h->node.link.bandwidth_bps == 10000000000ull);
  CHECK(h->node.link.latency_us == 50.0);
  CHECK(h->price_usd == 40.0);
  CHECK(h->node.mem_bandwidth_gbs == 25.6);  // from the base
  CHECK_FALSE(hardware_from_json(R"({"power_w": -1})", "neg.json"));
}

TEST_CASE("topology text", "[planner]") {
  auto t = parse_plan_topology("hybrid:4x2");
  REQUIRE(t);
  CHECK(t->kind == plan_kind::hybrid);
  CHECK(t->stages == 4);
  CHECK(t->tp == 2);
  CHECK(to_string(*parse_plan_topology("expert:6")) == "expert:6");
  CHECK(to_string(*parse_plan_topology("pipeline")) == "pipeline");
  CHECK_FALSE(parse_plan_topology("hybrid:4"));
  CHECK_FALSE(parse_plan_topology("ring"));
  CHECK_FALSE(parse_plan_topology("tensor:0"));
  CHECK(distinct_experts(896, 16, 1) == Approx(16.0));
  CHECK(distinct_experts(8, 8, 3) == Approx(8.0));
}

TEST_CASE("check 1, memory: stories110m on 3 PS3s fits, as the runtime's placement counts it", "[planner][memory]") {
  const plan_result p = run(request("stories110m", "ps3", 3, "pipeline", 1, 1024));
  // Busiest node: the last stage, layers [8,12): 4 layers of 7,079,424 f32
  // weights, its own copy of the tied 32000 x 768 table and the final norm;
  // KV 2 x 4 layers x 1024 x 768 x 4; buffers (5 x 768 + 768 + 2 x 768 + 12 x
  // 1024 + 2 x 2048 + 32000) x 4.
  const double weights = 4 * 7079424.0 * 4 + 32000.0 * 768 * 4 + 768 * 4;
  const double kv = 2.0 * 4 * 1024 * 768 * 4;
  const double buffers = (5.0 * 768 + 768 + 2 * 768 + 12 * 1024 + 2 * 2048 + 32000) * 4;
  CHECK(p.memory_per_node_bytes == weights + kv + buffers);
  CHECK(p.memory_per_node_bytes == 236961792.0);
  CHECK(p.memory_fit);  // < 256 MiB = 268,435,456
  CHECK(p.checks[0].verdict == "fits");

  // The runtime's placement of the same model says the same.
  model::config cfg{768, 2048, 12, 12, 12, 32000, 1024, true};
  placement_options o;
  o.check_memory = false;
  auto pl = place(cfg, make_nodes(3, ps3_profile()), strategy{strategy_kind::pipeline, 3, 1}, o);
  REQUIRE(pl);
  uint64_t most = 0;
  for (const auto& s : pl->shards) most = std::max(most, s.memory.total());
  CHECK(static_cast<double>(most) == p.memory_per_node_bytes);

  // One PS3 cannot hold it: 12 layers + the table are 438 MB.
  const plan_result one = run(request("stories110m", "ps3", 1, "pipeline", 1, 1024));
  CHECK_FALSE(one.memory_fit);
  CHECK(one.checks[0].verdict == "does not fit");
  // Llama 2 7B in BF16 (13.5 GB + 2.1 GB of KV cache at 4096) does not fit
  // one 8 GiB Raspberry Pi 5; on two, the last stage holds 16 layers of
  // 202,383,360 weights, the 32000 x 4096 classifier, the final norm and
  // 16 layers x 2 x 4096 positions x 4096 x 2 bytes of KV: 7.81 GB.
  CHECK_FALSE(run(request("llama2-7b", "rpi5", 1, "pipeline", 1, 4096)).memory_fit);
  const plan_result two = run(request("llama2-7b", "rpi5", 2, "pipeline", 1, 4096));
  CHECK(two.memory_fit);
  const double w7 = 16 * 202383360.0 * 2 + 32000.0 * 4096 * 2 + 4096 * 2;
  const double kv7 = 16 * 2.0 * 4096 * 4096 * 2;
  CHECK(two.memory_per_node_bytes - w7 - kv7 == Approx((5.0 * 4096 + 3 * 4096 + 32 * 4096 + 2 * 11008 + 32000) * 4));
}

TEST_CASE("check 2, bandwidth: node GB/s over the bytes each node reads per token", "[planner][bandwidth]") {
  SECTION("stories110m on one node: all weights, the classifier table and the KV cache") {
    plan_request r = request("stories110m", "ps3", 1, "pipeline", 1, 1024);
    r.hw.node.memory_bytes = 1ull << 30;  // let it fit; the bound does not depend on it
    const plan_result p = run(r);
    const double read = 12 * 7079424.0 * 4   // layers
                        + 768 * 4            // one embedding row
                        + 32000.0 * 768 * 4  // the classifier (tied table)
                        + 12 * 2.0 * 1024 * 768 * 4;  // KV cache at 1024 positions
    CHECK(p.read_bytes_per_token == read);
    CHECK(p.bandwidth_bound_tokens_per_s == Approx(25.6e9 / read));
    // One node is memory bound (2 x 110M FLOPs take 1.1 ms at 153.6 GFLOPS):
    // chain = read / 25.6 GB/s + 2 hops x 100 us + (4 + 32000 x 4) bytes at 941 Mbit/s.
    // + the serialisation of those bytes (raw blobs at 4.46 GB/s, docs/performance.md).
    CHECK(p.chain_s == Approx(read / 25.6e9 + 2 * 100e-6 + (4 + 128000.0) / gbe_Bps + (4 + 128000.0) / 4.46e9)
                           .epsilon(1e-9));
    CHECK(p.hops == 2);
  }
  SECTION("llama3-8b on 4 Raspberry Pis: the busiest stage at 17 GB/s") {
    const plan_result p = run(request("llama3-8b", "rpi5", 4, "pipeline", 1, 4096));
    const model_spec m = preset("llama3-8b");
    // A layer: wq, wo 4096 x 4096; wk, wv 1024 x 4096; FFN 3 x 4096 x 14336; norms; BF16.
    const double layer = (2 * 4096.0 * 4096 + 2 * 1024.0 * 4096 + 3 * 4096.0 * 14336 + 2 * 4096) * 2;
    CHECK(layer_dense_params(m, 0) * 2 == layer);
    // Last stage: 8 layers + the untied classifier 128256 x 4096, KV 2 x 1024 x 2 bytes x 4096 per layer.
    const double last = 8 * layer + 128256.0 * 4096 * 2 + 8 * 2.0 * 1024 * 2 * 4096;
    CHECK(p.read_bytes_per_token == last);
    CHECK(p.bandwidth_bound_tokens_per_s == Approx(17e9 / last));
  }
}

TEST_CASE("check 3, links: the busiest link's bytes per token", "[planner][links]") {
  // Pipeline of stories110m: stages send 768 f32 (3 kB); the session receives
  // 32000 f32 logits (128 kB), which bounds it at 117.6 MB/s / 128 kB.
  const plan_result p = run(request("stories110m", "ps3", 3, "pipeline", 1, 1024));
  CHECK(p.link_bytes_per_token == 128000.0);
  CHECK(p.link_bound_tokens_per_s == Approx(gbe_Bps / 128000.0));
  // A TP group of 4 on stories260K: each rank sends 3 partials of 64 f32 per
  // all-reduce, two per layer, five layers; rank 0 also broadcasts x to 3
  // ranks and returns its 128 of the 512 logits (every rank of the last
  // stage classifies a quarter of the vocabulary, as its program says;
  // before issue #15's programs the planner had rank 0 return all 512).
  const plan_result t = run(request("stories260k", "ps3", 4, "tensor", 1, 512));
  CHECK(t.hops == 1 + 1 + 5 * 2 + 1);
  const double sync = 2.0 * 5 * 3 * 64 * 4;
  CHECK(t.link_bytes_per_token == std::max(sync + 3 * 64 * 4 + 128 * 4, 4 + sync));
  // The same with the runtime's --reduce scatter: 2(T-1)/T = 1.5 vectors per
  // all-reduce instead of 3, in two rounds (two hops) each.
  plan_request sr = request("stories260k", "ps3", 4, "tensor", 1, 512);
  sr.assume.scatter_gather = true;
  const plan_result s = run(sr);
  CHECK(s.hops == 1 + 1 + 5 * 2 * 2 + 1);
  const double sync_sg = 2.0 * 5 * 1.5 * 64 * 4;
  CHECK(s.link_bytes_per_token == std::max(sync_sg + 3 * 64 * 4 + 128 * 4, 4 + sync_sg));
  CHECK(s.wire_bytes_per_token < t.wire_bytes_per_token);
}

TEST_CASE("check 4, the serial chain and throughput with batching", "[planner][chain]") {
  plan_request r = request("stories110m", "ps3", 3, "pipeline", 6, 1024);
  const plan_result p = run(r);
  // Three stations: micro-batches of ceil(6/3) = 2, three of them; tokens/s =
  // min(6 / chain(2), 6 / (3 x busiest station(2)), link bound).
  CHECK(p.micro_batch == 2);
  auto l = lay_out(r);
  REQUIRE(l);
  const chain_costs c2 = chain_cost(r, *l, 2);
  const double expect = std::min({6.0 / c2.chain.seconds(r.assume), 6.0 / (3 * c2.busiest.seconds(r.assume)),
                                  p.link_bound_tokens_per_s});
  CHECK(p.tokens_per_s == Approx(expect));
  CHECK(p.per_token_latency_s == Approx(6.0 / expect));
  // The chain at batch 1 is the sum of its parts.
  CHECK(p.chain_s == Approx(p.chain_latency_s + p.chain_transfer_s + p.chain_compute_s + p.chain_overhead_s));
  CHECK(p.chain_latency_s == Approx(p.hops * 100e-6));
  // Calibrated overheads add linearly: one message more costs message_overhead_s.
  plan_request slow = r;
  slow.batch = 1;
  slow.assume.message_overhead_s = 1e-3;
  const plan_result a = run(slow);
  slow.assume.message_overhead_s = 0;
  const plan_result b = run(slow);
  auto lb = lay_out(slow);
  const double msgs = chain_cost(slow, *lb, 1).chain.messages;
  CHECK(a.chain_s - b.chain_s == Approx(msgs * 1e-3));
}

TEST_CASE("what-if: rank-to-rank forwarding between TP groups of equal width", "[planner][chain]") {
  // hybrid:2x2 on stories260K: into stage 1, rank 0 of stage 0 sends x (64
  // f32) to both ranks (the runtime), or each rank sends to its peer.
  plan_request r = request("stories260k", "ps3", 4, "hybrid:2x2", 1, 512);
  auto l = lay_out(r);
  REQUIRE(l);
  const cost_terms runtime_hop = chain_cost(r, *l, 1).station_hop[1];
  r.assume.peer_forwarding = true;
  const cost_terms peer_hop = chain_cost(r, *l, 1).station_hop[1];
  CHECK(runtime_hop.messages == 2);
  CHECK(runtime_hop.wire_s == Approx(100e-6 + 2 * 256 / gbe_Bps));
  CHECK(peer_hop.messages == 1);
  CHECK(peer_hop.wire_s == Approx(100e-6 + 256 / gbe_Bps));
}

TEST_CASE("check 5, failures: lambda from the node failure rate, 1 - exp(-lambda t)", "[planner][failures]") {
  plan_request r = request("stories110m", "ps3", 4, "pipeline:3", 1, 1024);
  r.hw.failures_per_year = 8766;  // one failure per node-hour
  r.assume.request_tokens = 1000;
  const plan_result p = run(r);
  // Pipeline of 3 stages on 4 nodes: 3 used, 1 spare.
  CHECK(p.layout.used_nodes == 3);
  CHECK(p.layout.spare_nodes == 1);
  CHECK(p.failures_per_hour == Approx(3.0));
  const double t = 1000 * p.per_token_latency_s;
  CHECK(p.request_failure_probability == Approx(1 - std::exp(-3.0 / 3600 * t)));
  // Goodput loses lambda x downtime of the time.
  CHECK(p.goodput_tokens_per_s == Approx(p.tokens_per_s * (1 - 3.0 / 3600 * p.downtime_per_failure_s)));
  CHECK(p.downtime_per_failure_s > r.assume.detect_s);
  CHECK(p.spares_last_hours == Approx(1.0 / 3.0));

  // PS3s at 5%/yr (SquareTrade, derived): 100,000 used nodes fail 0.57 times an hour.
  plan_request k = request("kimi-k3", "ps3", 100000, "expert");
  const plan_result q = run(k);
  CHECK(q.failures_per_hour == Approx(q.layout.used_nodes * 0.05 / 8766));
}

TEST_CASE("check 6, cost: power, energy per token, cost per million tokens", "[planner][cost]") {
  plan_request r = request("stories110m", "ps3-slim", 4, "pipeline:3", 1, 1024);
  const plan_result p = run(r);
  // 3 nodes at 96 W, 1 spare at 75 W idle (techcrunch); $60 each over 3 years; $0.12/kWh.
  CHECK(p.power_w == 3 * 96.0 + 75.0);
  CHECK(p.energy_per_token_j == Approx(p.power_w / p.goodput_tokens_per_s));
  const double usd_h = p.power_w / 1000 * 0.12 + 4 * 60.0 / (3 * 8766);
  CHECK(p.usd_per_hour == Approx(usd_h));
  CHECK(p.cost_per_million_tokens_usd == Approx(usd_h / (p.goodput_tokens_per_s * 3600) * 1e6));
}

TEST_CASE("Kimi K3 on 100,000 PS3s: expert parallel fits, and an 8x H200 server needs two", "[planner][kimi]") {
  const plan_result p = run(request("kimi-k3", "ps3", 100000, "expert"));
  CHECK(p.memory_fit);
  CHECK(p.memory_per_node_bytes <= 256.0 * 1048576);
  // Every one of the 92 x 896 experts is stored (one per node here).
  CHECK(static_cast<long>(p.layout.expert_nodes) * p.layout.experts_per_node >= 92L * 896);
  CHECK(p.layout.used_nodes + p.layout.spare_nodes == 100000);
  CHECK(p.tokens_per_s > 0);
  CHECK(p.power_w == Approx(100000 * 200.0));
  // Pipeline of whole layers cannot hold a 15.7 GB layer on 256 MiB.
  CHECK_FALSE(run(request("kimi-k3", "ps3", 100000, "pipeline")).memory_fit);
  // Too few PS3s: 1.56 TB does not fit in 1,000 x 256 MiB.
  CHECK_FALSE(run(request("kimi-k3", "ps3", 1000, "expert")).memory_fit);

  auto base = plan_baseline(request("kimi-k3", "ps3", 100000, "expert"), hardware("h200-8x"));
  REQUIRE(base);
  CHECK(base->memory_fit);
  CHECK(base->request.nodes == 2);  // 1.56 TB of weights > 8 x 141 GB
  CHECK(base->power_w == 20000.0);

  const std::string j = to_json(p);
  for (const char* key : {"memory_fit", "memory_per_node_bytes", "bandwidth_bound_tokens_per_s",
                          "link_bytes_per_token", "per_token_latency_s", "tokens_per_s", "failures_per_hour",
                          "request_failure_probability", "goodput_tokens_per_s", "energy_per_token_j",
                          "cost_per_million_tokens_usd", "power_w"}) {
    CHECK(j.find("\"" + std::string(key) + "\"") != std::string::npos);
  }
}

TEST_CASE("limits: topologies beyond the model or the nodes are errors", "[planner]") {
  CHECK_FALSE(plan(request("stories260k", "ps3", 8, "pipeline:6")));   // 5 layers
  CHECK_FALSE(plan(request("stories260k", "ps3", 8, "tensor:8")));     // 4 KV heads
  CHECK_FALSE(plan(request("stories260k", "ps3", 3, "hybrid:2x2")));   // needs 4 nodes
  CHECK_FALSE(plan(request("stories260k", "ps3", 8, "expert")));       // no experts
  const plan_result t = run(request("stories260k", "ps3", 8, "tensor"));  // 4 used, 4 spare
  CHECK(t.layout.topology.tp == 4);
  CHECK(t.layout.spare_nodes == 4);
}

// spec_from_model_file (`plan -m FILE`): the shape of the file's config, and
// bytes per weight from its tensors, so the spec's stored bytes are the
// file's tensor bytes; independent count: the GGUF tensors' own byte sizes.
TEST_CASE("planner: a GGUF or llama2.c file gives its shape and its tensor bytes", "[planner][gguf]") {
  struct file_case {
    const char* rel;
    bool moe;
  };
  for (const file_case fc : {file_case{"models/gguf/llama2-small-f32.gguf", false},
                             file_case{"models/gguf/llama2-small-q8_0.gguf", false},
                             file_case{"models/gguf/stories260K-f16.gguf", false},
                             file_case{"models/gguf/moe-small-f32.gguf", true}}) {
    const std::string path = cellshard::test::shared_file(fc.rel);
    if (path.empty()) return;
    INFO(path);
    auto spec = spec_from_model_file(path);
    REQUIRE(spec);
    auto mf = cellshard::model::model_file::open(path);
    REQUIRE(mf);
    const auto& c = (*mf)->cfg();
    CHECK(spec->dim == c.dim);
    CHECK(spec->n_layers == c.n_layers);
    CHECK(spec->n_kv_heads == c.n_kv_heads);
    CHECK(spec->vocab == c.vocab_size);
    CHECK(spec->is_moe() == fc.moe);
    double bytes = 0, elems = 0;
    for (const auto& t : (*mf)->gguf()->tensors()) {
      bytes += static_cast<double>(t.bytes);
      elems += static_cast<double>(t.elements());
    }
    CHECK(total_params(*spec) == Approx(elems).epsilon(1e-9));
    CHECK(weight_bytes_total(*spec) == Approx(bytes).epsilon(1e-9));
    CHECK(spec->format.rfind("GGUF ", 0) == 0);
  }
  // llama2.c f32: 4 bytes a weight, the header's count.
  const std::string bin = cellshard::test::shared_file("models/stories260K.bin");
  if (bin.empty()) return;
  auto spec = spec_from_model_file(bin);
  REQUIRE(spec);
  auto mf = cellshard::model::model_file::open(bin);
  REQUIRE(mf);
  CHECK(spec->weight_bytes == 4);
  CHECK(total_params(*spec) == Approx(static_cast<double>((*mf)->cfg().total_params())).epsilon(1e-12));
  // Not a model: the loader's error names the file.
  auto bad = spec_from_model_file(cellshard::test::shared_file("models/gguf/gguf-small-reference-ids.json"));
  REQUIRE_FALSE(bad);
  CHECK(bad.message().find("gguf-small-reference-ids.json") != std::string::npos);
}

TEST_CASE("a context beyond the model's maximum is named in a note", "[planner]") {
  // stories110m: 1024 positions (llama2.c's header).
  const auto has_note = [](const plan_result& p) {
    for (const auto& n : p.notes)
      if (n.find("beyond stories110m's maximum of 1024 positions") != std::string::npos) return true;
    return false;
  };
  CHECK(has_note(run(request("stories110m", "ps3", 3, "pipeline", 1, 4096))));
  CHECK_FALSE(has_note(run(request("stories110m", "ps3", 3, "pipeline", 1, 1024))));
}
