// The raw-blob payload encoding: round trip through CAF's binary serializer,
// the byte-order conversion path, and checksum failures.
#include "actors/messages.hpp"
#include "kernels/backend.hpp"
#include "tests/support.hpp"

#include <caf/all.hpp>

#include <cmath>
#include <cstring>

using namespace cellshard;

namespace {
std::vector<float> sample_floats(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.25f - 3.0f;
  return v;
}
}  // namespace

TEST_CASE("blob round-trips through CAF's binary serializer", "[actors][blob]") {
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  caf::actor_system sys{cfg};
  actors::activation a;
  a.id = {42, 3, 17, 2};
  a.x.data = sample_floats(1000);
  a.compute_ns = 123;
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(a));
  // The payload is raw: 1000 floats take 4000 bytes plus a small header.
  CHECK(buf.size() < 4000 + 100);
  actors::activation b;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(source(b));
  CHECK(b.id.session == 42);
  CHECK(b.id.epoch == 3);
  CHECK(b.id.pos0 == 17);
  CHECK(b.x.ok());
  CHECK(b.x.data == a.x.data);
}

TEST_CASE("a blob from a host of the other byte order is converted", "[actors][blob][endian]") {
  actors::blob x;
  x.data = sample_floats(257);
  auto swapped = x.encode_swapped();
  // The wire bytes really are in the other order: the flag and the first float differ.
  auto native = x.encode();
  CHECK(swapped[0] != native[0]);
  CHECK(std::memcmp(swapped.data() + 13, native.data() + 13, 4) != 0);
  auto y = actors::blob::decode(swapped);
  CHECK(y.ok());
  CHECK(y.data == x.data);
}

// fuzz/regressions/blob/empty-from-big-endian: a valid empty blob from a
// big-endian sender made decode() hand memcpy the null data() of an empty
// vector (UBSan: null pointer passed as argument 1); encode() did the same.
TEST_CASE("an empty blob encodes and decodes, in either byte order", "[actors][blob]") {
  const actors::blob empty;
  for (const auto& bytes : {empty.encode(), empty.encode_swapped()}) {
    REQUIRE(bytes.size() == 13u);
    const auto y = actors::blob::decode(bytes);
    CHECK(y.ok());
    CHECK(y.data.empty());
  }
}

TEST_CASE("a corrupted blob fails its checksum", "[actors][blob]") {
  actors::blob x;
  x.data = sample_floats(64);
  auto bytes = x.encode();
  bytes[13 + 4 * 10] ^= 0x10;  // flip one bit of float 10
  auto y = actors::blob::decode(bytes);
  CHECK_FALSE(y.ok());
  CHECK(y.status == 1);
  bytes.resize(bytes.size() - 2);
  CHECK(actors::blob::decode(bytes).status == 2);
  CHECK(actors::blob::decode({}).status == 2);
}

TEST_CASE("a shard program op round-trips through its wire form and unknown values are refused", "[actors][program]") {
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  caf::actor_system sys{cfg};
  topologies::shard_step r;
  r.op = topologies::shard_op::reduce;
  r.layers = {3, 4};
  r.part = topologies::layer_part::ffn;
  r.partial = false;
  r.algorithm = topologies::reduce_algorithm::direct_rank_order;
  r.peers = {4, 5, 6};
  actors::wiring w;
  w.group_index = {4, 5, 6};
  w.program = {actors::to_wire(r)};
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(w));
  actors::wiring back;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(source(back));
  REQUIRE(back.program.size() == 1u);
  CHECK(back.group_index == std::vector<int32_t>{4, 5, 6});
  auto s = actors::from_wire(back.program[0]);
  REQUIRE(s.ok());
  CHECK(s->op == topologies::shard_op::reduce);
  CHECK(s->layers == topologies::range{3, 4});
  CHECK(s->part == topologies::layer_part::ffn);
  CHECK(s->peers == std::vector<int>{4, 5, 6});
  CHECK(topologies::to_string(*s) == "reduce layer 3 ffn over [4,5,6] (direct, rank order)");
  // The reduce-scatter + all-gather algorithm travels as its value too.
  r.algorithm = topologies::reduce_algorithm::scatter_gather;
  auto sg = actors::from_wire(actors::to_wire(r));
  REQUIRE(sg.ok());
  CHECK(sg->algorithm == topologies::reduce_algorithm::scatter_gather);
  CHECK(topologies::to_string(*sg) == "reduce layer 3 ffn over [4,5,6] (scatter+gather, rank order)");
  auto bad = back.program[0];
  bad.op = 99;
  CHECK(actors::from_wire(bad).message() == "program op 99 unknown to this build (0..7)");
  // Issue #23: a dispatch's holder lists and an expert op's experts travel too.
  topologies::shard_step d;
  d.op = topologies::shard_op::dispatch;
  d.layers = {1, 2};
  d.part = topologies::layer_part::ffn;
  d.peers = {1, 2, 3};
  d.holders = {{1, 2}, {2, 3}, {3, 1}};
  auto dd = actors::from_wire(actors::to_wire(d));
  REQUIRE(dd.ok());
  CHECK(dd->holders == d.holders);
  CHECK(dd->peers == d.peers);
  topologies::shard_step x;
  x.op = topologies::shard_op::expert;
  x.layers = {0, 4};
  x.experts = {1, 3, 5};
  x.peers = {0};
  auto xx = actors::from_wire(actors::to_wire(x));
  REQUIRE(xx.ok());
  CHECK(xx->experts == x.experts);
  CHECK(topologies::to_string(*xx) == "expert layers [0,4) experts {1,3,5} for [0]");
  auto short_holders = actors::to_wire(d);
  short_holders.holders.pop_back();
  CHECK_THAT(actors::from_wire(short_holders).message(), Catch::Contains("holder lists longer than the holders sent"));
  bad = back.program[0];
  bad.algorithm = 7;
  CHECK(actors::from_wire(bad).message() == "reduce algorithm 7 unknown to this build");
}

// --sync q8_0 (protocol 8): flags bit 1, ggml block_q8_0 blocks as payload.
TEST_CASE("a q8_0 blob travels as block_q8_0 blocks and decodes to the sender's values",
          "[actors][blob][sync]") {
  actors::blob x;
  x.data = sample_floats(70);  // -3, -2.75, ..., 14.25: blocks of 32, 32 and 6
  kernels::round_to_q8(x.data.data(), x.data.size());
  x.q8 = true;
  const auto bytes = x.encode();
  REQUIRE(bytes.size() == 13 + 3 * 34);
  CHECK((bytes[0] & 2) != 0);
  uint32_t n;
  std::memcpy(&n, bytes.data() + 1, 4);
  CHECK(n == 70);
  // Block 1 holds 5, 5.25, ..., 12.75 of the original ramp (max 12.75):
  // q = value / (12.75 / 127) to the nearest integer (within half a step;
  // 6.0 falls on a tie), and the last one is 127.
  const char* b1 = bytes.data() + 13 + 34;
  for (int i = 0; i < 32; ++i) {
    const double v = (32 + i) * 0.25 - 3.0;
    INFO("value " << v);
    CHECK(std::fabs(static_cast<int8_t>(b1[2 + i]) - v / (12.75 / 127.0)) <= 0.5 + 1e-4);
  }
  CHECK(static_cast<int8_t>(b1[2 + 31]) == 127);
  // The last block's padding is zero.
  const char* b2 = bytes.data() + 13 + 68;
  for (int i = 6; i < 32; ++i) CHECK(b2[2 + i] == 0);
  auto y = actors::blob::decode(bytes);
  REQUIRE(y.ok());
  CHECK(y.q8);
  CHECK(y.data == x.data);
  // From a host of the other byte order: the scales are swapped, values the same.
  auto z = actors::blob::decode(x.encode_swapped());
  REQUIRE(z.ok());
  CHECK(z.data == x.data);
  // A flipped bit fails the checksum; an unknown flag is malformed.
  auto bad = bytes;
  bad[13 + 40] ^= 0x01;
  CHECK(actors::blob::decode(bad).status == 1);
  bad = bytes;
  bad[0] = static_cast<char>(bad[0] | 4);
  CHECK(actors::blob::decode(bad).status == 2);
}
