// kernels/dma.hpp: a host model of one Cell SPE's local store (LS) and of its
// memory flow controller (MFC), strict enough that code which runs correctly
// against it obeys the MFC's DMA rules.
//
// What it models (facts from the Cell BE Handbook and linux asm/spu.h, see
// shared/docs/CELL-SPU.md):
// - A 256 KiB local store (LS_SIZE). The SPU program's code, static data and
//   stack live in it too; we reserve `ls_code_reserve` + `ls_stack_reserve`
//   (64 KiB) for them and give kernels the remaining `ls_data_size` bytes
//   (192 KiB) as the data region. DMA may only touch the data region.
// - get (main memory "EA" -> LS), put (LS -> EA), and the list forms getl/putl
//   (2..2048 elements of 8 bytes each: stall-and-notify bit, 15-bit size,
//   low 32 bits of the EA; the high 32 bits come from the command).
// - Tag groups 0..31; a wait names a mask of tags and completes them.
//
// Rules enforced on every elementary transfer (a violation is a `fault`; the
// transfer is not performed; nothing aborts):
// - size 1, 2, 4 or 8 bytes: LS and EA naturally aligned, and equal in their
//   low 4 bits (the MFC moves the bytes within one quadword);
// - size >= 16: a multiple of 16, at most 16 KiB, LS and EA 16-byte aligned;
// - size 0 and every other size are rejected. (The hardware treats a 0-byte
//   request as a no-op; we reject it as it only ever comes from a tiling bug.)
// - LS range inside the data region; EA range inside an operand window that
//   the caller registered for this kernel (reads may extend to the enclosing
//   16-byte lines, which never leave the page; writes must stay exact). A get
//   copies only the bytes that belong to some operand and fills the rest of
//   those lines with 0xff (NaN as floats): on a Cell they would be whatever
//   lies next to the operand, which a kernel must never use, and the host
//   never reads outside the caller's objects;
// - lists: 2..2048 elements, 8-byte aligned in LS, no stall-and-notify bit,
//   no element crossing a 4 GiB EA boundary. An invalid list is rejected as a
//   whole. (The project's rule of at least 2 elements is stricter than the
//   MFC's 8-byte minimum list size: one element should be a plain get/put.)
//
// Completion: in `deferred` mode (the default) a transfer happens only when a
// wait names its tag, in issue order: code that reads an LS buffer before
// waiting for it, or overwrites a buffer whose put has not completed, sees
// wrong data in tests. `eager` mode copies at issue time. Both are legal MFC
// schedules.
//
// Faults are sticky: after the first one every later command is refused (and
// counted), so a kernel may check once at the end. `first_fault()` says what
// went wrong, where.
//
// Thread safety: an engine is used by one thread at a time (one SPE = one
// thread). Ownership: the engine owns its LS image; EA windows only point at
// caller memory for the duration of one kernel call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::kernels::dma {

// Local store geometry.
constexpr uint32_t ls_size = 256 * 1024;          // LS_SIZE
constexpr uint32_t ls_code_reserve = 48 * 1024;   // text + statics of the SPU program
constexpr uint32_t ls_stack_reserve = 16 * 1024;  // SPU stack (top of LS)
constexpr uint32_t ls_data_offset = ls_code_reserve;
constexpr uint32_t ls_data_size = ls_size - ls_code_reserve - ls_stack_reserve;  // 192 KiB
static_assert(ls_data_size == 192 * 1024, "the data region is 192 KiB");

// MFC limits (linux arch/powerpc/include/asm/spu.h).
constexpr uint32_t max_transfer = 16384;  // MFC_MAX_DMA_SIZE
constexpr uint32_t quadword = 16;         // MFC_MIN_DMA_SIZE for sizes >= 16
constexpr uint32_t tag_count = 32;
constexpr uint32_t list_min_elements = 2;
constexpr uint32_t list_max_elements = 2048;

enum class fault : uint8_t {
  none,
  size_zero,               // 0-byte transfer
  size_too_large,          // > 16 KiB
  size_not_multiple,       // >= 16 B but not a multiple of 16
  size_small_invalid,      // < 16 B and not 1, 2, 4 or 8
  ls_misaligned,           // >= 16 B and LS address not 16-B aligned
  ea_misaligned,           // >= 16 B and EA not 16-B aligned
  small_misaligned,        // 1/2/4/8 B not naturally aligned in LS or EA
  small_offset_mismatch,   // 1/2/4/8 B with LS and EA differing in the low 4 bits
  bad_tag,                 // tag > 31
  ls_out_of_range,         // LS range (or list) outside the data region
  ea_out_of_range,         // EA range outside the registered operand windows
  list_length,             // list size not 8*n with n in 2..2048
  list_misaligned,         // list not 8-B aligned in LS
  list_notify,             // stall-and-notify requested (not modelled)
  list_ea_wrap,            // list element crosses a 4 GiB EA boundary
  pending_at_exit,         // kernel ended with transfers in flight
  count
};
const char* to_string(fault f);

enum class completion : uint8_t { deferred, eager };

/// One DMA list element as it sits in the LS (8 bytes). Field names and
/// widths follow the Cell SDK's mfc_list_element_t; the emulation header
/// declares the identical bit-field struct.
struct list_element {
  uint64_t notify : 1;     // stall-and-notify (must be 0 here)
  uint64_t reserved : 16;
  uint64_t size : 15;      // bytes, 1..16384 under the rules above
  uint64_t eal : 32;       // low 32 bits of the EA
};
static_assert(sizeof(list_element) == 8, "a list element is 8 bytes");

/// Counters of accepted work. `transfers` counts elementary transfers (a list
/// contributes one per element); bytes are payload bytes.
struct counters {
  uint64_t commands = 0;       // get/put/getl/putl accepted
  uint64_t list_commands = 0;  // getl/putl accepted
  uint64_t transfers = 0;
  uint64_t bytes_get = 0;
  uint64_t bytes_put = 0;
  uint64_t waits = 0;
  uint64_t rejected = 0;       // commands refused (the first fault and any after it)
  void add(const counters& o);
};

/// What the first fault was and which request caused it.
struct fault_report {
  fault code = fault::none;
  const char* command = "";  // "get", "put", "getl", "putl", "wait", "finish"
  int64_t ls_offset = -1;    // offset of the LS address from the LS base (may be outside)
  uint64_t ea = 0;
  uint64_t size = 0;
  uint32_t tag = 0;
  std::string message() const;  // one line naming the rule and the request
};

class engine {
public:
  explicit engine(completion mode = completion::deferred);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // --- local store -------------------------------------------------------
  uint8_t* ls_base() { return ls_; }                       // 128-B aligned, 256 KiB
  uint8_t* data_base() { return ls_ + ls_data_offset; }    // the kernels' region
  static constexpr uint32_t data_size() { return ls_data_size; }
  /// Fills the data region with 0xff bytes (NaN as floats) so that reading
  /// LS data that no DMA brought in shows up in results.
  void poison_data();

  // --- operand windows (EA ranges the current kernel may touch) -----------
  void clear_windows();
  /// `bytes` from `p` may be read (extended to whole 16-B lines).
  void allow_read(const void* p, std::size_t bytes);
  /// `bytes` from `p` may be written (exactly).
  void allow_write(void* p, std::size_t bytes);

  // --- MFC commands (return fault::none when accepted) ---------------------
  fault get(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag);
  fault put(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag);
  /// `ea` supplies the high 32 bits of every element's EA; `list_bytes` is
  /// the list's size in bytes (8 per element), as mfc_getl's list_size.
  fault getl(volatile void* ls, uint64_t ea, const volatile void* list,
             uint32_t list_bytes, uint32_t tag);
  fault putl(volatile void* ls, uint64_t ea, const volatile void* list,
             uint32_t list_bytes, uint32_t tag);

  /// mfc_write_tag_mask / mfc_read_tag_status_all / _any: completes every
  /// pending transfer whose tag is in the mask (in issue order) and returns
  /// the mask. (`any` may complete more than one group: that is legal.)
  void write_tag_mask(uint32_t mask) { tag_mask_ = mask; }
  uint32_t read_tag_status_all();
  uint32_t read_tag_status_any();
  void wait(uint32_t mask) {
    write_tag_mask(mask);
    read_tag_status_all();
  }

  /// End of a kernel: a transfer still pending is a fault (pending_at_exit);
  /// pending transfers are dropped. Returns the sticky status.
  fault finish();

  fault status() const { return first_.code; }
  const fault_report& first_fault() const { return first_; }
  /// Clears the sticky fault (and drops pending transfers).
  void clear_fault();

  const counters& stats() const { return stats_; }
  void reset_stats() { stats_ = counters{}; }
  std::size_t pending() const { return pending_.size(); }

  void set_completion(completion m) { mode_ = m; }
  completion mode() const { return mode_; }

private:
  struct transfer {
    bool is_get;
    uint32_t ls_off;
    uint64_t ea;
    uint32_t size;
    uint32_t tag;
  };
  struct window {
    uint64_t lo, hi;              // [lo, hi): what a transfer may touch
    uint64_t exact_lo, exact_hi;  // the operand itself
    bool writable;
  };
  fault check(bool is_get, int64_t ls_off, uint64_t ea, uint64_t size) const;
  fault refuse(fault f, const char* cmd, int64_t ls_off, uint64_t ea, uint64_t size,
               uint32_t tag);
  fault single(bool is_get, const char* cmd, volatile void* ls, uint64_t ea,
               uint32_t size, uint32_t tag);
  fault list(bool is_get, const char* cmd, volatile void* ls, uint64_t ea,
             const volatile void* lst, uint32_t list_bytes, uint32_t tag);
  void perform(const transfer& t);
  void accept(const transfer& t);
  int64_t ls_offset(const volatile void* p) const;

  uint8_t* ls_ = nullptr;
  std::unique_ptr<uint8_t[]> storage_;
  completion mode_;
  uint32_t tag_mask_ = 0;
  std::vector<transfer> pending_;
  std::vector<window> windows_;
  std::vector<transfer> scratch_;  // list elements being validated
  counters stats_;
  fault_report first_;
};

}  // namespace cellshard::kernels::dma
