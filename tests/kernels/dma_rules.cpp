// The MFC model (kernels/dma.hpp): every rule the MFC enforces is enforced,
// a refused request copies nothing, faults are sticky and reported, valid
// requests copy exactly and are counted; deferred completion really defers.
// And through a kernel: a job whose DMA is refused reports the fault and
// leaves memory untouched.
#include "kernels/dma.hpp"
#include "kernels/spe.hpp"
#include "kernels/spu/spu_job.h"
#include "tests/kernels/common.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <sys/mman.h>
#include <vector>

using namespace cellshard::kernels;
using cellshard::test::buffer;
using dma::fault;

namespace {

struct fixture {
  dma::engine e{dma::completion::eager};
  buffer<uint8_t> mem{64 * 1024, 0};  // main memory, 128-aligned
  uint8_t* ls() { return e.data_base(); }
  uint64_t ea(std::size_t off) { return reinterpret_cast<uint64_t>(mem.data() + off); }
  fixture() {
    for (std::size_t i = 0; i < mem.size(); ++i) mem[i] = static_cast<uint8_t>(i * 7 + 1);
    std::memset(ls(), 0, dma::ls_data_size);
    e.allow_read(mem.data(), mem.size());
    e.allow_write(mem.data(), mem.size());
  }
  /// Issues a get; checks the fault, that a refused get copied nothing, and resets.
  void expect_get(uint32_t ls_off, std::size_t ea_off, uint32_t size, uint32_t tag, fault want) {
    std::vector<uint8_t> before(ls(), ls() + dma::ls_data_size);
    const fault f = e.get(ls() + ls_off, ea(ea_off), size, tag);
    INFO("get ls+" << ls_off << " ea+" << ea_off << " size " << size << " tag " << tag);
    CHECK(f == want);
    if (want != fault::none) {
      CHECK(std::memcmp(before.data(), ls(), dma::ls_data_size) == 0);
      CHECK(e.status() == want);
      CHECK(e.first_fault().message().find(dma::to_string(want)) != std::string::npos);
    } else {
      CHECK(std::memcmp(ls() + ls_off, mem.data() + ea_off, size) == 0);
    }
    e.clear_fault();
  }
  void expect_put(uint32_t ls_off, std::size_t ea_off, uint32_t size, fault want) {
    std::vector<uint8_t> before(mem.data(), mem.data() + mem.size());
    for (uint32_t i = 0; i < size && ls_off + i < dma::ls_data_size; ++i)
      ls()[ls_off + i] = static_cast<uint8_t>(0xc0 + i);
    const fault f = e.put(ls() + ls_off, ea(ea_off), size, 3);
    INFO("put ls+" << ls_off << " ea+" << ea_off << " size " << size);
    CHECK(f == want);
    if (want != fault::none)
      CHECK(std::memcmp(before.data(), mem.data(), mem.size()) == 0);
    else
      CHECK(std::memcmp(ls() + ls_off, mem.data() + ea_off, size) == 0);
    e.clear_fault();
  }
};

void set(dma::list_element& l, uint32_t size, uint32_t eal, bool notify = false) {
  l.notify = notify ? 1 : 0;
  l.reserved = 0;
  l.size = size;
  l.eal = eal;
}

}  // namespace

TEST_CASE("valid DMA sizes and alignments are accepted and copy exactly", "[kernels][dma]") {
  fixture f;
  f.expect_get(0, 0, 16, 0, fault::none);
  f.expect_get(16, 32, 16384, 31, fault::none);  // the maximum, the last tag
  f.expect_get(1024 + 16, 48, 4096 + 16, 5, fault::none);
  f.expect_get(3, 3, 1, 1, fault::none);     // 1 byte: any address, same low 4 bits
  f.expect_get(6, 22, 2, 1, fault::none);    // 2 bytes, 2-aligned, low nibble 6 = 6
  f.expect_get(12, 44, 4, 1, fault::none);   // 4 bytes
  f.expect_get(8, 4088, 8, 1, fault::none);  // 8 bytes
  f.expect_put(32, 64, 32, fault::none);
  f.expect_put(4, 20, 4, fault::none);
  f.expect_put(8, 8, 8, fault::none);
  f.expect_put(1, 17, 1, fault::none);
  CHECK(f.e.stats().commands == 11);
  CHECK(f.e.stats().transfers == 11);
  CHECK(f.e.stats().bytes_get == 16 + 16384 + 4112 + 1 + 2 + 4 + 8);
  CHECK(f.e.stats().bytes_put == 32 + 4 + 8 + 1);
}

TEST_CASE("every kind of DMA rule violation is refused", "[kernels][dma]") {
  fixture f;
  SECTION("size 0") { f.expect_get(0, 0, 0, 0, fault::size_zero); }
  SECTION("above 16 KiB") {
    f.expect_get(0, 0, 16384 + 16, 0, fault::size_too_large);
    f.expect_put(0, 0, 32768, fault::size_too_large);
  }
  SECTION("16-byte multiple on a misaligned address") {
    f.expect_get(8, 0, 32, 0, fault::ls_misaligned);
    f.expect_get(0, 4, 32, 0, fault::ea_misaligned);
    f.expect_put(0, 8, 16, fault::ea_misaligned);
  }
  SECTION(">= 16 bytes not a multiple of 16") {
    f.expect_get(0, 0, 24, 0, fault::size_not_multiple);
    f.expect_get(0, 0, 17, 0, fault::size_not_multiple);
    f.expect_put(0, 0, 100, fault::size_not_multiple);
  }
  SECTION("small sizes other than 1, 2, 4, 8") {
    for (uint32_t s : {3u, 5u, 6u, 7u, 9u, 12u, 15u}) f.expect_get(0, 0, s, 0, fault::size_small_invalid);
  }
  SECTION("small transfers not naturally aligned") {
    f.expect_get(2, 2, 4, 0, fault::small_misaligned);
    f.expect_get(4, 4, 8, 0, fault::small_misaligned);
    f.expect_get(1, 1, 2, 0, fault::small_misaligned);
    f.expect_put(6, 6, 4, fault::small_misaligned);
  }
  SECTION("small transfers whose LS and EA differ in the low 4 bits") {
    f.expect_get(0, 4, 4, 0, fault::small_offset_mismatch);
    f.expect_get(8, 0, 8, 0, fault::small_offset_mismatch);
    f.expect_put(4, 36 + 4, 4, fault::small_offset_mismatch);
  }
  SECTION("tag 32 and above") {
    f.expect_get(0, 0, 16, 32, fault::bad_tag);
    f.expect_get(0, 0, 16, 1000, fault::bad_tag);
  }
  SECTION("LS range outside the data region") {
    const fault want = fault::ls_out_of_range;
    CHECK(f.e.get(f.e.ls_base(), f.ea(0), 16, 0) == want);  // code region
    f.e.clear_fault();
    CHECK(f.e.get(f.e.data_base() - 16, f.ea(0), 16, 0) == want);
    f.e.clear_fault();
    CHECK(f.e.get(f.e.data_base() + dma::ls_data_size - 16, f.ea(0), 32, 0) == want);  // straddles
    f.e.clear_fault();
    CHECK(f.e.get(f.e.ls_base() + dma::ls_size - 16, f.ea(0), 16, 0) == want);  // stack region
    f.e.clear_fault();
    alignas(16) uint8_t host_stack[64];
    CHECK(f.e.get(host_stack, f.ea(0), 16, 0) == want);  // not in the LS at all
    f.e.clear_fault();
    CHECK(f.e.put(host_stack, f.ea(0), 16, 0) == want);
    f.e.clear_fault();
  }
  SECTION("EA outside the kernel's operands") {
    buffer<uint8_t> other(256);
    CHECK(f.e.get(f.ls(), reinterpret_cast<uint64_t>(other.data()), 16, 0) == fault::ea_out_of_range);
    f.e.clear_fault();
    CHECK(f.e.get(f.ls(), f.ea(f.mem.size() - 16), 32, 0) == fault::ea_out_of_range);
    f.e.clear_fault();
    // reads may cover the 16-byte lines around a window, writes may not
    dma::engine e2(dma::completion::eager);
    e2.allow_read(f.mem.data() + 4, 8);
    e2.allow_write(f.mem.data() + 4, 8);
    CHECK(e2.get(e2.data_base(), f.ea(0), 16, 0) == fault::none);
    CHECK(e2.put(e2.data_base(), f.ea(0), 16, 0) == fault::ea_out_of_range);
  }
}

TEST_CASE("DMA lists: 2..2048 valid elements, otherwise refused whole", "[kernels][dma]") {
  fixture f;
  auto* list = reinterpret_cast<dma::list_element*>(f.ls() + 64 * 1024);
  const uint64_t base = f.ea(0);
  const uint32_t lo = static_cast<uint32_t>(base);
  SECTION("valid lists gather and scatter") {
    set(list[0], 32, lo + 64);
    set(list[1], 16, lo + 1024);
    set(list[2], 16384, lo + 2048);
    CHECK(f.e.getl(f.ls(), base, list, 3 * 8, 7) == fault::none);
    CHECK(std::memcmp(f.ls(), f.mem.data() + 64, 32) == 0);
    CHECK(std::memcmp(f.ls() + 32, f.mem.data() + 1024, 16) == 0);
    CHECK(std::memcmp(f.ls() + 48, f.mem.data() + 2048, 16384) == 0);
    CHECK(f.e.stats().list_commands == 1);
    CHECK(f.e.stats().transfers == 3);
    for (uint32_t i = 0; i < 2048; ++i) set(list[i], 16, lo + 16 * (i % 64));
    CHECK(f.e.getl(f.ls(), base, list, 2048 * 8, 7) == fault::none);
    std::memset(f.ls(), 0xee, 32);
    set(list[0], 16, lo + 4096);
    set(list[1], 16, lo + 8192);
    CHECK(f.e.putl(f.ls(), base, list, 2 * 8, 9) == fault::none);
    CHECK(f.mem[4096] == 0xee);
    CHECK(f.mem[8192 + 15] == 0xee);
  }
  SECTION("a list of 1 or 2049 elements, or a size not a multiple of 8") {
    set(list[0], 16, lo);
    CHECK(f.e.getl(f.ls(), base, list, 8, 0) == fault::list_length);
    f.e.clear_fault();
    for (uint32_t i = 0; i < 2049; ++i) set(list[i], 16, lo);
    CHECK(f.e.getl(f.ls(), base, list, 2049 * 8, 0) == fault::list_length);
    f.e.clear_fault();
    CHECK(f.e.getl(f.ls(), base, list, 12, 0) == fault::list_length);
    f.e.clear_fault();
  }
  SECTION("an element breaking a transfer rule refuses the whole list") {
    std::memset(f.ls(), 0, 64);
    set(list[0], 16, lo);
    set(list[1], 24, lo + 16);  // not a multiple of 16
    CHECK(f.e.getl(f.ls(), base, list, 16, 0) == fault::size_not_multiple);
    CHECK(f.ls()[0] == 0);  // the valid first element was not performed either
    f.e.clear_fault();
    set(list[1], 16384 + 16, lo + 16);
    CHECK(f.e.getl(f.ls(), base, list, 16, 0) == fault::size_too_large);
    f.e.clear_fault();
    set(list[1], 16, lo + 8);
    CHECK(f.e.getl(f.ls(), base, list, 16, 0) == fault::ea_misaligned);
    f.e.clear_fault();
  }
  SECTION("notify bit, misaligned list, list outside the LS, bad tag, 4 GiB wrap") {
    set(list[0], 16, lo);
    set(list[1], 16, lo + 16, true);
    CHECK(f.e.getl(f.ls(), base, list, 16, 0) == fault::list_notify);
    f.e.clear_fault();
    set(list[1], 16, lo + 16);
    CHECK(f.e.getl(f.ls(), base, reinterpret_cast<uint8_t*>(list) + 4, 16, 0) ==
          fault::list_misaligned);
    f.e.clear_fault();
    alignas(8) dma::list_element outside[2];
    set(outside[0], 16, lo);
    set(outside[1], 16, lo);
    CHECK(f.e.getl(f.ls(), base, outside, 16, 0) == fault::ls_out_of_range);
    f.e.clear_fault();
    CHECK(f.e.getl(f.ls(), base, list, 16, 32) == fault::bad_tag);
    f.e.clear_fault();
    set(list[1], 32, 0xfffffff0u);
    CHECK(f.e.getl(f.ls(), base, list, 16, 0) == fault::list_ea_wrap);
    f.e.clear_fault();
  }
}

TEST_CASE("faults are sticky and deferred transfers complete only at the wait", "[kernels][dma]") {
  fixture f;
  SECTION("sticky") {
    CHECK(f.e.get(f.ls(), f.ea(0), 3, 0) == fault::size_small_invalid);
    CHECK(f.e.get(f.ls(), f.ea(0), 16, 0) == fault::size_small_invalid);  // refused too
    CHECK(f.ls()[0] == 0);
    CHECK(f.e.stats().rejected == 2);
    CHECK(f.e.finish() == fault::size_small_invalid);
  }
  SECTION("deferred") {
    f.e.set_completion(dma::completion::deferred);
    CHECK(f.e.get(f.ls(), f.ea(16), 16, 4) == fault::none);
    CHECK(f.e.get(f.ls() + 16, f.ea(32), 16, 5) == fault::none);
    CHECK(f.ls()[0] == 0);  // nothing until a wait names tag 4
    f.e.wait(1u << 5);
    CHECK(f.ls()[0] == 0);
    CHECK(std::memcmp(f.ls() + 16, f.mem.data() + 32, 16) == 0);
    f.e.wait(1u << 4);
    CHECK(std::memcmp(f.ls(), f.mem.data() + 16, 16) == 0);
    CHECK(f.e.finish() == fault::none);
  }
  SECTION("a kernel ending with transfers in flight") {
    f.e.set_completion(dma::completion::deferred);
    CHECK(f.e.put(f.ls(), f.ea(0), 16, 2) == fault::none);
    CHECK(f.e.pending() == 1);
    CHECK(f.e.finish() == fault::pending_at_exit);
    CHECK(f.e.pending() == 0);
  }
}

TEST_CASE("a refused DMA inside a kernel is reported and writes nothing", "[kernels][dma][spe]") {
  std::vector<float> W(16 * 20, 1.0f), x(20, 1.0f), out(16, -7.0f);
  alignas(128) spu_job job;
  std::memset(&job, 0, sizeof job);
  job.op = SPU_OP_MATVEC;
  job.ea[0] = reinterpret_cast<uint64_t>(out.data());
  job.ea[1] = reinterpret_cast<uint64_t>(W.data());
  job.ea[2] = reinterpret_cast<uint64_t>(x.data());
  job.arg[0] = 16;
  job.arg[1] = 20;
  job.arg[2] = 20;
  job.arg[3] = 0;
  job.arg[4] = 16;
  for (auto a : {spe::arithmetic::host, spe::arithmetic::spu}) {
    SECTION("output not among the writable operands") {
      const spe::window w[] = {{W.data(), W.size() * 4, false}, {x.data(), 80, false},
                               {out.data(), 64, false}};
      const spe::status st = spe::run_raw_job(&job, w, 3, a);
      CHECK(st.fault == fault::ea_out_of_range);
      CHECK(st.message.find("put") != std::string::npos);
      for (float v : out) CHECK(v == -7.0f);
    }
    SECTION("weights not among the operands") {
      const spe::window w[] = {{x.data(), 80, false}, {out.data(), 64, true}};
      const spe::status st = spe::run_raw_job(&job, w, 2, a);
      CHECK(st.fault == fault::ea_out_of_range);
      for (float v : out) CHECK(v == -7.0f);
    }
    SECTION("all operands: the same job succeeds") {
      const spe::window w[] = {{W.data(), W.size() * 4, false}, {x.data(), 80, false},
                               {out.data(), 64, true}};
      const spe::status st = spe::run_raw_job(&job, w, 3, a);
      CHECK(st.ok());
      for (float v : out) CHECK(v == 20.0f);
    }
  }
  SECTION("an unknown op is a bad job") {
    job.op = 99;
    CHECK(spe::run_raw_job(&job, nullptr, 0).spu == SPU_ERR_BAD_JOB);
  }
}

TEST_CASE("rows crossing a 4 GiB EA boundary split their DMA lists", "[kernels][dma][spe]") {
  // Map 128 KiB straddling an address that is a multiple of 4 GiB.
  const uintptr_t boundary = uintptr_t{0x2a5a} << 32;  // 42 TiB: above ASan's shadow too
  const std::size_t span = 128 * 1024;
  void* p = ::mmap(reinterpret_cast<void*>(boundary - span / 2), span, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED || reinterpret_cast<uintptr_t>(p) != boundary - span / 2) {
    WARN("skipped: could not map memory at a 4 GiB boundary");
    if (p != MAP_FAILED) ::munmap(p, span);
    return;
  }
  const int rows = 40, cols = 301, ld = 303;  // rows cross the boundary mid-row
  float* W = reinterpret_cast<float*>(boundary - 20 * ld * 4 - 52);
  cellshard::test::rng r(9);
  cellshard::test::fill(r, W, static_cast<std::size_t>(rows) * ld);
  std::vector<float> x(cols), out(rows), want(rows);
  cellshard::test::fill(r, x.data(), cols);
  cellshard::kernels::reference_backend().matvec(want.data(), W, x.data(), rows, cols, ld);
  for (uint32_t tile : {0u, 4096u}) {
    spe::options o;
    o.tile_bytes = tile;
    o.poison_ls = true;
    spe::set_options(o);
    const spe::status st = spe::matvec(out.data(), W, x.data(), rows, cols, ld);
    CHECK(st.ok());
    CHECK(cellshard::test::nmse(out.data(), want.data(), rows) < 1e-10);
  }
  spe::set_options(spe::options{});
  ::munmap(p, span);
}
