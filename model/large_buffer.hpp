#pragma once
// Large byte buffers that fill fast on a host where page faults are dear.
//
// A daemon builds a shard's weights from a slice (model/manifest.hpp): the
// slice's bytes are read (from --models, --cache or the front end) into one
// buffer, verified, then copied into the sparse model image. Measured on the
// project's 2-vCPU VM (docs/distributed.md, "How weights reach nodes"): with
// 4 KiB pages almost all of that time was the kernel's page-fault path, not
// the copies (perf: ~25 % of a daemon's CPU in exc_page_fault under memmove
// and memset, for a 104.5 MiB slice of a stories110m-shaped model). Transparent
// huge pages (2 MiB, `madvise` mode on Debian's kernels) take 512 times fewer
// faults.
//
// Thread safety: stateless functions. Errors: none reported; where the kernel
// refuses the advice (THP disabled, an old kernel) the memory behaves as
// before, only slower.
#include <cstdint>
#include <vector>

namespace cellshard::model {

/// Asks for transparent huge pages on the 2 MiB-aligned part of
/// [p, p + n): rounded inwards, so no page outside the range is affected and
/// nothing happens for a range shorter than an aligned 2 MiB. Call it before
/// the memory is first touched (pages already faulted in stay small).
void advise_huge_pages(void* p, uint64_t n);

/// A zero-filled buffer of n bytes whose pages are advised as huge before
/// the zero fill touches them. Same contents as std::vector<uint8_t>(n).
std::vector<uint8_t> large_buffer(uint64_t n);

}  // namespace cellshard::model
