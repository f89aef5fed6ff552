// supervision/fault_plan.hpp: fault plans (what to break, where, when) and the
// injector a shard asks every step. CAF-free; the actor side is fault_hooks.hpp.
//
// CLI spec (docs/CLI.md, --fault, repeatable):   KIND:node=N:step=S[:ms=D][:n=K]
// JSON (--faults FILE):  {"faults": [{"kind": "crash", "node": 2, "step": 40}, ...]}
//   with the same keys (kind, node, step, ms, n); unknown keys are errors.
//
//   kind       effect when it fires                               ms          n (default)
//   crash      the actor quits with sv_errc::injected_crash        forbidden   forbidden
//   silence    stops replying and heartbeating for ms              optional:   forbidden
//                                                                  absent = for ever
//   slow       +ms compute time on each step from S on             required    steps affected
//                                                                              (absent = all)
//   drop       the next n outgoing messages are dropped            forbidden   messages (1)
//   delay      the next n outgoing messages are held back ms       required    messages (1)
//   corrupt    the next n outgoing payloads get a flipped byte     forbidden   messages (1)
//   partition  the node's links are cut for ms                     optional:   forbidden
//                                                                  absent = for ever
//   N is the placement index, S the position (step) at which the fault fires.
//
// Firing rule (fault_injector): one-shot kinds (everything but slow) fire once,
// on the first query whose step range [first, last) reaches S (S < last), so a
// prefill batch covering S fires it, and a replay of S after a restart does
// not fire it again. slow applies to every query whose range overlaps
// [S, S + n) (n absent: [S, inf)), adding ms once per query (= per step).
//
// Units: node = placement index, step = token position, ms = milliseconds.
// Thread safety: fault_plan and the parse functions are plain values/pure;
// fault_injector is internally locked (one injector may serve every
// in-process shard). Errors: parse functions return cellshard::result with a
// message that quotes the spec and names the key and what was expected.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <cellshard/result.hpp>

namespace cellshard::supervision {

enum class fault_kind : std::uint8_t { crash, silence, slow, drop, delay, corrupt, partition, count };

std::string to_string(fault_kind k);
/// Parses a kind name ("crash"...); error lists the valid names.
result<fault_kind> parse_fault_kind(std::string_view name);

struct fault_plan {
  fault_kind kind = fault_kind::crash;
  std::uint32_t node = 0;                  ///< placement index
  std::uint64_t step = 0;                  ///< position at which it fires
  std::optional<std::uint64_t> duration_ms;///< ms=; see the table above
  std::optional<std::uint32_t> count;      ///< n=; see the table above

  /// n with its per-kind default (1 for drop/delay/corrupt; 0 = unlimited for
  /// slow without n; 1 for the rest).
  std::uint32_t effective_count() const;
  bool operator==(const fault_plan& o) const {
    return kind == o.kind && node == o.node && step == o.step && duration_ms == o.duration_ms &&
           count == o.count;
  }
};

/// The CLI form, e.g. "silence:node=1:step=5:ms=300"; parse_fault_spec(to_string(p)) == p.
std::string to_string(const fault_plan& p);

/// Checks the per-kind rules of the table above (ms/n required/forbidden, n >= 1).
result<void> validate(const fault_plan& p);

/// Parses one CLI spec. Errors look like
///   fault spec 'crash:node=x:step=4': node: 'x' is not a non-negative integer
result<fault_plan> parse_fault_spec(std::string_view spec);

/// Parses the JSON document {"faults": [...]}. Errors name the element:
///   faults[1].step: expected a non-negative integer
result<std::vector<fault_plan>> parse_fault_json(std::string_view text);

/// What a shard must do at one step. Zero/false members mean "nothing".
struct fault_effects {
  bool crash = false;
  bool silence = false;
  std::optional<std::chrono::milliseconds> silence_for;   ///< nullopt = for ever
  std::chrono::milliseconds slow{0};                      ///< extra compute time this step
  std::uint32_t drop = 0;                                 ///< outgoing messages to drop
  std::uint32_t delay_count = 0;                          ///< outgoing messages to delay ...
  std::chrono::milliseconds delay{0};                     ///< ... by this much
  std::uint32_t corrupt = 0;                              ///< outgoing payloads to corrupt
  bool partition = false;
  std::optional<std::chrono::milliseconds> partition_for; ///< nullopt = for ever
  std::vector<fault_plan> fired;                          ///< plans that contributed (reporting)

  bool any() const { return !fired.empty(); }
};

class fault_injector {
public:
  fault_injector() = default;
  explicit fault_injector(std::vector<fault_plan> plans);

  /// Adds a plan (not validated here; use parse_* or validate()).
  void add(fault_plan p);

  /// Effects for `node` on the step covering positions [first, last)
  /// (last > first; a single decode step is [s, s+1)). Consumes one-shot plans.
  fault_effects at(std::uint32_t node, std::uint64_t first, std::uint64_t last);
  fault_effects at(std::uint32_t node, std::uint64_t step) { return at(node, step, step + 1); }

  /// All plans, each with whether it has fired.
  std::vector<std::pair<fault_plan, bool>> plans() const;
  /// Marks the first unfired one-shot plan equal to `p` as fired (a copy of
  /// the plan fired in another process: a node daemon's injector). Returns
  /// whether one was marked; slow plans never fire, so never.
  bool mark_fired(const fault_plan& p);
  /// Marks every unfired plan of `kind` for placement index `node` with
  /// step <= `step` as fired: what a copy of this injector in another process
  /// consumed when that kind fired there at `step` (one-shot plans that are
  /// reached fire together).
  void mark_fired_through(std::uint32_t node, fault_kind kind, std::uint64_t step);
  /// The plans of placement index `node` that have not fired (slow plans
  /// always), to hand to a shard started in another process.
  std::vector<fault_plan> pending(std::uint32_t node) const;
  /// Re-arms every one-shot plan.
  void rearm();

private:
  mutable std::mutex mu_;
  std::vector<fault_plan> plans_;
  std::vector<bool> fired_;
};

}  // namespace cellshard::supervision
