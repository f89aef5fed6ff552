/* kernels/spu/host/spu_mfcio.h: host emulation of the Cell SDK's spu_mfcio.h,
 * providing exactly the calls the SPU kernels use. Each call forwards to the
 * checked MFC model of the SPE the calling thread is bound to
 * (kernels/dma.hpp via kernels/spu/host/spu_host.hpp): a request the MFC
 * would reject is refused and recorded there, never performed.
 * Valid as C and as C++. Not for use on a real SPU (spu-gcc ships the real
 * header). */
#ifndef CELLSHARD_SPU_HOST_MFCIO_H
#define CELLSHARD_SPU_HOST_MFCIO_H

#include <stdint.h>

#define SPU_HOST_EMULATION 1

/* Same field names and widths as the SDK's list element. */
typedef struct mfc_list_element {
  uint64_t notify : 1;
  uint64_t reserved : 16;
  uint64_t size : 15;
  uint64_t eal : 32;
} mfc_list_element_t;

#ifdef __cplusplus
extern "C" {
#endif
void spu_host_mfc_get(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag);
void spu_host_mfc_put(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag);
void spu_host_mfc_getl(volatile void* ls, uint64_t ea, volatile void* list,
                       uint32_t list_size, uint32_t tag);
void spu_host_mfc_putl(volatile void* ls, uint64_t ea, volatile void* list,
                       uint32_t list_size, uint32_t tag);
void spu_host_mfc_write_tag_mask(uint32_t mask);
uint32_t spu_host_mfc_read_tag_status_all(void);
uint32_t spu_host_mfc_read_tag_status_any(void);
/* Start of the data region of the bound SPE's local store
 * (SPU_LS_DATA_BYTES long). On a real SPU this is a static array. */
unsigned char* spu_host_ls_data(void);
#ifdef __cplusplus
}
#endif

#define mfc_ea2h(ea) ((uint32_t)((uint64_t)(ea) >> 32))
#define mfc_ea2l(ea) ((uint32_t)(uint64_t)(ea))

static inline void mfc_get(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag,
                           uint32_t tid, uint32_t rid) {
  (void)tid;
  (void)rid;
  spu_host_mfc_get(ls, ea, size, tag);
}
static inline void mfc_put(volatile void* ls, uint64_t ea, uint32_t size, uint32_t tag,
                           uint32_t tid, uint32_t rid) {
  (void)tid;
  (void)rid;
  spu_host_mfc_put(ls, ea, size, tag);
}
static inline void mfc_getl(volatile void* ls, uint64_t ea, volatile void* list,
                            uint32_t list_size, uint32_t tag, uint32_t tid, uint32_t rid) {
  (void)tid;
  (void)rid;
  spu_host_mfc_getl(ls, ea, list, list_size, tag);
}
static inline void mfc_putl(volatile void* ls, uint64_t ea, volatile void* list,
                            uint32_t list_size, uint32_t tag, uint32_t tid, uint32_t rid) {
  (void)tid;
  (void)rid;
  spu_host_mfc_putl(ls, ea, list, list_size, tag);
}
static inline void mfc_write_tag_mask(uint32_t mask) { spu_host_mfc_write_tag_mask(mask); }
static inline uint32_t mfc_read_tag_status_all(void) {
  return spu_host_mfc_read_tag_status_all();
}
static inline uint32_t mfc_read_tag_status_any(void) {
  return spu_host_mfc_read_tag_status_any();
}

#endif
