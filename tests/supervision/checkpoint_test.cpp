// Checkpoint archives: round trip, corruption detection (flipped byte,
// truncation), fallback to the previous snapshot, delta chains that stop at
// the first corrupt or missing delta, typed payloads, the file backend, and
// the byte-order independence of the format.
#include "supervision/checkpoint.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <cereal/types/map.hpp>

#include "tests/support.hpp"

using namespace cellshard::supervision;

namespace {

bytes blob(std::initializer_list<int> xs) {
  bytes b;
  for (int x : xs) b.push_back(static_cast<std::uint8_t>(x));
  return b;
}

bytes seq(std::uint8_t from, std::size_t n) {
  bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(from + i);
  return b;
}

// Flips one byte of a stored archive in place.
void flip(blob_store& store, const std::string& name, std::size_t offset) {
  auto b = store.get(name);
  REQUIRE(b);
  REQUIRE(offset < b->size());
  (*b)[offset] ^= 0x40;
  REQUIRE(store.put(name, *b));
}

struct kv_state {
  std::uint32_t layer = 0;
  std::vector<float> k, v;
  std::map<std::string, std::uint64_t> meta;
  template <class A>
  void serialize(A& ar) { ar(layer, k, v, meta); }
  bool operator==(const kv_state& o) const {
    return layer == o.layer && k == o.k && v == o.v && meta == o.meta;
  }
};

}  // namespace

TEST_CASE("snapshot round trip and newest-first restore", "[checkpoint]") {
  checkpoint_store store;
  REQUIRE(store.save("shard/3", 16, seq(1, 100)));
  REQUIRE(store.save("shard/3", 32, seq(2, 100)));
  auto c = store.restore("shard/3");
  REQUIRE(c);
  CHECK(c->end == 32);
  CHECK(c->payload == seq(2, 100));
  CHECK(c->skipped.empty());
  auto older = store.restore("shard/3", 31);  // at_most
  REQUIRE(older);
  CHECK(older->end == 16);
  CHECK(store.restore("other").message() == "no checkpoint for 'other'");
  CHECK(store.restore("shard/3", 15).message() == "no checkpoint for 'shard/3' with end <= 15");
  // Keys are escaped: 'shard' does not see 'shard/3' archives.
  CHECK_FALSE(store.restore("shard"));
}

TEST_CASE("a flipped byte is detected and restore falls back to the older snapshot",
          "[checkpoint]") {
  checkpoint_store store;
  REQUIRE(store.save("k", 16, seq(1, 64)));
  REQUIRE(store.save("k", 32, seq(9, 64)));
  auto newest = checkpoint_store::snapshot_name("k", 32);
  flip(store.backend(), newest, 40);  // inside the payload

  auto exact = store.restore_exact("k", 32);
  REQUIRE_FALSE(exact);
  CHECK(exact.message().rfind("checkpoint 'k' end 32: checksum mismatch (stored 0x", 0) == 0);

  auto c = store.restore("k");
  REQUIRE(c);
  CHECK(c->end == 16);
  CHECK(c->payload == seq(1, 64));
  REQUIRE(c->skipped.size() == 1);
  CHECK(c->skipped[0].find("checksum mismatch") != std::string::npos);

  // Corrupt the older one too: a clear error listing both causes.
  flip(store.backend(), checkpoint_store::snapshot_name("k", 16), 3);  // the magic
  auto none = store.restore("k");
  REQUIRE_FALSE(none);
  CHECK(none.message().find("no valid checkpoint for 'k': checkpoint 'k' end 32: checksum") == 0);
  CHECK(none.message().find("checkpoint 'k' end 16: bad magic") != std::string::npos);
}

TEST_CASE("every single-byte flip anywhere in an archive is detected", "[checkpoint]") {
  auto a = encode_archive(1, "key", 0, 7, seq(0, 33));
  REQUIRE(decode_archive(a));
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto b = a;
    b[i] ^= 0x01;
    INFO("offset " << i);
    CHECK_FALSE(decode_archive(b));
  }
  auto t = a;
  t.resize(a.size() - 1);
  CHECK(decode_archive(t).message().rfind("length mismatch", 0) == 0);
  CHECK(decode_archive(bytes(5)).message().rfind("truncated archive", 0) == 0);
}

TEST_CASE("the archive format is fixed little-endian bytes", "[checkpoint]") {
  // Same bytes on any host: magic, version 1, kind, length, cereal body, XXH64.
  auto a = encode_archive(2, "k", 3, 5, blob({0xAB}));
  REQUIRE(a.size() >= 24);
  CHECK(std::string(a.begin(), a.begin() + 4) == "CSCK");
  CHECK(a[4] == 1);
  CHECK(a[5] == 0);
  CHECK(a[6] == 2);
  std::uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<std::uint64_t>(a[8 + i]) << (8 * i);
  CHECK(len == a.size() - 24);
  // cereal portable binary: first body byte is the endianness flag (1 =
  // little), then the string length as u64 and its characters.
  CHECK(a[16] == 1);
  CHECK(a[17] == 1);
  CHECK(a[25] == 'k');
  auto d = decode_archive(a);
  REQUIRE(d);
  CHECK(d->kind == 2);
  CHECK(d->key == "k");
  CHECK(d->begin == 3);
  CHECK(d->end == 5);
  CHECK(d->payload == blob({0xAB}));
}

TEST_CASE("snapshots beyond keep_snapshots are pruned", "[checkpoint]") {
  checkpoint_store store(nullptr, checkpoint_options{3});
  for (std::uint64_t e = 1; e <= 6; ++e) REQUIRE(store.save("k", e * 10, seq(0, 4)));
  auto ends = store.snapshots("k");
  REQUIRE(ends);
  CHECK(*ends == std::vector<std::uint64_t>{40, 50, 60});
  REQUIRE(store.prune("k", 1));
  CHECK(*store.snapshots("k") == std::vector<std::uint64_t>{60});
  REQUIRE(store.erase("k"));
  CHECK(store.snapshots("k")->empty());
}

TEST_CASE("delta chains restore up to the first corrupt delta", "[checkpoint]") {
  checkpoint_store store;
  REQUIRE(store.append_delta("kv", 0, 4, seq(0, 4)));
  REQUIRE(store.append_delta("kv", 4, 8, seq(4, 4)));
  REQUIRE(store.append_delta("kv", 8, 12, seq(8, 4)));
  REQUIRE(store.append_delta("kv", 12, 16, seq(12, 4)));

  auto full = store.restore_deltas("kv");
  REQUIRE(full);
  CHECK(full->end == 16);
  CHECK(full->parts.size() == 4);
  CHECK(full->concatenated() == seq(0, 16));
  CHECK(full->stopped.empty());

  flip(store.backend(), checkpoint_store::delta_name("kv", 8, 12), 20);
  auto chain = store.restore_deltas("kv");
  REQUIRE(chain);
  CHECK(chain->end == 8);  // the highest consistent position
  CHECK(chain->concatenated() == seq(0, 8));
  CHECK(chain->stopped.rfind("delta [8, 12): checksum mismatch", 0) == 0);

  // up_to stops before a delta that would end past it.
  auto limited = store.restore_deltas("kv", 0, 6);
  REQUIRE(limited);
  CHECK(limited->end == 4);
  CHECK(limited->stopped == "delta [4, 8) ends past the limit 6");

  // Starting from a snapshot position.
  auto from4 = store.restore_deltas("kv", 4);
  REQUIRE(from4);
  CHECK(from4->begin == 4);
  CHECK(from4->end == 8);

  // After recovering at 8, a new delta from 8 supersedes the corrupt future.
  REQUIRE(store.append_delta("kv", 8, 10, seq(8, 2)));
  auto fixed = store.restore_deltas("kv");
  REQUIRE(fixed);
  CHECK(fixed->end == 10);
  CHECK(fixed->concatenated() == seq(0, 10));
  CHECK(fixed->stopped.empty());

  REQUIRE(store.drop_deltas_before("kv", 8));
  auto tail = store.restore_deltas("kv", 8);
  CHECK(tail->end == 10);
  CHECK(store.restore_deltas("kv", 0)->stopped == "gap: next delta [8, 10) does not begin at 0");
  CHECK(store.append_delta("kv", 5, 5, {}).message() == "delta 'kv' [5, 5): empty or reversed range");
}

TEST_CASE("a missing delta stops the chain at the gap", "[checkpoint]") {
  checkpoint_store store;
  REQUIRE(store.append_delta("g", 0, 2, seq(0, 2)));
  REQUIRE(store.append_delta("g", 2, 4, seq(2, 2)));
  REQUIRE(store.append_delta("g", 4, 6, seq(4, 2)));
  REQUIRE(store.backend().erase(checkpoint_store::delta_name("g", 2, 4)));
  auto chain = store.restore_deltas("g");
  REQUIRE(chain);
  CHECK(chain->end == 2);
  CHECK(chain->stopped == "gap: next delta [4, 6) does not begin at 2");
  auto empty = store.restore_deltas("none", 7);
  REQUIRE(empty);
  CHECK(empty->end == 7);
  CHECK(empty->parts.empty());
}

TEST_CASE("typed payloads through cereal", "[checkpoint]") {
  checkpoint_store store;
  kv_state s{3, {1.5f, -2.25f}, {0.125f}, {{"pos", 40}, {"epoch", 2}}};
  REQUIRE(store.save_object("layer3", 40, s));
  auto r = store.restore_object<kv_state>("layer3");
  REQUIRE(r);
  CHECK(r->first == 40);
  CHECK(r->second == s);
  // A payload that is not a kv_state: a clear error, not an exception.
  REQUIRE(store.save("junk", 1, blob({1, 2, 3})));
  auto bad = store.restore_object<kv_state>("junk");
  REQUIRE_FALSE(bad);
  CHECK(bad.message().rfind("checkpoint 'junk' end 1: cannot deserialise payload", 0) == 0);
}

TEST_CASE("file-backed store: survives reopening, detects corruption on disk", "[checkpoint]") {
  auto dir = cellshard::test::temp_dir("supervision_checkpoint");
  {
    auto fs = file_blob_store::open(dir);
    REQUIRE(fs);
    checkpoint_store store(*fs);
    REQUIRE(store.save("node 2/kv%", 8, seq(1, 50)));
    REQUIRE(store.save("node 2/kv%", 16, seq(2, 50)));
    REQUIRE(store.append_delta("node 2/kv%", 0, 8, seq(3, 8)));
  }
  auto fs = file_blob_store::open(dir);
  REQUIRE(fs);
  checkpoint_store store(*fs);
  CHECK(*store.snapshots("node 2/kv%") == std::vector<std::uint64_t>{8, 16});
  auto c = store.restore("node 2/kv%");
  REQUIRE(c);
  CHECK(c->end == 16);
  // Flip a byte in the file itself.
  auto path = (*fs)->path_of(checkpoint_store::snapshot_name("node 2/kv%", 16));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f);
    f.seekg(30);
    char ch = 0;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x10);
    f.seekp(30);
    f.write(&ch, 1);
  }
  c = store.restore("node 2/kv%");
  REQUIRE(c);
  CHECK(c->end == 8);
  CHECK(c->payload == seq(1, 50));
  REQUIRE(c->skipped.size() == 1);
  CHECK(store.restore_deltas("node 2/kv%")->end == 8);
  auto missing = file_blob_store::open("/proc/version/x");
  CHECK_FALSE(missing);
}
