// supervision/replay_log.hpp: what a sender sent to one receiver on one
// stream since the receiver's last acknowledged checkpoint, so it can be sent
// again to a restarted receiver. CAF-free, header-only (templated payload).
//
// Positions: an entry covers [begin, end) (one decode step: [p, p+1); a
// prefill batch: its whole range). Entries are contiguous: each must begin
// where the previous one ended (a missing position would make the replay
// silently incomplete). ack(c) means the receiver's checkpoint covers
// [0, c): entries with end <= c are dropped; an entry straddling c is kept.
// range(from, to) returns the entries overlapping [from, to), in order.
//
// Memory is bounded by replay_limits (entries and payload bytes, as counted by
// SizeOf); an append that would exceed a limit is refused with an error that
// names the log, the limit, and how far the receiver has acknowledged -- the
// caller must checkpoint/ack more often or fail the session, never grow
// without bound. Defaults: 4096 entries, 64 MiB (our choice; a stories260K
// activation is 256 bytes, a 4096-dim one 16 KiB, so 4096 steps fit).
//
// Thread safety: none; one owner (the sending actor).
// Errors: cellshard::result with a message naming the log and positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cellshard/result.hpp>

namespace cellshard::supervision {

struct replay_limits {
  std::size_t max_entries = 4096;
  std::size_t max_bytes = std::size_t{64} << 20;
};

namespace detail {
template <class T, class = void>
struct has_data_size : std::false_type {};
template <class T>
struct has_data_size<T, std::void_t<decltype(std::declval<const T&>().size()),
                                    typename T::value_type>> : std::true_type {};
}  // namespace detail

/// Default payload size: size() * sizeof(value_type) for containers, else sizeof(T).
template <class T>
struct default_size_of {
  std::size_t operator()(const T& x) const {
    if constexpr (detail::has_data_size<T>::value)
      return x.size() * sizeof(typename T::value_type);
    else
      return sizeof(T);
  }
};

template <class T>
struct replay_entry {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;   ///< exclusive
  T payload;
};

template <class T, class SizeOf = default_size_of<T>>
class replay_log {
public:
  explicit replay_log(replay_limits limits = {}, std::string name = "replay log")
      : limits_(limits), name_(std::move(name)) {}

  /// Logs the message for positions [begin, end). Errors: empty range, not
  /// contiguous with the last entry (or below the acknowledged position), or
  /// a limit would be exceeded (nothing is logged then).
  result<void> append(std::uint64_t begin, std::uint64_t end, T payload) {
    if (end <= begin)
      return make_error(name_ + ": empty range [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ")");
    if (!entries_.empty() && begin != entries_.back().end)
      return make_error(name_ + ": append at " + std::to_string(begin) + " but the log ends at " +
                        std::to_string(entries_.back().end) + " (entries must be contiguous)");
    if (entries_.empty() && begin < acked_)
      return make_error(name_ + ": append at " + std::to_string(begin) +
                        " is below the acknowledged position " + std::to_string(acked_));
    std::size_t sz = SizeOf{}(payload);
    auto acked = "; the receiver has acknowledged only up to position " + std::to_string(acked_);
    if (entries_.size() + 1 > limits_.max_entries)
      return make_error(name_ + ": full: " + std::to_string(entries_.size()) + " entries held, limit " +
                        std::to_string(limits_.max_entries) + acked);
    if (bytes_ + sz > limits_.max_bytes)
      return make_error(name_ + ": full: " + std::to_string(bytes_) + " bytes held + " +
                        std::to_string(sz) + " new > limit " + std::to_string(limits_.max_bytes) +
                        acked);
    bytes_ += sz;
    entries_.push_back(replay_entry<T>{begin, end, std::move(payload)});
    return {};
  }

  result<void> append(std::uint64_t position, T payload) {
    return append(position, position + 1, std::move(payload));
  }

  /// The receiver's state covers [0, position): drop entries with end <= position.
  /// An ack below an earlier one changes nothing. Returns entries dropped.
  std::size_t ack(std::uint64_t position) {
    if (position > acked_) acked_ = position;
    std::size_t n = 0;
    while (!entries_.empty() && entries_.front().end <= acked_) {
      bytes_ -= SizeOf{}(entries_.front().payload);
      entries_.pop_front();
      ++n;
    }
    return n;
  }

  /// Copies of the entries overlapping [from, to), in order. Errors when
  /// [from, to) reaches below what the log still holds (acknowledged and
  /// trimmed, or never logged) or past its end. from >= to gives no entries.
  result<std::vector<replay_entry<T>>> range(std::uint64_t from, std::uint64_t to) const {
    std::vector<replay_entry<T>> out;
    if (from >= to) return out;
    std::uint64_t lo = entries_.empty() ? next() : entries_.front().begin;
    if (from < lo)
      return make_error(name_ + ": cannot replay from " + std::to_string(from) +
                        ": the log starts at " + std::to_string(lo) + " (acknowledged up to " +
                        std::to_string(acked_) + ")");
    if (to > next())
      return make_error(name_ + ": cannot replay up to " + std::to_string(to) +
                        ": the log ends at " + std::to_string(next()));
    for (const auto& e : entries_) {
      if (e.end <= from) continue;
      if (e.begin >= to) break;
      out.push_back(e);
    }
    return out;
  }

  /// Drops everything and restarts at `position` (e.g. a new session epoch).
  void reset(std::uint64_t position = 0) {
    entries_.clear();
    bytes_ = 0;
    acked_ = position;
  }

  std::uint64_t acked() const { return acked_; }
  /// End of the last entry (acked() when empty): the next position to append.
  std::uint64_t next() const { return entries_.empty() ? acked_ : entries_.back().end; }
  std::size_t size() const { return entries_.size(); }
  std::size_t bytes() const { return bytes_; }
  bool empty() const { return entries_.empty(); }
  const replay_limits& limits() const { return limits_; }
  const std::string& name() const { return name_; }

private:
  replay_limits limits_;
  std::string name_;
  std::deque<replay_entry<T>> entries_;
  std::size_t bytes_ = 0;
  std::uint64_t acked_ = 0;
};

/// One replay_log per (receiver, stream), created on first use with shared limits.
template <class T, class SizeOf = default_size_of<T>>
class replay_logs {
public:
  explicit replay_logs(replay_limits limits = {}) : limits_(limits) {}

  replay_log<T, SizeOf>& log(std::uint64_t receiver, std::uint64_t stream) {
    auto key = std::make_pair(receiver, stream);
    auto it = logs_.find(key);
    if (it == logs_.end())
      it = logs_
               .emplace(key, replay_log<T, SizeOf>(limits_, "replay log (receiver " +
                                                                std::to_string(receiver) +
                                                                ", stream " +
                                                                std::to_string(stream) + ")"))
               .first;
    return it->second;
  }

  void erase(std::uint64_t receiver, std::uint64_t stream) {
    logs_.erase(std::make_pair(receiver, stream));
  }

  std::size_t bytes() const {
    std::size_t n = 0;
    for (auto& [k, l] : logs_) n += l.bytes();
    return n;
  }

private:
  replay_limits limits_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, replay_log<T, SizeOf>> logs_;
};

}  // namespace cellshard::supervision
