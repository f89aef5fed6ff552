#include "actors/weight_server.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <xxhash.h>

namespace cellshard::actors {

namespace {

using clk = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
}

}  // namespace

weight_store::weight_store(const model::model_file& file, std::string name) : file_(file), name_(std::move(name)) {}

uint64_t weight_store::file_bytes() const { return file_.file_bytes(); }

void weight_store::touch() { last_ = now_ns(); }

result<model::manifest> weight_store::manifest_for(const model::slice_spec& spec) {
  const std::string k = spec.to_string();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_spec_.find(k);
    if (it != by_spec_.end()) return it->second;
  }
  auto m = model::make_manifest(file_, spec, name_);
  if (!m) return m;
  std::lock_guard<std::mutex> lock(mu_);
  by_spec_[k] = *m;
  by_key_[m->digest()] = *m;
  return m;
}

slice_chunk weight_store::read(const slice_fetch& f) {
  slice_chunk out;
  out.offset = f.offset;
  constexpr uint64_t max_chunk = 4u << 20;
  const model::manifest* m = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_key_.find(f.key);
    if (it != by_key_.end()) m = &it->second;  // entries are never erased: the pointer stays valid
  }
  if (!m) {
    out.error = "the front end has no slice " + model::format_digest(f.key) + " of " + name_;
    return out;
  }
  if (f.length > max_chunk) {
    out.error = "chunk of " + std::to_string(f.length) + " bytes asked, at most " + std::to_string(max_chunk);
    return out;
  }
  if (!file_.file_image()) {  // make_manifest refuses such a model first: unreachable
    out.error = "the front end's " + name_ + " is a converted slice image";
    return out;
  }
  out.bytes.resize(f.length);
  // The file's own bytes (a big-endian front end's image is converted).
  auto r = model::copy_slice_bytes(*m, file_.file_image(), f.offset, f.length,
                                   reinterpret_cast<uint8_t*>(out.bytes.data()));
  if (!r) {
    out.error = r.message();
    out.bytes.clear();
    return out;
  }
  out.digest = XXH3_64bits(out.bytes.data(), out.bytes.size());
  for (int c = corrupt_.load(); c > 0;)
    if (corrupt_.compare_exchange_weak(c, c - 1)) {
      out.digest ^= 1;
      break;
    }
  served_ += f.length;
  touch();
  return out;
}

slice_shipment::slice_shipment(std::shared_ptr<weight_store> store, uint64_t key, uint64_t total, int window,
                               int max_tries)
    : store_(std::move(store)), key_(key), total_(total), window_(std::max(1, window)),
      max_tries_(std::max(1, max_tries)) {}

std::vector<std::pair<slice_fetch, slice_chunk>> slice_shipment::next() {
  std::vector<std::pair<slice_fetch, slice_chunk>> out;
  while (!give_up_ && in_flight_ < window_) {
    uint64_t off = 0;
    if (!again_.empty()) {
      off = again_.front();
      again_.pop_front();
    } else if (next_ < total_) {
      off = next_;
      next_ += slice_chunk_bytes;
    } else {
      break;
    }
    const slice_fetch h{key_, off, std::min<uint64_t>(slice_chunk_bytes, total_ - off)};
    ++tries_[off];
    ++in_flight_;
    out.emplace_back(h, store_->read(h));
  }
  return out;
}

bool slice_shipment::ack(const slice_ack& a) {
  if (a.key != key_ || tries_.count(a.offset) == 0) return false;
  store_->touch();
  if (in_flight_ > 0) --in_flight_;
  if (a.status == 1) {
    if (tries_[a.offset] >= max_tries_) give_up_ = true;
    else again_.push_back(a.offset);
  } else if (a.status != 0) {
    give_up_ = true;
  }
  return true;
}

bool slice_shipment::done() const {
  return in_flight_ == 0 && (give_up_ || (again_.empty() && next_ >= total_));
}

caf::actor spawn_weight_server(caf::actor_system& sys, std::shared_ptr<weight_store> store) {
  return sys.spawn<caf::hidden>([store](caf::event_based_actor*) -> caf::behavior {
    return {
        [store](slice_fetch& f) -> slice_chunk { return store->read(f); },
    };
  });
}

}  // namespace cellshard::actors
