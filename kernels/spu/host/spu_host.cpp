// The host side of the SPU emulation: forwards the emulated spu_mfcio.h calls
// to the checked MFC model of the bound SPE, and switches the x86 float mode
// for SPU arithmetic.
#include "kernels/spu/host/spu_host.hpp"

#include "kernels/spu/host/spu_mfcio.h"
#include "kernels/spu/spu_job.h"

#include <cfenv>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

static_assert(SPU_LS_DATA_BYTES == cellshard::kernels::dma::ls_data_size,
              "the SPU program and the MFC model agree on the data region");
static_assert(sizeof(mfc_list_element_t) == sizeof(cellshard::kernels::dma::list_element),
              "emulated list elements have the engine's layout");

namespace cellshard::kernels::spu_host {
namespace {
thread_local dma::engine* current = nullptr;
}

void bind(dma::engine* e) { current = e; }
dma::engine* bound() { return current; }

#if defined(__x86_64__) || defined(__i386__)
spu_arithmetic::spu_arithmetic() : saved_(_mm_getcsr()) {
  // RC (bits 13-14) = 11 round toward zero; FTZ (bit 15); DAZ (bit 6).
  _mm_setcsr(saved_ | 0x6000u | 0x8000u | 0x0040u);
}
spu_arithmetic::~spu_arithmetic() { _mm_setcsr(saved_); }
#else
spu_arithmetic::spu_arithmetic() : saved_(static_cast<unsigned>(std::fegetround())) {
  std::fesetround(FE_TOWARDZERO);
}
spu_arithmetic::~spu_arithmetic() { std::fesetround(static_cast<int>(saved_)); }
#endif

}  // namespace cellshard::kernels::spu_host

using cellshard::kernels::spu_host::bound;

extern "C" {

void spu_host_mfc_get(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag) {
  if (auto* e = bound()) e->get(ls, ea, size, tag);
}
void spu_host_mfc_put(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag) {
  if (auto* e = bound()) e->put(ls, ea, size, tag);
}
void spu_host_mfc_getl(volatile void* ls, uint64_t ea, volatile void* list, uint32_t list_size,
                       uint32_t tag) {
  if (auto* e = bound()) e->getl(ls, ea, list, list_size, tag);
}
void spu_host_mfc_putl(volatile void* ls, uint64_t ea, volatile void* list, uint32_t list_size,
                       uint32_t tag) {
  if (auto* e = bound()) e->putl(ls, ea, list, list_size, tag);
}
void spu_host_mfc_write_tag_mask(uint32_t mask) {
  if (auto* e = bound()) e->write_tag_mask(mask);
}
uint32_t spu_host_mfc_read_tag_status_all(void) {
  auto* e = bound();
  return e ? e->read_tag_status_all() : 0;
}
uint32_t spu_host_mfc_read_tag_status_any(void) {
  auto* e = bound();
  return e ? e->read_tag_status_any() : 0;
}
unsigned char* spu_host_ls_data(void) {
  auto* e = bound();
  return e ? e->data_base() : nullptr;
}

}  // extern "C"
