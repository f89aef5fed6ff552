// A node's slice cache (model/slice_cache.hpp, issue #17): a stored slice
// comes back verified; a corrupt or truncated file is dropped with its
// reason (a miss, so the node fetches it again); least recently used slices
// leave first when --cache-max is reached; a slice larger than the bound is
// refused, saying so.
#include "model/slice_cache.hpp"

#include "model/synth.hpp"
#include "tests/support.hpp"

#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

using namespace cellshard;

namespace {

struct two_slices {
  std::shared_ptr<const model::model_file> f;
  model::manifest a, b;  // layers 0-1 and 2-4 of stories260k's shape
  std::vector<uint8_t> sa, sb;
};

two_slices make() {
  two_slices t;
  auto c = model::synth_preset("stories260k");
  REQUIRE(c);
  auto f = model::model_file::from_bytes(model::synth_bytes(*c, 3), "synth.bin");
  REQUIRE(f);
  t.f = *f;
  auto s = model::slice_spec::whole(*c);
  s.layer_end = 2;
  s.classifier = false;
  t.a = model::make_manifest(*t.f, s, "synth.bin").value();
  s.layer_begin = 2;
  s.layer_end = c->n_layers;
  s.embedding = false;
  s.classifier = true;
  t.b = model::make_manifest(*t.f, s, "synth.bin").value();
  for (auto* p : {&t.a, &t.b}) {
    std::vector<uint8_t> bytes(p->bytes());
    REQUIRE(model::copy_slice_bytes(*p, t.f->file_image(), 0, bytes.size(), bytes.data()));
    (p == &t.a ? t.sa : t.sb) = std::move(bytes);
  }
  return t;
}

uint64_t file_size(const std::string& p) {
  struct stat sb;
  return ::stat(p.c_str(), &sb) == 0 ? static_cast<uint64_t>(sb.st_size) : 0;
}

}  // namespace

TEST_CASE("slice cache: stored slices come back verified, corruption and truncation are misses", "[slice_cache]") {
  auto t = make();
  const std::string dir = test::temp_dir("slice-cache") + "/cache";  // created by open()
  auto c = model::slice_cache::open(dir, 0);
  REQUIRE(c);
  ::unlink(c->path_of(t.a).c_str());  // each SECTION runs this case again on the same folder
  auto miss = c->get(t.a);
  REQUIRE(miss);
  CHECK_FALSE(miss->found);
  CHECK(miss->dropped.empty());
  REQUIRE(c->put(t.a, t.sa.data(), t.sa.size()));
  CHECK(file_size(c->path_of(t.a)) == t.sa.size());
  auto hit = c->get(t.a);
  REQUIRE(hit);
  REQUIRE(hit->found);
  CHECK(hit->bytes == t.sa);
  SECTION("a flipped byte") {
    std::fstream f(c->path_of(t.a), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(t.sa.size() / 2));
    const char x = static_cast<char>(t.sa[t.sa.size() / 2] ^ 0x10);
    f.write(&x, 1);
  }
  SECTION("a truncated file") {
    REQUIRE(::truncate(c->path_of(t.a).c_str(), static_cast<off_t>(t.sa.size() - 100)) == 0);
  }
  auto bad = c->get(t.a);
  REQUIRE(bad);
  CHECK_FALSE(bad->found);
  CHECK_THAT(bad->dropped, Catch::Contains("cache file " + c->path_of(t.a)));
  CHECK(file_size(c->path_of(t.a)) == 0);  // removed
  REQUIRE(c->put(t.a, t.sa.data(), t.sa.size()));  // refilled
  auto again = c->get(t.a);
  REQUIRE(again);
  CHECK(again->found);
}

TEST_CASE("slice cache: least recently used out, a slice beyond --cache-max refused", "[slice_cache]") {
  auto t = make();
  const std::string dir = test::temp_dir("slice-cache-lru");
  const uint64_t big = std::max(t.sa.size(), t.sb.size());
  // Room for the larger slice and less than both together.
  auto c = model::slice_cache::open(dir, big + std::min(t.sa.size(), t.sb.size()) - 1);
  REQUIRE(c);
  ::unlink(c->path_of(t.a).c_str());
  ::unlink(c->path_of(t.b).c_str());
  REQUIRE(c->put(t.a, t.sa.data(), t.sa.size()));
  REQUIRE(c->put(t.b, t.sb.data(), t.sb.size()));  // a leaves
  CHECK(c->used() == t.sb.size());
  CHECK_FALSE(c->get(t.a)->found);
  CHECK(c->get(t.b)->found);
  auto small = model::slice_cache::open(dir, t.sa.size() - 1);
  REQUIRE(small);
  CHECK_FALSE(small->fits(t.sa.size()));
  auto no = small->put(t.a, t.sa.data(), t.sa.size());
  REQUIRE_FALSE(no);
  CHECK_THAT(no.message(), Catch::Contains("no room") && Catch::Contains(std::to_string(t.sa.size()) + " bytes"));
  auto notdir = model::slice_cache::open(c->path_of(t.b), 0);
  REQUIRE_FALSE(notdir);
  CHECK_THAT(notdir.message(), Catch::Contains("not a folder"));
}
