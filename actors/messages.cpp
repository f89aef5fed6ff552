#include "actors/messages.hpp"

#include "kernels/backend.hpp"

#include <algorithm>
#include <cstring>
#include <xxhash.h>

namespace cellshard::actors {

namespace {
bool host_big_endian() {
  const uint16_t one = 1;
  uint8_t b;
  std::memcpy(&b, &one, 1);
  return b == 0;
}

uint32_t bswap_if(uint32_t v, bool swap) { return swap ? __builtin_bswap32(v) : v; }

std::vector<char> encode_impl(const blob& b, bool swap) {
  const std::vector<float>& data = b.data;
  const uint32_t n = static_cast<uint32_t>(data.size());
  const size_t payload = b.q8 ? q8_payload_bytes(n) : static_cast<size_t>(n) * 4;
  std::vector<char> out(1 + 4 + 8 + payload);
  out[0] = static_cast<char>((host_big_endian() != swap ? 1 : 0) | (b.q8 ? 2 : 0));
  if (b.q8) {
    q8_pack(data.data(), n, out.data() + 13, swap);
  } else {
    if (n > 0) std::memcpy(out.data() + 13, data.data(), static_cast<size_t>(n) * 4);  // data() may be null
    if (swap) {
      for (uint32_t i = 0; i < n; ++i) {
        uint32_t v;
        std::memcpy(&v, out.data() + 13 + 4 * i, 4);
        v = __builtin_bswap32(v);
        std::memcpy(out.data() + 13 + 4 * i, &v, 4);
      }
    }
  }
  const uint32_t nn = bswap_if(n, swap);
  uint64_t h = XXH64(out.data() + 13, payload, 0);
  if (swap) h = __builtin_bswap64(h);
  std::memcpy(out.data() + 1, &nn, 4);
  std::memcpy(out.data() + 5, &h, 8);
  return out;
}
}  // namespace

size_t q8_payload_bytes(size_t n) {
  return (n + kernels::q8_block_size - 1) / kernels::q8_block_size * sizeof(kernels::q8_block);
}

void q8_pack(const float* x, size_t n, char* out, bool swap) {
  kernels::q8_block b;
  for (size_t at = 0; at < n; at += kernels::q8_block_size, out += sizeof b) {
    const int cols = static_cast<int>(std::min<size_t>(kernels::q8_block_size, n - at));
    kernels::quantize_row_q8(x + at, &b, cols);
    if (swap) b.d = static_cast<uint16_t>((b.d >> 8) | (b.d << 8));
    std::memcpy(out, &b, sizeof b);
  }
}

void q8_unpack(const char* in, size_t n, float* out, bool swap) {
  kernels::q8_block b;
  for (size_t at = 0; at < n; at += kernels::q8_block_size, in += sizeof b) {
    const int cols = static_cast<int>(std::min<size_t>(kernels::q8_block_size, n - at));
    std::memcpy(&b, in, sizeof b);
    if (swap) b.d = static_cast<uint16_t>((b.d >> 8) | (b.d << 8));
    kernels::dequantize_row_q8(&b, out + at, cols);
  }
}

std::vector<char> blob::encode() const { return encode_impl(*this, false); }
std::vector<char> blob::encode_swapped() const { return encode_impl(*this, true); }

blob blob::decode(const std::vector<char>& bytes) {
  blob b;
  if (bytes.size() < 13 || (static_cast<uint8_t>(bytes[0]) & ~3u) != 0) {
    b.status = 2;
    return b;
  }
  const bool sender_big = (bytes[0] & 1) != 0;
  const bool q8 = (bytes[0] & 2) != 0;
  const bool swap = sender_big != host_big_endian();
  uint32_t n;
  uint64_t h;
  std::memcpy(&n, bytes.data() + 1, 4);
  std::memcpy(&h, bytes.data() + 5, 8);
  if (swap) {
    n = __builtin_bswap32(n);
    h = __builtin_bswap64(h);
  }
  const size_t payload = q8 ? q8_payload_bytes(n) : static_cast<size_t>(n) * 4;
  if (bytes.size() != 13 + payload) {
    b.status = 2;
    return b;
  }
  // The checksum covers the payload as sent, before any conversion.
  if (XXH64(bytes.data() + 13, payload, 0) != h) {
    b.status = 1;
    return b;
  }
  b.data.resize(n);
  b.q8 = q8;
  if (q8) {
    q8_unpack(bytes.data() + 13, n, b.data.data(), swap);
    return b;
  }
  // An empty blob has no storage: data() may be null, which memcpy must not get.
  if (n > 0) std::memcpy(b.data.data(), bytes.data() + 13, static_cast<size_t>(n) * 4);
  if (swap) {
    for (auto& f : b.data) {
      uint32_t v;
      std::memcpy(&v, &f, 4);
      v = __builtin_bswap32(v);
      std::memcpy(&f, &v, 4);
    }
  }
  return b;
}

program_op to_wire(const topologies::shard_step& s) {
  program_op w;
  w.op = static_cast<int32_t>(s.op);
  w.layer_begin = s.layers.begin;
  w.layer_end = s.layers.end;
  w.part = static_cast<int32_t>(s.part);
  w.partial = s.partial;
  w.algorithm = static_cast<int32_t>(s.algorithm);
  w.sync = static_cast<int32_t>(s.sync);
  w.peers.assign(s.peers.begin(), s.peers.end());
  w.vocab_begin = s.vocab.begin;
  w.vocab_end = s.vocab.end;
  for (const auto& h : s.holders) {
    w.holders_len.push_back(static_cast<int32_t>(h.size()));
    w.holders.insert(w.holders.end(), h.begin(), h.end());
  }
  w.experts.assign(s.experts.begin(), s.experts.end());
  return w;
}

result<topologies::shard_step> from_wire(const program_op& w) {
  using namespace topologies;
  if (w.op < 0 || w.op >= static_cast<int32_t>(shard_op::count))
    return make_error("program op " + std::to_string(w.op) + " unknown to this build (0.." +
                      std::to_string(static_cast<int>(shard_op::count) - 1) + ")");
  if (w.part < 0 || w.part > static_cast<int32_t>(layer_part::ffn))
    return make_error("layer part " + std::to_string(w.part) + " unknown to this build");
  if (w.algorithm < 0 || w.algorithm >= static_cast<int32_t>(reduce_algorithm::count))
    return make_error("reduce algorithm " + std::to_string(w.algorithm) + " unknown to this build");
  if (w.sync < 0 || w.sync >= static_cast<int32_t>(sync_format::count))
    return make_error("sync format " + std::to_string(w.sync) + " unknown to this build");
  shard_step s;
  s.op = static_cast<shard_op>(w.op);
  s.layers = range{w.layer_begin, w.layer_end};
  s.part = static_cast<layer_part>(w.part);
  s.partial = w.partial;
  s.algorithm = static_cast<reduce_algorithm>(w.algorithm);
  s.sync = static_cast<sync_format>(w.sync);
  s.peers.assign(w.peers.begin(), w.peers.end());
  s.vocab = range{w.vocab_begin, w.vocab_end};
  size_t at = 0;
  for (int32_t n : w.holders_len) {
    if (n < 0 || at + static_cast<size_t>(n) > w.holders.size())
      return make_error("program op " + to_string(s.op) + ": holder lists longer than the holders sent");
    s.holders.emplace_back(w.holders.begin() + static_cast<std::ptrdiff_t>(at),
                           w.holders.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += static_cast<size_t>(n);
  }
  if (at != w.holders.size()) return make_error("program op " + to_string(s.op) + ": holders left over");
  s.experts.assign(w.experts.begin(), w.experts.end());
  return s;
}

void register_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<blob>("cs_blob");
  cfg.add_message_type<step_id>("cs_step_id");
  cfg.add_message_type<forward_req>("cs_forward_req");
  cfg.add_message_type<activation>("cs_activation");
  cfg.add_message_type<partial_sum>("cs_partial_sum");
  cfg.add_message_type<logits_msg>("cs_logits");
  cfg.add_message_type<shard_error>("cs_shard_error");
  cfg.add_message_type<program_op>("cs_program_op");
  cfg.add_message_type<wiring>("cs_wiring");
  cfg.add_message_type<shard_stats>("cs_shard_stats");
  cfg.add_message_type<kv_delta>("cs_kv_delta");
  cfg.add_message_type<restore_req>("cs_restore_req");
  cfg.add_message_type<fault_report>("cs_fault_report");
  cfg.add_message_type<shard_restarted>("cs_shard_restarted");
  cfg.add_message_type<cluster_failed>("cs_cluster_failed");
  cfg.add_message_type<probe_msg>("cs_probe_msg");
  cfg.add_message_type<probe_result>("cs_probe_result");
  cfg.add_message_type<expert_req>("cs_expert_req");
  cfg.add_message_type<expert_out>("cs_expert_out");
  // node daemons (issue #5)
  cfg.add_message_type<cluster_fingerprint>("cs_fingerprint");
  cfg.add_message_type<node_join>("cs_node_join");
  cfg.add_message_type<node_joined>("cs_node_joined");
  cfg.add_message_type<node_peers>("cs_node_peers");
  cfg.add_message_type<node_peers_done>("cs_node_peers_done");
  cfg.add_message_type<shard_spawn>("cs_shard_spawn");
  cfg.add_message_type<shard_spawned>("cs_shard_spawned");
  cfg.add_message_type<slice_fetch>("cs_slice_fetch");
  cfg.add_message_type<slice_chunk>("cs_slice_chunk");
  cfg.add_message_type<slice_ack>("cs_slice_ack");
  cfg.add_message_type<slice_room_ask>("cs_slice_room_ask");
  cfg.add_message_type<slice_room>("cs_slice_room");
  cfg.add_message_type<node_report>("cs_node_report");
  cfg.add_message_type<heartbeat_start>("cs_hb_start");
  cfg.add_message_type<heartbeat_started>("cs_hb_started");
}

}  // namespace cellshard::actors
