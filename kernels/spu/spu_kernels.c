/* kernels/spu/spu_kernels.c: the SPU side of the `spe` kernels, written
 * against the Cell SDK interfaces (spu_mfcio.h, spu_intrinsics.h) in C99.
 *
 * One program serves every kernel: spu_run_job(ea) fetches a job block
 * (kernels/spu/spu_job.h) by DMA, runs the kernel it names over its slice of
 * the work and puts the status words back. On a Cell, main() below takes job
 * addresses from the inbound mailbox. On a host the same source is compiled
 * as C++ against kernels/spu/host/ (emulated intrinsics, DMA through the
 * checked MFC model of kernels/dma.hpp) and driven by kernels/spe.cpp.
 *
 * Discipline, for every kernel:
 * - Only the LS data region (SPU_LS_DATA_BYTES = 192 KiB; 64 KiB are left
 *   for code, statics and stack) holds data; it is carved by ls_alloc(),
 *   which refuses to go over budget (the job then ends with
 *   SPU_ERR_LS_BUDGET and the bytes it needed).
 * - Operands arrive by mfc_get/mfc_getl, results leave by mfc_put, every
 *   transfer following the MFC rules: the 16-byte lines enclosing a wanted
 *   range are fetched (the bytes around it are never used; padding is zeroed
 *   in the LS before use); results are put exactly, with 1/2/4/8-byte
 *   transfers for unaligned heads and tails, so that neighbouring data (and
 *   other SPEs' rows) is never written.
 * - Matrix rows (and KV-cache rows) stream through two tile buffers: while
 *   the SPU computes on one, the MFC fills the other (tags 0 and 1). A tile
 *   is gathered with one DMA list (one element per 16 KiB of each row).
 * - Arithmetic is on 4-wide float vectors (vec_float4); dot products keep 4
 *   vector accumulators (16 lanes) and reduce at the end of the row.
 *
 * Misalignment: a row starting s floats past a 16-byte boundary is used in
 * place; the vector it is multiplied with (x of a matvec, q of attention) is
 * held in one copy per shift s that occurs, zero-padded in front, so both
 * line up. Shifts are computed from the whole matrix (not one job's rows),
 * so results do not depend on how rows are split among SPEs.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <spu_intrinsics.h>
#include <spu_mfcio.h>

#include "spu_job.h"

/* ---- tags --------------------------------------------------------------- */
enum {
  TAG_TILE0 = 0, /* tile buffer 0; TAG_TILE0 + 1 for buffer 1 */
  TAG_IN = 2,    /* vector operands */
  TAG_IN2 = 3,
  TAG_OUT0 = 4,  /* results; TAG_OUT0 + 1 for the second output buffer */
  TAG_JOB = 6
};
#define TAG_ALL 0xffffffffu
#define DMA_MAX 16384u

static void wait_tags(uint32_t mask) {
  mfc_write_tag_mask(mask);
  (void)mfc_read_tag_status_all();
}

/* ---- the LS data region and its allocator ------------------------------- */
#ifdef SPU_HOST_EMULATION
#define LS_DATA() spu_host_ls_data()
#else
static unsigned char ls_data[SPU_LS_DATA_BYTES] __attribute__((aligned(128)));
#define LS_DATA() ls_data
#endif

typedef struct arena {
  unsigned char* base;
  uint32_t used;  /* bytes handed out (including alignment) */
  uint32_t high;  /* high-water mark */
  uint32_t need;  /* with over: the bytes the refused request would have needed */
  int over;
} arena;

/* 128-byte aligned (the MFC's fastest alignment); NULL when over budget. */
static void* ls_alloc(arena* a, uint64_t bytes) {
  const uint64_t start = ((uint64_t)a->used + 127u) & ~(uint64_t)127u;
  if (a->over || start + bytes > SPU_LS_DATA_BYTES) {
    if (!a->over) a->need = start + bytes > 0xffffffffu ? 0xffffffffu : (uint32_t)(start + bytes);
    a->over = 1;
    return 0;
  }
  a->used = (uint32_t)(start + bytes);
  if (a->used > a->high) a->high = a->used;
  return a->base + start;
}

static float* ls_floats(arena* a, uint64_t n) { return (float*)ls_alloc(a, n * 4u); }

/* ---- DMA helpers -------------------------------------------------------- */
static uint64_t floor16(uint64_t ea) { return ea & ~(uint64_t)15; }
static uint64_t ceil16(uint64_t ea) { return (ea + 15u) & ~(uint64_t)15; }

/* Largest LS footprint of the enclosing lines of `bytes` bytes at any offset. */
static uint32_t lines_max(uint32_t bytes) { return (bytes + 30u) & ~15u; }

/* Gets the 16-byte lines enclosing [ea, ea+bytes) into ls (16-byte aligned)
 * in pieces of at most 16 KiB; returns ea's byte offset within ls. */
static uint32_t get_lines(void* ls, uint64_t ea, uint32_t bytes, uint32_t tag) {
  uint64_t lo = floor16(ea);
  const uint64_t hi = ceil16(ea + bytes);
  unsigned char* p = (unsigned char*)ls;
  while (lo < hi) {
    const uint32_t n = hi - lo > DMA_MAX ? DMA_MAX : (uint32_t)(hi - lo);
    mfc_get(p, lo, n, tag, 0, 0);
    p += n;
    lo += n;
  }
  return (uint32_t)(ea & 15u);
}

/* Puts exactly [ea, ea+bytes) from ls, which must have ea's low 4 bits:
 * naturally aligned 1/2/4/8-byte pieces up to the first 16-byte boundary and
 * after the last, 16-byte multiples (at most 16 KiB each) in between. */
static void put_exact(void* ls, uint64_t ea, uint32_t bytes, uint32_t tag) {
  unsigned char* p = (unsigned char*)ls;
  while (bytes > 0) {
    uint32_t n;
    if ((ea & 15u) == 0 && bytes >= 16u) {
      n = bytes & ~15u;
      if (n > DMA_MAX) n = DMA_MAX;
    } else {
      n = 8;
      while (n > 1 && ((ea & (n - 1)) != 0 || n > bytes)) n >>= 1;
    }
    mfc_put(p, ea, n, tag, 0, 0);
    p += n;
    ea += n;
    bytes -= n;
  }
}

/* Vector operands: fetch n floats into buf (capacity n + 8 floats) in two
 * steps so that several fetches can share one wait. settle moves the floats
 * to buf[0..n) and zeroes buf up to the next multiple of 4. */
static uint32_t issue_floats(float* buf, uint64_t ea, uint32_t n, uint32_t tag) {
  return get_lines(buf, ea, n * 4u, tag);
}
static void settle_floats(float* buf, uint32_t off, uint32_t n) {
  uint32_t i;
  if (off != 0) memmove(buf, (unsigned char*)buf + off, n * 4u);
  for (i = n; i < ((n + 3u) & ~3u); ++i) buf[i] = 0.0f;
}
static void fetch_floats(float* buf, uint64_t ea, uint32_t n, uint32_t tag) {
  const uint32_t off = issue_floats(buf, ea, n, tag);
  wait_tags(1u << tag);
  settle_floats(buf, off, n);
}
/* Puts buf[0..n) (capacity n + 4 floats) to ea: moves the floats to ea's
 * offset within the quadword first. The caller waits on `tag` before
 * touching buf again. */
static void store_floats(float* buf, uint64_t ea, uint32_t n, uint32_t tag) {
  const uint32_t off = (uint32_t)(ea & 15u);
  if (off != 0) memmove((unsigned char*)buf + off, buf, n * 4u);
  put_exact((unsigned char*)buf + off, ea, n * 4u, tag);
}

/* ---- row streams (double-buffered tiles of strided rows) ---------------- */
#define STREAM_MAX_ROWS 256u
#define STREAM_LIST_CAP 512u

typedef struct stream {
  uint64_t ea0;     /* EA of the wanted bytes of row 0 */
  uint64_t stride;  /* bytes from one row to the next */
  uint32_t bytes;   /* wanted bytes per row */
  uint32_t next, end; /* rows [next, end) not yet issued */
  uint32_t cap;     /* bytes per tile buffer */
  unsigned char* buf[2];
  mfc_list_element_t* list[2];
  uint32_t* line[2]; /* per row of the tile: LS offset of its first line in buf */
  uint32_t first[2], rows[2];
  int fail;          /* a row did not fit an empty tile: the planner's error */
} stream;

static int stream_alloc(stream* s, arena* a, uint32_t tile_bytes) {
  int b;
  s->cap = tile_bytes;
  s->fail = 0;
  for (b = 0; b < 2; ++b) {
    s->buf[b] = (unsigned char*)ls_alloc(a, tile_bytes);
    s->list[b] = (mfc_list_element_t*)ls_alloc(a, STREAM_LIST_CAP * sizeof(mfc_list_element_t));
    s->line[b] = (uint32_t*)ls_alloc(a, STREAM_MAX_ROWS * 4u);
  }
  return !a->over;
}

/* Issues the gets of one group of list elements [g0, n) whose EAs share the
 * high word `hi` into buf + ls_off: a plain get for one element, else a list. */
static void stream_flush(stream* s, int b, uint32_t g0, uint32_t n, uint32_t hi,
                         uint32_t ls_off) {
  mfc_list_element_t* l = s->list[b];
  const uint32_t tag = TAG_TILE0 + (uint32_t)b;
  if (n - g0 == 1)
    mfc_get(s->buf[b] + ls_off, ((uint64_t)hi << 32) | l[g0].eal, (uint32_t)l[g0].size, tag, 0, 0);
  else if (n > g0)
    mfc_getl(s->buf[b] + ls_off, (uint64_t)hi << 32, &l[g0],
             (n - g0) * (uint32_t)sizeof(mfc_list_element_t), tag, 0, 0);
}

/* Fills buffer b with as many of the next rows as fit (rows[b] = 0 when none
 * remain). Elements are cut at 16 KiB and at 4 GiB EA boundaries; elements
 * whose EAs differ in the high word go in separate commands. */
static void stream_issue(stream* s, int b) {
  uint32_t used = 0, n = 0, g0 = 0, g_ls = 0, k = 0, hi = 0;
  s->first[b] = s->next;
  while (s->next < s->end && k < STREAM_MAX_ROWS) {
    const uint64_t ea = s->ea0 + (uint64_t)s->next * s->stride;
    uint64_t lo = floor16(ea);
    const uint64_t end = ceil16(ea + s->bytes);
    uint32_t pieces = 0;
    uint64_t t = lo;
    while (t < end) { /* count the elements this row needs */
      uint64_t m = end - t;
      const uint64_t to4g = ((t >> 32) + 1) << 32;
      if (m > DMA_MAX) m = DMA_MAX;
      if (t + m > to4g) m = to4g - t;
      t += m;
      ++pieces;
    }
    if (used + (uint32_t)(end - lo) > s->cap || n + pieces > STREAM_LIST_CAP) break;
    s->line[b][k] = used;
    while (lo < end) {
      uint64_t m = end - lo;
      const uint64_t to4g = ((lo >> 32) + 1) << 32;
      mfc_list_element_t* e = &s->list[b][n];
      if (m > DMA_MAX) m = DMA_MAX;
      if (lo + m > to4g) m = to4g - lo;
      if (n > g0 && (uint32_t)(lo >> 32) != hi) { /* new high word: new command */
        stream_flush(s, b, g0, n, hi, g_ls);
        g0 = n;
        g_ls = used;
      }
      if (n == g0) hi = (uint32_t)(lo >> 32);
      e->notify = 0;
      e->reserved = 0;
      e->size = (uint32_t)m;
      e->eal = (uint32_t)lo;
      ++n;
      used += (uint32_t)m;
      lo += m;
    }
    ++k;
    ++s->next;
  }
  stream_flush(s, b, g0, n, hi, g_ls);
  s->rows[b] = k;
  if (k == 0 && s->next < s->end) s->fail = 1;
}

/* Starts streaming rows [begin, end): issues the first tile into buffer 0. */
static void stream_start(stream* s, uint64_t ea0, uint64_t stride, uint32_t bytes,
                         uint32_t begin, uint32_t end) {
  s->ea0 = ea0;
  s->stride = stride;
  s->bytes = bytes;
  s->next = begin;
  s->end = end;
  s->rows[0] = s->rows[1] = 0;
  stream_issue(s, 0);
}

/* Row k of tile b: its floats start `*shift` floats into the returned line. */
static float* stream_row(const stream* s, int b, uint32_t k, uint32_t* shift) {
  const uint64_t ea = s->ea0 + (uint64_t)(s->first[b] + k) * s->stride;
  *shift = (uint32_t)(ea & 15u) >> 2;
  return (float*)(s->buf[b] + s->line[b][k]);
}

/* ---- arithmetic helpers -------------------------------------------------- */
static float hsum(vec_float4 v) {
  return (spu_extract(v, 0) + spu_extract(v, 1)) + (spu_extract(v, 2) + spu_extract(v, 3));
}

/* Long sums are blocked: terms go into a block accumulator that is added to
 * a running total every 16 vectors (64 floats), so each partial sum stays
 * short. An SPU rounds every add toward zero, and a plain running sum then
 * drifts in proportion to its length; blocked, the drift of 40000 terms
 * shrinks by about two orders of magnitude. */
#define SUM_BLOCK 16u
typedef struct vsum {
  vec_float4 blk, total;
  uint32_t count;
} vsum;

static void vsum_init(vsum* s) {
  s->blk = s->total = spu_splats(0.0f);
  s->count = 0;
}
/* blk += a * b */
static void vsum_madd(vsum* s, vec_float4 a, vec_float4 b) {
  s->blk = spu_madd(a, b, s->blk);
  if (++s->count == SUM_BLOCK) {
    s->total = spu_add(s->total, s->blk);
    s->blk = spu_splats(0.0f);
    s->count = 0;
  }
}
static float vsum_result(const vsum* s) { return hsum(spu_add(s->total, s->blk)); }

/* Sum over nvec vectors of w*x: 4 vector accumulators per 64-vector block,
 * blocks added to a total. */
static float dot4(const vec_float4* w, const vec_float4* x, uint32_t nvec) {
  const vec_float4 z = spu_splats(0.0f);
  vec_float4 total = z;
  uint32_t v = 0;
  while (v < nvec) {
    const uint32_t end = nvec - v > 64u ? v + 64u : nvec;
    vec_float4 a0 = z, a1 = z, a2 = z, a3 = z;
    for (; v + 4 <= end; v += 4) {
      a0 = spu_madd(w[v], x[v], a0);
      a1 = spu_madd(w[v + 1], x[v + 1], a1);
      a2 = spu_madd(w[v + 2], x[v + 2], a2);
      a3 = spu_madd(w[v + 3], x[v + 3], a3);
    }
    for (; v < end; ++v) a0 = spu_madd(w[v], x[v], a0);
    total = spu_add(total, spu_add(spu_add(a0, a1), spu_add(a2, a3)));
  }
  return hsum(total);
}

/* Zeroes a line's floats outside [s, s+n) up to its whole vectors. */
static uint32_t mask_line(float* line, uint32_t s, uint32_t n) {
  const uint32_t nvec = (s + n + 3u) >> 2;
  uint32_t i;
  for (i = 0; i < s; ++i) line[i] = 0.0f;
  for (i = s + n; i < nvec * 4u; ++i) line[i] = 0.0f;
  return nvec;
}

/* copy[0..s) = 0, copy[s..s+n) = src[0..n), zero to the next vector. */
static void shifted_copy(float* copy, const float* src, uint32_t s, uint32_t n) {
  uint32_t i;
  for (i = 0; i < s; ++i) copy[i] = 0.0f;
  memcpy(copy + s, src, n * 4u);
  for (i = s + n; i < ((s + n + 3u) & ~3u); ++i) copy[i] = 0.0f;
}

/* IEEE binary16 -> binary32 (bit layout of IEEE 754-2008). */
static float half_to_float(uint16_t h) {
  const uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  const uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
  const uint32_t m = (uint32_t)h & 0x3ffu;
  uint32_t bits;
  float f;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
    f = (float)m * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  bits = e == 0x1fu ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  memcpy(&f, &bits, 4);
  return f;
}

/* Tile bytes: the job's tunable, raised to `least` (one unit of work: the
 * lines of one row piece) and capped at SPU_MAX_TILE_BYTES. 0 when even one
 * unit does not fit. */
static uint32_t job_tile(const spu_job* j, uint32_t least) {
  uint32_t t = j->tile_bytes ? j->tile_bytes : SPU_DEFAULT_TILE_BYTES;
  if (t > SPU_MAX_TILE_BYTES) t = SPU_MAX_TILE_BYTES;
  t &= ~15u;
  if (t < least) t = least;
  return t > SPU_MAX_TILE_BYTES ? 0u : t;
}
static uint32_t job_chunk(const spu_job* j) {
  uint32_t c = j->chunk_floats ? j->chunk_floats : SPU_DEFAULT_CHUNK_FLOATS;
  c &= ~3u;
  return c < 4u ? 4u : c;
}

/* Bit mask of the float shifts (0..3) of rows 0..min(rows,4)-1 of a region
 * starting at ea with `stride` bytes between rows (a shift repeats every 4
 * rows at most). */
static uint32_t shift_mask(uint64_t ea, uint64_t stride, uint32_t rows) {
  uint32_t m = 0, r;
  for (r = 0; r < rows && r < 4u; ++r) m |= 1u << (uint32_t)(((ea + r * stride) >> 2) & 3u);
  return m;
}

/* ---- matvec (f32) --------------------------------------------------------- */
#define ACC_ROWS 1024u

static uint32_t k_matvec(const spu_job* j, arena* A) {
  const uint64_t out = j->ea[0], W = j->ea[1], x = j->ea[2];
  const int32_t rows_i = j->arg[0], cols_i = j->arg[1], ld_i = j->arg[2];
  const int32_t r0_i = j->arg[3], r1_i = j->arg[4];
  uint32_t rows, cols, ld, r0, r1, tile, mask, ncopies, pw, pw_tile, pw_x, room, s, p;
  uint32_t npanels, cur_panel = 0xffffffffu, rb0;
  int ab = 0;
  stream st;
  float* xraw;
  float* xcopy[4] = {0, 0, 0, 0};
  float* acc[2];
  if (rows_i <= 0 || cols_i <= 0 || ld_i < cols_i || r0_i < 0 || r1_i < r0_i || r1_i > rows_i ||
      (W & 3u) != 0 || (x & 3u) != 0 || (out & 3u) != 0)
    return SPU_ERR_BAD_JOB;
  rows = (uint32_t)rows_i;
  cols = (uint32_t)cols_i;
  ld = (uint32_t)ld_i;
  r0 = (uint32_t)r0_i;
  r1 = (uint32_t)r1_i;
  if (r0 == r1) return SPU_OK;
  tile = job_tile(j, lines_max(16u)); /* at least 4 floats per row piece */
  mask = shift_mask(W, (uint64_t)ld * 4u, rows);
  ncopies = mask == 1u ? 0u : (uint32_t)__builtin_popcount(mask);

  if (!stream_alloc(&st, A, tile)) return SPU_ERR_LS_BUDGET;
  acc[0] = ls_floats(A, ACC_ROWS + 4u);
  acc[1] = ls_floats(A, ACC_ROWS + 4u);
  if (A->over) return SPU_ERR_LS_BUDGET;
  /* Panel width: a row's lines must fit a tile; x (raw + one copy per shift)
   * must fit what is left. Panels after the first start on 16-byte column
   * boundaries so every row keeps its shift. */
  room = SPU_LS_DATA_BYTES - A->used;
  pw_tile = ((tile - 15u) / 4u) & ~3u; /* largest with lines_max(pw * 4) <= tile */
  pw_x = room / (ncopies + 1u) / 4u;
  pw_x = pw_x > 8u + 32u ? (pw_x - 8u - 32u) & ~3u : 0u;
  pw = pw_tile < pw_x ? pw_tile : pw_x;
  if (cols <= pw) pw = cols;
  if (pw < 4u && pw != cols) {
    A->over = 1;
    A->need = A->used + (ncopies + 1u) * 4u * (8u + 32u + 4u);
    return SPU_ERR_LS_BUDGET;
  }
  xraw = ls_floats(A, pw + 8u);
  for (s = 0; s < 4u; ++s)
    if (mask & (1u << s)) xcopy[s] = ncopies ? ls_floats(A, pw + 8u) : xraw;
  if (A->over) return SPU_ERR_LS_BUDGET;
  npanels = (cols + pw - 1u) / pw;

  for (rb0 = r0; rb0 < r1; rb0 += ACC_ROWS, ab ^= 1) {
    const uint32_t nr = r1 - rb0 < ACC_ROWS ? r1 - rb0 : ACC_ROWS;
    float* a = acc[ab];
    uint32_t i;
    wait_tags(1u << (TAG_OUT0 + ab)); /* this buffer's previous put */
    for (i = 0; i < nr; ++i) a[i] = 0.0f;
    for (p = 0; p < npanels; ++p) {
      const uint32_t c0 = p * pw, n = cols - c0 < pw ? cols - c0 : pw;
      int b;
      if (p != cur_panel) {
        fetch_floats(xraw, x + (uint64_t)c0 * 4u, n, TAG_IN);
        if (ncopies)
          for (s = 0; s < 4u; ++s)
            if (mask & (1u << s)) shifted_copy(xcopy[s], xraw, s, n);
        cur_panel = p;
      }
      stream_start(&st, W + (uint64_t)c0 * 4u, (uint64_t)ld * 4u, n * 4u, rb0, rb0 + nr);
      for (b = 0; st.rows[b] != 0; b ^= 1) {
        uint32_t k;
        stream_issue(&st, b ^ 1);
        wait_tags(1u << (TAG_TILE0 + b));
        for (k = 0; k < st.rows[b]; ++k) {
          uint32_t sh;
          float* line = stream_row(&st, b, k, &sh);
          const uint32_t nvec = mask_line(line, sh, n);
          a[st.first[b] + k - rb0] += dot4((const vec_float4*)line, (const vec_float4*)xcopy[sh], nvec);
        }
      }
    }
    if (st.fail) return SPU_ERR_LS_BUDGET;
    store_floats(a, out + (uint64_t)rb0 * 4u, nr, TAG_OUT0 + (uint32_t)ab);
  }
  wait_tags(TAG_ALL);
  return SPU_OK;
}

/* ---- matvec (q8_0) -------------------------------------------------------- */
#define Q8_BLOCK 32u
#define Q8_BYTES 34u /* f16 scale + 32 int8 */

/* Vector unpack of int8 weights: the 16 bytes at q are read as the aligned
 * quadwords around them; a shuffle copies byte 4g+k into all four bytes of
 * word k (so the word is the same read big- or little-endian), an algebraic
 * shift right by 24 sign-extends it, and spu_convtf makes it a float. The
 * patterns depend on q's offset in its quadword: q8_pat[offset][g]. */
#define Q8P(o, g, k) (unsigned char)((o) + 4 * (g) + (k))
#define Q8W(o, g, k) Q8P(o, g, k), Q8P(o, g, k), Q8P(o, g, k), Q8P(o, g, k)
#define Q8G(o, g) {Q8W(o, g, 0), Q8W(o, g, 1), Q8W(o, g, 2), Q8W(o, g, 3)}
#define Q8O(o) {Q8G(o, 0), Q8G(o, 1), Q8G(o, 2), Q8G(o, 3)}
static const vec_uchar16 q8_pat[16][4] = {Q8O(0),  Q8O(1),  Q8O(2),  Q8O(3), Q8O(4),  Q8O(5),
                                          Q8O(6),  Q8O(7),  Q8O(8),  Q8O(9), Q8O(10), Q8O(11),
                                          Q8O(12), Q8O(13), Q8O(14), Q8O(15)};

static float dot_q8(const unsigned char* blk, const vec_float4* xv, uint32_t nblk) {
  const vec_float4 z = spu_splats(0.0f);
  vec_float4 total = z, grand = z; /* total: the current 16 blocks */
  uint32_t b, g;
  for (b = 0; b < nblk; ++b, blk += Q8_BYTES, xv += 8) {
    if (b % 16u == 0) {
      grand = spu_add(grand, total);
      total = z;
    }
    const unsigned char* q = blk + 2;
    const uint32_t off = (uint32_t)((uintptr_t)q & 15u);
    const vec_uchar16* qa = (const vec_uchar16*)(const void*)(q - off);
    /* Only quadwords holding bytes of this block are read (q0 and q1 hold
     * qs[0..15], q1 and q2 qs[16..31]; q2 only when q is not aligned). */
    const vec_uchar16 q0 = qa[0], q1 = qa[1], q2 = off ? qa[2] : qa[1];
    vec_float4 s0 = z, s1 = z;
    uint16_t h;
    memcpy(&h, blk, 2);
    for (g = 0; g < 8u; g += 2) {
      const vec_uchar16 lo = g < 4u ? q0 : q1, hi = g < 4u ? q1 : q2;
      const vec_int4 i0 = spu_rlmaska((vec_int4)spu_shuffle(lo, hi, q8_pat[off][g & 3u]), -24);
      const vec_int4 i1 = spu_rlmaska((vec_int4)spu_shuffle(lo, hi, q8_pat[off][(g + 1u) & 3u]), -24);
      s0 = spu_madd(spu_convtf(i0, 0), xv[g], s0);
      s1 = spu_madd(spu_convtf(i1, 0), xv[g + 1], s1);
    }
    total = spu_madd(spu_add(s0, s1), spu_splats(half_to_float(h)), total);
  }
  return hsum(spu_add(grand, total));
}

static uint32_t k_matvec_q8(const spu_job* j, arena* A) {
  const uint64_t out = j->ea[0], W = j->ea[1], x = j->ea[2];
  const int32_t rows_i = j->arg[0], cols_i = j->arg[1], r0_i = j->arg[3], r1_i = j->arg[4];
  uint32_t cols, nb, r0, r1, tile, pb, pb_tile, pb_x, room, p, npanels, cur_panel = 0xffffffffu, rb0;
  uint64_t row_bytes;
  int ab = 0;
  stream st;
  float* xb;
  float* acc[2];
  if (rows_i <= 0 || cols_i <= 0 || r0_i < 0 || r1_i < r0_i || r1_i > rows_i || (W & 1u) != 0 ||
      (x & 3u) != 0 || (out & 3u) != 0)
    return SPU_ERR_BAD_JOB;
  cols = (uint32_t)cols_i;
  r0 = (uint32_t)r0_i;
  r1 = (uint32_t)r1_i;
  if (r0 == r1) return SPU_OK;
  nb = (cols + Q8_BLOCK - 1u) / Q8_BLOCK;
  row_bytes = (uint64_t)nb * Q8_BYTES;
  tile = job_tile(j, lines_max(Q8_BYTES)); /* at least one block per row piece */
  if (!stream_alloc(&st, A, tile)) return SPU_ERR_LS_BUDGET;
  acc[0] = ls_floats(A, ACC_ROWS + 4u);
  acc[1] = ls_floats(A, ACC_ROWS + 4u);
  if (A->over) return SPU_ERR_LS_BUDGET;
  room = SPU_LS_DATA_BYTES - A->used;
  pb_tile = (tile - 15u) / Q8_BYTES; /* largest with lines_max(pb * 34) <= tile */
  pb_x = room / 4u > 8u + 32u ? (room / 4u - 8u - 32u) / Q8_BLOCK : 0u;
  pb = pb_tile < pb_x ? pb_tile : pb_x;
  if (nb <= pb) pb = nb;
  if (pb == 0) {
    A->over = 1;
    A->need = A->used + (Q8_BLOCK + 8u + 32u) * 4u;
    return SPU_ERR_LS_BUDGET;
  }
  xb = ls_floats(A, (uint64_t)pb * Q8_BLOCK + 8u);
  if (A->over) return SPU_ERR_LS_BUDGET;
  npanels = (nb + pb - 1u) / pb;

  for (rb0 = r0; rb0 < r1; rb0 += ACC_ROWS, ab ^= 1) {
    const uint32_t nr = r1 - rb0 < ACC_ROWS ? r1 - rb0 : ACC_ROWS;
    float* a = acc[ab];
    uint32_t i;
    wait_tags(1u << (TAG_OUT0 + ab));
    for (i = 0; i < nr; ++i) a[i] = 0.0f;
    for (p = 0; p < npanels; ++p) {
      const uint32_t b0 = p * pb, nblk = nb - b0 < pb ? nb - b0 : pb;
      int b;
      if (p != cur_panel) { /* x of these blocks, zero beyond cols */
        const uint32_t c0 = b0 * Q8_BLOCK;
        const uint32_t nx = cols - c0 < nblk * Q8_BLOCK ? cols - c0 : nblk * Q8_BLOCK;
        fetch_floats(xb, x + (uint64_t)c0 * 4u, nx, TAG_IN);
        for (i = nx; i < nblk * Q8_BLOCK; ++i) xb[i] = 0.0f;
        cur_panel = p;
      }
      stream_start(&st, W + (uint64_t)b0 * Q8_BYTES, row_bytes, nblk * Q8_BYTES, rb0, rb0 + nr);
      for (b = 0; st.rows[b] != 0; b ^= 1) {
        uint32_t k;
        stream_issue(&st, b ^ 1);
        wait_tags(1u << (TAG_TILE0 + b));
        for (k = 0; k < st.rows[b]; ++k) {
          const uint64_t ea = st.ea0 + (uint64_t)(st.first[b] + k) * st.stride;
          const unsigned char* blk = st.buf[b] + st.line[b][k] + (uint32_t)(ea & 15u);
          a[st.first[b] + k - rb0] += dot_q8(blk, (const vec_float4*)xb, nblk);
        }
      }
    }
    if (st.fail) return SPU_ERR_LS_BUDGET;
    store_floats(a, out + (uint64_t)rb0 * 4u, nr, TAG_OUT0 + (uint32_t)ab);
  }
  wait_tags(TAG_ALL);
  return SPU_OK;
}

/* ---- rmsnorm --------------------------------------------------------------- */
static uint32_t k_rmsnorm(const spu_job* j, arena* A) {
  const uint64_t out = j->ea[0], x = j->ea[1], w = j->ea[2];
  const int32_t n_i = j->arg[0];
  uint32_t n, chunk, i0, v;
  float ss;
  float* xb;
  float* wb;
  vsum acc;
  vsum_init(&acc);
  if (n_i <= 0 || ((out | x | w) & 3u) != 0) return SPU_ERR_BAD_JOB;
  n = (uint32_t)n_i;
  chunk = job_chunk(j);
  xb = ls_floats(A, chunk + 8u);
  wb = ls_floats(A, chunk + 8u);
  if (A->over) return SPU_ERR_LS_BUDGET;
  for (i0 = 0; i0 < n; i0 += chunk) { /* sum of squares */
    const uint32_t m = n - i0 < chunk ? n - i0 : chunk;
    fetch_floats(xb, x + (uint64_t)i0 * 4u, m, TAG_IN);
    for (v = 0; v < (m + 3u) / 4u; ++v) {
      const vec_float4 xv = ((const vec_float4*)xb)[v];
      vsum_madd(&acc, xv, xv);
    }
  }
  ss = vsum_result(&acc);
  ss /= (float)n;
  ss += 1e-5f;
  ss = 1.0f / sqrtf(ss);
  for (i0 = 0; i0 < n; i0 += chunk) {
    const uint32_t m = n - i0 < chunk ? n - i0 : chunk;
    const vec_float4 ssv = spu_splats(ss);
    uint32_t offx = 0, offw;
    if (n > chunk) offx = issue_floats(xb, x + (uint64_t)i0 * 4u, m, TAG_IN);
    offw = issue_floats(wb, w + (uint64_t)i0 * 4u, m, TAG_IN2);
    wait_tags((1u << TAG_IN) | (1u << TAG_IN2));
    if (n > chunk) settle_floats(xb, offx, m);
    settle_floats(wb, offw, m);
    for (v = 0; v < (m + 3u) / 4u; ++v)
      ((vec_float4*)xb)[v] = spu_mul(((vec_float4*)wb)[v], spu_mul(ssv, ((vec_float4*)xb)[v]));
    store_floats(xb, out + (uint64_t)i0 * 4u, m, TAG_OUT0);
    wait_tags(1u << TAG_OUT0);
  }
  return SPU_OK;
}

/* ---- softmax ------------------------------------------------------------- */
/* Adds a[0..n) (16-byte aligned, zero up to the next multiple of 4) to s. */
static void vsum_floats(vsum* s, const float* a, uint32_t n) {
  const vec_float4* v = (const vec_float4*)a;
  const vec_float4 one = spu_splats(1.0f);
  uint32_t i;
  for (i = 0; i < (n + 3u) >> 2; ++i) vsum_madd(s, v[i], one);
}

/* exp(a[i] - mx) in place over a[0..n); zero up to the next multiple of 4. */
static void exp_shifted(float* a, uint32_t n, float mx) {
  uint32_t i;
  for (i = 0; i < n; ++i) a[i] = expf(a[i] - mx);
  for (; i < ((n + 3u) & ~3u); ++i) a[i] = 0.0f;
}

/* In place over LS data (capacity n + 4): run.c's steps (max, exp, sum,
 * divide) with the sum blocked (vsum). */
static void softmax_ls(float* a, uint32_t n) {
  float mx = a[0], sum;
  vsum total;
  uint32_t i;
  vsum_init(&total);
  for (i = 1; i < n; ++i)
    if (a[i] > mx) mx = a[i];
  exp_shifted(a, n, mx);
  vsum_floats(&total, a, n);
  sum = vsum_result(&total);
  for (i = 0; i < n; ++i) a[i] /= sum;
}

static uint32_t k_softmax(const spu_job* j, arena* A) {
  const uint64_t x = j->ea[0];
  const int32_t n_i = j->arg[0];
  uint32_t n, chunk, i0, i, pass;
  float mx = 0.0f, sum = 0.0f;
  vsum total; /* blocked as in softmax_ls, so results do not depend on the chunk size */
  float* b;
  vsum_init(&total);
  if (n_i <= 0 || (x & 3u) != 0) return SPU_ERR_BAD_JOB;
  n = (uint32_t)n_i;
  chunk = job_chunk(j);
  b = ls_floats(A, (n < chunk ? n : chunk) + 8u);
  if (A->over) return SPU_ERR_LS_BUDGET;
  if (n <= chunk) { /* resident */
    fetch_floats(b, x, n, TAG_IN);
    softmax_ls(b, n);
    store_floats(b, x, n, TAG_OUT0);
    wait_tags(1u << TAG_OUT0);
    return SPU_OK;
  }
  /* streamed: pass 0 max, pass 1 exp (put back) and sum, pass 2 divide */
  for (pass = 0; pass < 3u; ++pass) {
    for (i0 = 0; i0 < n; i0 += chunk) {
      const uint32_t m = n - i0 < chunk ? n - i0 : chunk;
      fetch_floats(b, x + (uint64_t)i0 * 4u, m, TAG_IN);
      if (pass == 0) {
        if (i0 == 0) mx = b[0];
        for (i = 0; i < m; ++i)
          if (b[i] > mx) mx = b[i];
        continue;
      }
      if (pass == 1) {
        exp_shifted(b, m, mx);
        vsum_floats(&total, b, m);
        if (i0 + m >= n) sum = vsum_result(&total);
      } else {
        for (i = 0; i < m; ++i) b[i] /= sum;
      }
      store_floats(b, x + (uint64_t)i0 * 4u, m, TAG_OUT0);
      wait_tags(1u << TAG_OUT0);
    }
  }
  return SPU_OK;
}

/* ---- rope ------------------------------------------------------------------ */
static uint32_t k_rope(const spu_job* j, arena* A) {
  const uint64_t q = j->ea[0], k = j->ea[1];
  const int32_t nq_i = j->arg[0], nk_i = j->arg[1], pos = j->arg[2], hs_i = j->arg[3];
  uint32_t nq, nk, n, hs, chunk, i0, i;
  float* qb;
  float* kb;
  if (nq_i < 0 || nk_i < 0 || hs_i <= 0 || ((nq_i | nk_i | hs_i) & 1) != 0 || ((q | k) & 3u) != 0)
    return SPU_ERR_BAD_JOB;
  nq = (uint32_t)nq_i;
  nk = (uint32_t)nk_i;
  hs = (uint32_t)hs_i;
  n = nq > nk ? nq : nk;
  chunk = job_chunk(j);
  qb = ls_floats(A, chunk + 8u);
  kb = ls_floats(A, chunk + 8u);
  if (A->over) return SPU_ERR_LS_BUDGET;
  for (i0 = 0; i0 < n; i0 += chunk) {
    const uint32_t m = n - i0 < chunk ? n - i0 : chunk;
    const uint32_t mq = nq > i0 ? (nq - i0 < m ? nq - i0 : m) : 0u;
    const uint32_t mk = nk > i0 ? (nk - i0 < m ? nk - i0 : m) : 0u;
    uint32_t oq = 0, ok = 0;
    if (mq) oq = issue_floats(qb, q + (uint64_t)i0 * 4u, mq, TAG_IN);
    if (mk) ok = issue_floats(kb, k + (uint64_t)i0 * 4u, mk, TAG_IN2);
    wait_tags((1u << TAG_IN) | (1u << TAG_IN2));
    if (mq) settle_floats(qb, oq, mq);
    if (mk) settle_floats(kb, ok, mk);
    for (i = 0; i < m; i += 2) { /* llama2.c run.c's formula, term for term */
      const uint32_t head_dim = (i0 + i) % hs;
      const float freq = 1.0f / powf(10000.0f, (float)head_dim / (float)hs);
      const float val = (float)pos * freq;
      const float fcr = cosf(val), fci = sinf(val);
      if (i < mq) {
        const float v0 = qb[i], v1 = qb[i + 1];
        qb[i] = v0 * fcr - v1 * fci;
        qb[i + 1] = v0 * fci + v1 * fcr;
      }
      if (i < mk) {
        const float v0 = kb[i], v1 = kb[i + 1];
        kb[i] = v0 * fcr - v1 * fci;
        kb[i + 1] = v0 * fci + v1 * fcr;
      }
    }
    if (mq) store_floats(qb, q + (uint64_t)i0 * 4u, mq, TAG_OUT0);
    if (mk) store_floats(kb, k + (uint64_t)i0 * 4u, mk, TAG_OUT0 + 1u);
    wait_tags((1u << TAG_OUT0) | (1u << (TAG_OUT0 + 1u)));
  }
  return SPU_OK;
}

/* ---- swiglu ---------------------------------------------------------------- */
static uint32_t k_swiglu(const spu_job* j, arena* A) {
  const uint64_t hb = j->ea[0], hb2 = j->ea[1];
  const int32_t n_i = j->arg[0];
  uint32_t n, chunk, i0, i;
  float* a;
  float* b;
  if (n_i <= 0 || ((hb | hb2) & 3u) != 0) return SPU_ERR_BAD_JOB;
  n = (uint32_t)n_i;
  chunk = job_chunk(j);
  a = ls_floats(A, chunk + 8u);
  b = ls_floats(A, chunk + 8u);
  if (A->over) return SPU_ERR_LS_BUDGET;
  for (i0 = 0; i0 < n; i0 += chunk) {
    const uint32_t m = n - i0 < chunk ? n - i0 : chunk;
    const uint32_t oa = issue_floats(a, hb + (uint64_t)i0 * 4u, m, TAG_IN);
    const uint32_t ob = issue_floats(b, hb2 + (uint64_t)i0 * 4u, m, TAG_IN2);
    wait_tags((1u << TAG_IN) | (1u << TAG_IN2));
    settle_floats(a, oa, m);
    settle_floats(b, ob, m);
    for (i = 0; i < m; ++i) { /* silu(v) * hb2, run.c's order */
      float val = a[i];
      val *= (1.0f / (1.0f + expf(-val)));
      val *= b[i];
      a[i] = val;
    }
    store_floats(a, hb + (uint64_t)i0 * 4u, m, TAG_OUT0);
    wait_tags(1u << TAG_OUT0);
  }
  return SPU_OK;
}

/* ---- attention --------------------------------------------------------------- */
static uint32_t k_attention(const spu_job* j, arena* A) {
  const uint64_t out = j->ea[0], q = j->ea[1], kc = j->ea[2], vc = j->ea[3], att = j->ea[4];
  const int32_t nh_i = j->arg[0], kv_mul_i = j->arg[1], hs_i = j->arg[2], stride_i = j->arg[3];
  const int32_t pos_i = j->arg[4], h0_i = j->arg[5], h1_i = j->arg[6];
  uint32_t hs, kv_mul, kv_stride, T, h, s, tile;
  float scale;
  stream st;
  float *qraw, *scores, *outb;
  float* qcopy[4];
  float* acc[4]; /* per shift: sum over the current block of 64 positions */
  float* tot[4]; /* per shift: sum of finished blocks */
  if (nh_i <= 0 || kv_mul_i <= 0 || hs_i <= 0 || stride_i < hs_i || pos_i < 0 || h0_i < 0 ||
      h1_i < h0_i || h1_i > nh_i || ((out | q | kc | vc | att) & 3u) != 0)
    return SPU_ERR_BAD_JOB;
  hs = (uint32_t)hs_i;
  kv_mul = (uint32_t)kv_mul_i;
  kv_stride = (uint32_t)stride_i;
  T = (uint32_t)pos_i + 1u;
  if (h0_i == h1_i) return SPU_OK;
  tile = hs > (SPU_MAX_TILE_BYTES - 30u) / 4u ? 0u : job_tile(j, lines_max(hs * 4u));
  if (tile == 0) { /* one K/V row must fit a tile */
    A->over = 1;
    A->need = A->used + 2u * lines_max(hs * 4u);
    return SPU_ERR_LS_BUDGET;
  }
  if (!stream_alloc(&st, A, tile)) return SPU_ERR_LS_BUDGET;
  qraw = ls_floats(A, hs + 8u);
  outb = ls_floats(A, hs + 8u);
  for (s = 0; s < 4u; ++s) {
    qcopy[s] = ls_floats(A, hs + 8u);
    acc[s] = ls_floats(A, hs + 8u);
    tot[s] = ls_floats(A, hs + 8u);
  }
  scores = ls_floats(A, (uint64_t)T + 8u); /* the longest context that fits: ~30k */
  if (A->over) return SPU_ERR_LS_BUDGET;
  scale = sqrtf((float)hs);

  for (h = (uint32_t)h0_i; h < (uint32_t)h1_i; ++h) {
    const uint32_t kvo = (h / kv_mul) * hs;
    const uint64_t k0 = kc + (uint64_t)kvo * 4u, v0 = vc + (uint64_t)kvo * 4u;
    const uint64_t stride = (uint64_t)kv_stride * 4u;
    const uint32_t kmask = shift_mask(k0, stride, T), vmask = shift_mask(v0, stride, T);
    uint32_t i;
    int b;
    fetch_floats(qraw, q + (uint64_t)h * hs * 4u, hs, TAG_IN);
    for (s = 0; s < 4u; ++s)
      if (kmask & (1u << s)) shifted_copy(qcopy[s], qraw, s, hs);
    /* scores: q . k_t / sqrt(head_size) */
    stream_start(&st, k0, stride, hs * 4u, 0, T);
    for (b = 0; st.rows[b] != 0; b ^= 1) {
      uint32_t k;
      stream_issue(&st, b ^ 1);
      wait_tags(1u << (TAG_TILE0 + b));
      for (k = 0; k < st.rows[b]; ++k) {
        uint32_t sh;
        float* line = stream_row(&st, b, k, &sh);
        const uint32_t nvec = mask_line(line, sh, hs);
        const float score = dot4((const vec_float4*)line, (const vec_float4*)qcopy[sh], nvec);
        scores[st.first[b] + k] = score / scale;
      }
    }
    if (st.fail) return SPU_ERR_LS_BUDGET;
    softmax_ls(scores, T);
    /* out_h = sum_t a_t v_t, accumulated in t order per lane, in blocks of
     * 64 positions (see vsum) */
    for (s = 0; s < 4u; ++s)
      if (vmask & (1u << s))
        for (i = 0; i < ((s + hs + 3u) & ~3u); ++i) acc[s][i] = tot[s][i] = 0.0f;
    stream_start(&st, v0, stride, hs * 4u, 0, T);
    for (b = 0; st.rows[b] != 0; b ^= 1) {
      uint32_t k;
      stream_issue(&st, b ^ 1);
      wait_tags(1u << (TAG_TILE0 + b));
      for (k = 0; k < st.rows[b]; ++k) {
        uint32_t sh, v;
        float* line = stream_row(&st, b, k, &sh);
        const uint32_t nvec = mask_line(line, sh, hs);
        const uint32_t t = st.first[b] + k;
        const vec_float4 a = spu_splats(scores[t]);
        vec_float4* av = (vec_float4*)acc[sh];
        for (v = 0; v < nvec; ++v) av[v] = spu_madd(a, ((const vec_float4*)line)[v], av[v]);
        if ((t + 1u) % 64u == 0 || t + 1u == T) /* end of a block: into the totals */
          for (s = 0; s < 4u; ++s)
            if (vmask & (1u << s))
              for (v = 0; v < (s + hs + 3u) >> 2; ++v) {
                ((vec_float4*)tot[s])[v] = spu_add(((vec_float4*)tot[s])[v], ((vec_float4*)acc[s])[v]);
                ((vec_float4*)acc[s])[v] = spu_splats(0.0f);
              }
      }
    }
    if (st.fail) return SPU_ERR_LS_BUDGET;
    for (i = 0; i < hs; ++i) {
      float sum = 0.0f;
      int first = 1;
      for (s = 0; s < 4u; ++s)
        if (vmask & (1u << s)) {
          sum = first ? tot[s][s + i] : sum + tot[s][s + i];
          first = 0;
        }
      outb[i] = sum;
    }
    store_floats(outb, out + (uint64_t)h * hs * 4u, hs, TAG_OUT0);
    store_floats(scores, att + (uint64_t)h * T * 4u, T, TAG_OUT0 + 1u);
    wait_tags((1u << TAG_OUT0) | (1u << (TAG_OUT0 + 1u)));
  }
  return SPU_OK;
}

/* ---- entry ------------------------------------------------------------------ */
uint32_t spu_run_job(uint64_t job_ea) {
  arena A;
  spu_job* j;
  uint32_t st;
  A.base = LS_DATA();
  A.used = A.high = A.need = 0;
  A.over = 0;
  j = (spu_job*)ls_alloc(&A, SPU_JOB_BYTES);
  mfc_get(j, job_ea, SPU_JOB_BYTES, TAG_JOB, 0, 0);
  wait_tags(1u << TAG_JOB);
  switch (j->op) {
    case SPU_OP_MATVEC: st = k_matvec(j, &A); break;
    case SPU_OP_MATVEC_Q8: st = k_matvec_q8(j, &A); break;
    case SPU_OP_RMSNORM: st = k_rmsnorm(j, &A); break;
    case SPU_OP_ROPE: st = k_rope(j, &A); break;
    case SPU_OP_SOFTMAX: st = k_softmax(j, &A); break;
    case SPU_OP_ATTENTION: st = k_attention(j, &A); break;
    case SPU_OP_SWIGLU: st = k_swiglu(j, &A); break;
    default: st = SPU_ERR_BAD_JOB; break;
  }
  wait_tags(TAG_ALL);
  j->status = st;
  j->detail = st == SPU_ERR_LS_BUDGET ? A.need : 0u;
  j->ls_high_water = A.high;
  put_exact((unsigned char*)j + SPU_JOB_STATUS_OFFSET, job_ea + SPU_JOB_STATUS_OFFSET, 16u, TAG_JOB);
  wait_tags(1u << TAG_JOB);
  return st;
}

#ifndef SPU_HOST_EMULATION
/* On a Cell: argp is the EA of the first job; after each job the status goes
 * to the outbound mailbox and the next job's EA arrives as two inbound
 * mailbox words (high, low); EA 0 ends the program. Not run here: no Cell. */
int main(unsigned long long speid, unsigned long long argp, unsigned long long envp) {
  uint64_t ea = argp;
  (void)speid;
  (void)envp;
  while (ea != 0) {
    const uint32_t st = spu_run_job(ea);
    uint32_t hi, lo;
    spu_write_out_mbox(st);
    hi = spu_read_in_mbox();
    lo = spu_read_in_mbox();
    ea = ((uint64_t)hi << 32) | lo;
  }
  return 0;
}
#endif
