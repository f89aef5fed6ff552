#include "actors/messages.hpp"

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

std::vector<char> encode_impl(const std::vector<float>& data, bool swap) {
  const uint32_t n = static_cast<uint32_t>(data.size());
  std::vector<char> out(1 + 4 + 8 + static_cast<size_t>(n) * 4);
  out[0] = static_cast<char>(host_big_endian() != swap ? 1 : 0);
  std::memcpy(out.data() + 13, data.data(), static_cast<size_t>(n) * 4);
  uint32_t nn = n;
  if (swap) {
    nn = __builtin_bswap32(nn);
    uint32_t* w = reinterpret_cast<uint32_t*>(out.data() + 13);
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, out.data() + 13 + 4 * i, 4);
      v = __builtin_bswap32(v);
      std::memcpy(out.data() + 13 + 4 * i, &v, 4);
    }
    (void)w;
  }
  uint64_t h = XXH64(out.data() + 13, static_cast<size_t>(n) * 4, 0);
  if (swap) h = __builtin_bswap64(h);
  std::memcpy(out.data() + 1, &nn, 4);
  std::memcpy(out.data() + 5, &h, 8);
  return out;
}
}  // namespace

std::vector<char> blob::encode() const { return encode_impl(data, false); }
std::vector<char> blob::encode_swapped() const { return encode_impl(data, true); }

blob blob::decode(const std::vector<char>& bytes) {
  blob b;
  if (bytes.size() < 13) {
    b.status = 2;
    return b;
  }
  const bool sender_big = bytes[0] != 0;
  const bool swap = sender_big != host_big_endian();
  uint32_t n;
  uint64_t h;
  std::memcpy(&n, bytes.data() + 1, 4);
  std::memcpy(&h, bytes.data() + 5, 8);
  if (swap) {
    n = __builtin_bswap32(n);
    h = __builtin_bswap64(h);
  }
  if (bytes.size() != 13 + static_cast<size_t>(n) * 4) {
    b.status = 2;
    return b;
  }
  // The checksum covers the payload as sent, before any conversion.
  if (XXH64(bytes.data() + 13, static_cast<size_t>(n) * 4, 0) != h) {
    b.status = 1;
    return b;
  }
  b.data.resize(n);
  std::memcpy(b.data.data(), bytes.data() + 13, static_cast<size_t>(n) * 4);
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
  shard_step s;
  s.op = static_cast<shard_op>(w.op);
  s.layers = range{w.layer_begin, w.layer_end};
  s.part = static_cast<layer_part>(w.part);
  s.partial = w.partial;
  s.algorithm = static_cast<reduce_algorithm>(w.algorithm);
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
