/* kernels/spu/spu_job.h: the job block that the PPE side hands to an SPU
 * program, shared by both sides (C, no C++).
 *
 * A job is one kernel over one slice of the work (rows of a matvec, heads of
 * an attention). The PPE writes a 128-byte, 128-byte-aligned block in main
 * memory and passes its effective address (EA); the SPU fetches it by DMA,
 * runs the kernel (all operands by DMA), and puts back only the last 16 bytes
 * (status words). Both sides share one byte order (big-endian on a Cell, the
 * host's order in emulation).
 *
 * Operands per op (ea[] are EAs of caller-owned f32 arrays unless noted;
 * shapes and semantics as in kernels/backend.hpp):
 *   MATVEC     ea0 out, ea1 W, ea2 x; arg0 rows, arg1 cols, arg2 ld,
 *              arg3 first row, arg4 end row (this job's slice)
 *   MATVEC_Q8  as MATVEC with ea1 = q8_0 blocks (34 B each, ggml layout), no ld
 *   RMSNORM    ea0 out, ea1 x, ea2 weight; arg0 n
 *   ROPE       ea0 q, ea1 k; arg0 nq, arg1 nk, arg2 pos, arg3 head_size
 *   SOFTMAX    ea0 x; arg0 n
 *   ATTENTION  ea0 out, ea1 q, ea2 k_cache, ea3 v_cache, ea4 att; arg0 n_heads,
 *              arg1 kv_mul, arg2 head_size, arg3 kv_stride, arg4 pos,
 *              arg5 first head, arg6 end head
 *   SWIGLU     ea0 hb (in/out), ea1 hb2; arg0 n
 * Tunables (0 = the program's default): tile_bytes, the size of each of the
 * two streaming buffers (16..32768, multiple of 16); chunk_floats, the
 * element count of one chunk of the O(n) kernels (multiple of 4).
 */
#ifndef CELLSHARD_SPU_JOB_H
#define CELLSHARD_SPU_JOB_H

#include <stdint.h>

enum spu_op {
  SPU_OP_MATVEC = 1,
  SPU_OP_MATVEC_Q8 = 2,
  SPU_OP_RMSNORM = 3,
  SPU_OP_ROPE = 4,
  SPU_OP_SOFTMAX = 5,
  SPU_OP_ATTENTION = 6,
  SPU_OP_SWIGLU = 7
};

enum spu_status {
  SPU_OK = 0,
  SPU_ERR_BAD_JOB = 1,    /* unknown op or inconsistent shape */
  SPU_ERR_LS_BUDGET = 2,  /* the shape needs more local store than the data region */
  SPU_STATUS_COUNT = 3
};

/* The local store data region: 256 KiB minus 48 KiB (code, statics) minus
 * 16 KiB (stack). Must equal kernels/dma.hpp's ls_data_size. */
#define SPU_LS_DATA_BYTES (192u * 1024u)
#define SPU_DEFAULT_TILE_BYTES 32768u
#define SPU_MAX_TILE_BYTES 32768u
#define SPU_DEFAULT_CHUNK_FLOATS 8192u

typedef struct spu_job {
  uint32_t op;            /* enum spu_op */
  uint32_t tile_bytes;    /* tunable, 0 = default */
  uint32_t chunk_floats;  /* tunable, 0 = default */
  uint32_t reserved0;
  uint64_t ea[6];         /* operand EAs (see above) */
  int32_t arg[8];         /* shapes (see above) */
  uint32_t reserved1[4];
  /* written back by the SPU (the last 16 bytes): */
  uint32_t status;        /* enum spu_status */
  uint32_t detail;        /* with SPU_ERR_LS_BUDGET: bytes the shape needed */
  uint32_t ls_high_water; /* bytes of the data region the job used */
  uint32_t reserved2;
} spu_job;

#define SPU_JOB_BYTES 128u
#define SPU_JOB_STATUS_OFFSET 112u

#endif
