// The checked MFC model; rules and their sources are listed in kernels/dma.hpp.
#include "kernels/dma.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace cellshard::kernels::dma {

const char* to_string(fault f) {
  static const char* names[] = {
      "none",
      "size 0",
      "size above 16 KiB",
      "size >= 16 B not a multiple of 16",
      "size below 16 B not 1, 2, 4 or 8",
      "LS address not 16-B aligned",
      "EA not 16-B aligned",
      "small transfer not naturally aligned",
      "small transfer with LS and EA differing in the low 4 bits",
      "tag above 31",
      "LS range outside the data region",
      "EA range outside the kernel's operands",
      "list length not 2..2048 elements",
      "list not 8-B aligned",
      "list element asks for stall-and-notify",
      "list element crosses a 4 GiB EA boundary",
      "transfers still pending at kernel exit",
  };
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<int>(fault::count),
                "one name per fault");
  const int i = static_cast<int>(f);
  return i >= 0 && i < static_cast<int>(fault::count) ? names[i] : "?";
}

void counters::add(const counters& o) {
  commands += o.commands;
  list_commands += o.list_commands;
  transfers += o.transfers;
  bytes_get += o.bytes_get;
  bytes_put += o.bytes_put;
  waits += o.waits;
  rejected += o.rejected;
}

std::string fault_report::message() const {
  if (code == fault::none) return "";
  std::ostringstream s;
  s << "dma " << command << " rejected: " << to_string(code) << " (ls offset ";
  if (ls_offset >= 0)
    s << "0x" << std::hex << ls_offset;
  else
    s << "outside";
  s << std::hex << ", ea 0x" << ea << std::dec << ", size " << size << ", tag " << tag
    << ")";
  return s.str();
}

engine::engine(completion mode)
    : storage_(new uint8_t[ls_size + 128]), mode_(mode) {
  const auto p = reinterpret_cast<uintptr_t>(storage_.get());
  ls_ = storage_.get() + ((128 - (p & 127)) & 127);
  std::memset(ls_, 0, ls_size);
  pending_.reserve(4096);
  scratch_.reserve(list_max_elements);
}

engine::~engine() = default;

void engine::poison_data() { std::memset(data_base(), 0xff, ls_data_size); }

void engine::clear_windows() { windows_.clear(); }

void engine::allow_read(const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<uint64_t>(p);
  windows_.push_back({a & ~uint64_t{15}, (a + bytes + 15) & ~uint64_t{15}, a, a + bytes, false});
}

void engine::allow_write(void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<uint64_t>(p);
  windows_.push_back({a, a + bytes, a, a + bytes, true});
}

int64_t engine::ls_offset(const volatile void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(const_cast<const void*>(p));
  const auto b = reinterpret_cast<uintptr_t>(ls_);
  if (a < b || a >= b + ls_size) return -1;
  return static_cast<int64_t>(a - b);
}

fault engine::check(bool is_get, int64_t ls_off, uint64_t ea, uint64_t size) const {
  if (size == 0) return fault::size_zero;
  if (size > max_transfer) return fault::size_too_large;
  if (size < quadword) {
    if (size != 1 && size != 2 && size != 4 && size != 8) return fault::size_small_invalid;
    if (ls_off >= 0 && ((static_cast<uint64_t>(ls_off) % size) != 0 || ea % size != 0))
      return fault::small_misaligned;
    if (ls_off < 0 && ea % size != 0) return fault::small_misaligned;
    if (ls_off >= 0 && (static_cast<uint64_t>(ls_off) & 15) != (ea & 15))
      return fault::small_offset_mismatch;
  } else {
    if (size % quadword != 0) return fault::size_not_multiple;
    if (ls_off >= 0 && (ls_off & 15) != 0) return fault::ls_misaligned;
    if (ea % quadword != 0) return fault::ea_misaligned;
  }
  if (ls_off < static_cast<int64_t>(ls_data_offset) ||
      static_cast<uint64_t>(ls_off) + size > ls_data_offset + ls_data_size)
    return fault::ls_out_of_range;
  for (const window& w : windows_) {
    if (!is_get && !w.writable) continue;
    if (ea >= w.lo && ea + size <= w.hi && ea + size >= ea) return fault::none;
  }
  return fault::ea_out_of_range;
}

fault engine::refuse(fault f, const char* cmd, int64_t ls_off, uint64_t ea, uint64_t size,
                     uint32_t tag) {
  ++stats_.rejected;
  if (first_.code == fault::none) {
    first_.code = f;
    first_.command = cmd;
    first_.ls_offset = ls_off;
    first_.ea = ea;
    first_.size = size;
    first_.tag = tag;
  }
  return first_.code;
}

void engine::perform(const transfer& t) {
  auto* ea = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(t.ea));
  if (t.is_get) {
    // Copy the parts that belong to operands; the rest of the lines is NaN.
    const uint64_t lo = t.ea, hi = t.ea + t.size;
    bool whole = false;
    for (const window& w : windows_)
      if (w.exact_lo <= lo && hi <= w.exact_hi) whole = true;
    if (whole) {
      std::memcpy(ls_ + t.ls_off, ea, t.size);
    } else {
      std::memset(ls_ + t.ls_off, 0xff, t.size);
      for (const window& w : windows_) {
        const uint64_t a = std::max(lo, w.exact_lo), b = std::min(hi, w.exact_hi);
        if (a < b) std::memcpy(ls_ + t.ls_off + (a - lo), ea + (a - lo), b - a);
      }
    }
    stats_.bytes_get += t.size;
  } else {
    std::memcpy(ea, ls_ + t.ls_off, t.size);
    stats_.bytes_put += t.size;
  }
}

void engine::accept(const transfer& t) {
  ++stats_.transfers;
  if (mode_ == completion::eager)
    perform(t);
  else
    pending_.push_back(t);
}

fault engine::single(bool is_get, const char* cmd, volatile void* ls, uint64_t ea,
                     uint32_t size, uint32_t tag) {
  const int64_t off = ls_offset(ls);
  if (first_.code != fault::none) return refuse(first_.code, cmd, off, ea, size, tag);
  if (tag >= tag_count) return refuse(fault::bad_tag, cmd, off, ea, size, tag);
  const fault f = check(is_get, off, ea, size);
  if (f != fault::none) return refuse(f, cmd, off, ea, size, tag);
  ++stats_.commands;
  accept({is_get, static_cast<uint32_t>(off), ea, size, tag});
  return fault::none;
}

fault engine::list(bool is_get, const char* cmd, volatile void* ls, uint64_t ea,
                   const volatile void* lst, uint32_t list_bytes, uint32_t tag) {
  int64_t off = ls_offset(ls);
  if (first_.code != fault::none) return refuse(first_.code, cmd, off, ea, list_bytes, tag);
  if (tag >= tag_count) return refuse(fault::bad_tag, cmd, off, ea, list_bytes, tag);
  const uint32_t n = list_bytes / 8;
  if (list_bytes % 8 != 0 || n < list_min_elements || n > list_max_elements)
    return refuse(fault::list_length, cmd, off, ea, list_bytes, tag);
  const int64_t list_off = ls_offset(lst);
  if (list_off >= 0 && (list_off & 7) != 0)
    return refuse(fault::list_misaligned, cmd, list_off, ea, list_bytes, tag);
  if (list_off < static_cast<int64_t>(ls_data_offset) ||
      static_cast<uint64_t>(list_off) + list_bytes > ls_data_offset + ls_data_size)
    return refuse(fault::ls_out_of_range, cmd, list_off, ea, list_bytes, tag);
  if (off < 0) return refuse(fault::ls_out_of_range, cmd, off, ea, list_bytes, tag);

  const uint64_t hi = ea & ~uint64_t{0xffffffff};
  scratch_.clear();
  for (uint32_t i = 0; i < n; ++i) {
    list_element e;
    std::memcpy(&e, ls_ + list_off + 8 * i, sizeof e);
    const uint64_t eea = hi | e.eal;
    if (e.notify) return refuse(fault::list_notify, cmd, off, eea, e.size, tag);
    if (static_cast<uint64_t>(e.eal) + e.size > (uint64_t{1} << 32))
      return refuse(fault::list_ea_wrap, cmd, off, eea, e.size, tag);
    const fault f = check(is_get, off, eea, e.size);
    if (f != fault::none) return refuse(f, cmd, off, eea, e.size, tag);
    scratch_.push_back({is_get, static_cast<uint32_t>(off), eea, static_cast<uint32_t>(e.size), tag});
    off += e.size;
  }
  ++stats_.commands;
  ++stats_.list_commands;
  for (const transfer& t : scratch_) accept(t);
  return fault::none;
}

fault engine::get(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag) {
  return single(true, "get", ls, ea, size, tag);
}
fault engine::put(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag) {
  return single(false, "put", ls, ea, size, tag);
}
fault engine::getl(volatile void* ls, uint64_t ea, const volatile void* lst,
                   uint32_t list_bytes, uint32_t tag) {
  return list(true, "getl", ls, ea, lst, list_bytes, tag);
}
fault engine::putl(volatile void* ls, uint64_t ea, const volatile void* lst,
                   uint32_t list_bytes, uint32_t tag) {
  return list(false, "putl", ls, ea, lst, list_bytes, tag);
}

uint32_t engine::read_tag_status_all() {
  ++stats_.waits;
  if (pending_.empty()) return tag_mask_;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    const transfer& t = pending_[i];
    if (tag_mask_ & (1u << t.tag))
      perform(t);
    else
      pending_[keep++] = t;
  }
  pending_.resize(keep);
  return tag_mask_;
}

uint32_t engine::read_tag_status_any() { return read_tag_status_all(); }

fault engine::finish() {
  if (!pending_.empty()) {
    const transfer t = pending_.front();
    pending_.clear();
    refuse(fault::pending_at_exit, "finish", t.ls_off, t.ea, t.size, t.tag);
  }
  return first_.code;
}

void engine::clear_fault() {
  first_ = fault_report{};
  pending_.clear();
}

}  // namespace cellshard::kernels::dma
