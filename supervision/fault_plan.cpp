#include "supervision/fault_plan.hpp"

#include "base/parse.hpp"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

namespace cellshard::supervision {

namespace {

constexpr const char* kind_names[] = {"crash", "silence", "slow",     "drop",
                                      "delay", "corrupt", "partition"};
static_assert(sizeof(kind_names) / sizeof(kind_names[0]) ==
                  static_cast<std::size_t>(fault_kind::count),
              "one name per fault_kind");

std::string valid_kinds() {
  std::string s;
  for (auto n : kind_names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

// A whole decimal number up to `max` (base/parse.hpp).
std::optional<std::uint64_t> parse_bounded(std::string_view s, std::uint64_t max) {
  const auto v = cellshard::parse_uint<std::uint64_t>(s);
  if (!v || *v > max) return std::nullopt;
  return v;
}

bool one_shot(fault_kind k) { return k != fault_kind::slow; }

}  // namespace

std::string to_string(fault_kind k) {
  auto i = static_cast<std::size_t>(k);
  return i < static_cast<std::size_t>(fault_kind::count) ? kind_names[i]
                                                          : "fault_kind(" + std::to_string(i) + ")";
}

result<fault_kind> parse_fault_kind(std::string_view name) {
  for (std::size_t i = 0; i < static_cast<std::size_t>(fault_kind::count); ++i)
    if (name == kind_names[i]) return static_cast<fault_kind>(i);
  return make_error("unknown fault kind '" + std::string(name) + "' (expected one of " +
                    valid_kinds() + ")");
}

std::uint32_t fault_plan::effective_count() const {
  if (count) return *count;
  return kind == fault_kind::slow ? 0 : 1;
}

std::string to_string(const fault_plan& p) {
  std::string s = to_string(p.kind) + ":node=" + std::to_string(p.node) +
                  ":step=" + std::to_string(p.step);
  if (p.duration_ms) s += ":ms=" + std::to_string(*p.duration_ms);
  if (p.count) s += ":n=" + std::to_string(*p.count);
  return s;
}

result<void> validate(const fault_plan& p) {
  auto k = to_string(p.kind);
  switch (p.kind) {
    case fault_kind::crash:
      if (p.duration_ms) return make_error("ms= is not allowed for crash");
      if (p.count) return make_error("n= is not allowed for crash");
      break;
    case fault_kind::silence:
    case fault_kind::partition:
      if (p.count) return make_error("n= is not allowed for " + k);
      break;
    case fault_kind::slow:
    case fault_kind::delay:
      if (!p.duration_ms) return make_error(k + " needs ms=D (the added time per step)");
      break;
    case fault_kind::drop:
    case fault_kind::corrupt:
      if (p.duration_ms) return make_error("ms= is not allowed for " + k);
      break;
    case fault_kind::count:
      return make_error("invalid fault kind");
  }
  if (p.count && *p.count == 0) return make_error("n= must be at least 1");
  return {};
}

result<fault_plan> parse_fault_spec(std::string_view spec) {
  auto fail = [&](const std::string& what) -> result<fault_plan> {
    return make_error("fault spec '" + std::string(spec) + "': " + what +
                      " (format KIND:node=N:step=S[:ms=D][:n=K])");
  };
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    auto colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon == std::string_view::npos ? colon : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (parts[0].empty()) return fail("missing KIND");
  auto kind = parse_fault_kind(parts[0]);
  if (!kind) return fail(kind.message());
  fault_plan p;
  p.kind = *kind;
  bool have_node = false, have_step = false;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    auto f = parts[i];
    if (f.empty()) return fail("empty field #" + std::to_string(i));
    auto eq = f.find('=');
    if (eq == std::string_view::npos)
      return fail("field '" + std::string(f) + "' is not KEY=VALUE");
    auto key = f.substr(0, eq);
    auto val = f.substr(eq + 1);
    auto num = [&](std::uint64_t max) { return parse_bounded(val, max); };
    auto bad_value = [&](const char* what) {
      return fail(std::string(key) + ": '" + std::string(val) + "' is not " + what);
    };
    if (key == "node") {
      if (have_node) return fail("node given twice");
      auto v = num(std::numeric_limits<std::uint32_t>::max());
      if (!v) return bad_value("a non-negative integer (32 bit)");
      p.node = static_cast<std::uint32_t>(*v);
      have_node = true;
    } else if (key == "step") {
      if (have_step) return fail("step given twice");
      auto v = num(std::numeric_limits<std::uint64_t>::max());
      if (!v) return bad_value("a non-negative integer");
      p.step = *v;
      have_step = true;
    } else if (key == "ms") {
      if (p.duration_ms) return fail("ms given twice");
      auto v = num(std::numeric_limits<std::uint64_t>::max());
      if (!v) return bad_value("a non-negative integer number of milliseconds");
      p.duration_ms = *v;
    } else if (key == "n") {
      if (p.count) return fail("n given twice");
      auto v = num(std::numeric_limits<std::uint32_t>::max());
      if (!v) return bad_value("a positive integer (32 bit)");
      p.count = static_cast<std::uint32_t>(*v);
    } else {
      return fail("unknown key '" + std::string(key) + "' (expected node, step, ms or n)");
    }
  }
  if (!have_node) return fail("missing node=N");
  if (!have_step) return fail("missing step=S");
  if (auto ok = validate(p); !ok) return fail(ok.message());
  return p;
}

result<std::vector<fault_plan>> parse_fault_json(std::string_view text) {
  using nlohmann::json;
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    // parse_error and out_of_range (a number too large for a double) alike.
    return make_error(std::string("fault file: invalid JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("faults"))
    return make_error("fault file: expected an object {\"faults\": [...]}");
  const auto& arr = doc["faults"];
  if (!arr.is_array()) return make_error("fault file: \"faults\" must be an array");
  std::vector<fault_plan> out;
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const auto& e = arr[i];
    std::string where = "faults[" + std::to_string(i) + "]";
    if (!e.is_object()) return make_error(where + ": expected an object");
    fault_plan p;
    bool have_kind = false, have_node = false, have_step = false;
    for (auto it = e.begin(); it != e.end(); ++it) {
      const auto& key = it.key();
      const auto& v = it.value();
      auto uint_of = [&](std::uint64_t max) -> std::optional<std::uint64_t> {
        if (!v.is_number_unsigned()) return std::nullopt;
        auto x = v.get<std::uint64_t>();
        if (x > max) return std::nullopt;
        return x;
      };
      if (key == "kind") {
        if (!v.is_string()) return make_error(where + ".kind: expected a string");
        auto k = parse_fault_kind(v.get<std::string>());
        if (!k) return make_error(where + ".kind: " + k.message());
        p.kind = *k;
        have_kind = true;
      } else if (key == "node") {
        auto x = uint_of(std::numeric_limits<std::uint32_t>::max());
        if (!x) return make_error(where + ".node: expected a non-negative integer (32 bit)");
        p.node = static_cast<std::uint32_t>(*x);
        have_node = true;
      } else if (key == "step") {
        auto x = uint_of(std::numeric_limits<std::uint64_t>::max());
        if (!x) return make_error(where + ".step: expected a non-negative integer");
        p.step = *x;
        have_step = true;
      } else if (key == "ms") {
        auto x = uint_of(std::numeric_limits<std::uint64_t>::max());
        if (!x) return make_error(where + ".ms: expected a non-negative integer (milliseconds)");
        p.duration_ms = *x;
      } else if (key == "n") {
        auto x = uint_of(std::numeric_limits<std::uint32_t>::max());
        if (!x) return make_error(where + ".n: expected a positive integer (32 bit)");
        p.count = static_cast<std::uint32_t>(*x);
      } else {
        return make_error(where + ": unknown key '" + key +
                          "' (expected kind, node, step, ms or n)");
      }
    }
    if (!have_kind) return make_error(where + ": missing \"kind\"");
    if (!have_node) return make_error(where + ": missing \"node\"");
    if (!have_step) return make_error(where + ": missing \"step\"");
    if (auto ok = validate(p); !ok) return make_error(where + ": " + ok.message());
    out.push_back(p);
  }
  return out;
}

fault_injector::fault_injector(std::vector<fault_plan> plans)
    : plans_(std::move(plans)), fired_(plans_.size(), false) {}

void fault_injector::add(fault_plan p) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.push_back(p);
  fired_.push_back(false);
}

fault_effects fault_injector::at(std::uint32_t node, std::uint64_t first, std::uint64_t last) {
  fault_effects fx;
  if (last <= first) last = first + 1;
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < plans_.size(); ++i) {
    const auto& p = plans_[i];
    if (p.node != node) continue;
    if (one_shot(p.kind)) {
      if (fired_[i] || p.step >= last) continue;
      fired_[i] = true;
    } else {
      // slow: active on [step, step + n) (n = 0: unlimited); overlap with [first, last)?
      auto n = p.effective_count();
      std::uint64_t end = n == 0 ? std::numeric_limits<std::uint64_t>::max() : p.step + n;
      if (end < p.step) end = std::numeric_limits<std::uint64_t>::max();  // overflow
      if (!(p.step < last && first < end)) continue;
    }
    auto ms = std::chrono::milliseconds(p.duration_ms.value_or(0));
    switch (p.kind) {
      case fault_kind::crash: fx.crash = true; break;
      case fault_kind::silence:
        fx.silence = true;
        if (p.duration_ms) fx.silence_for = ms;
        else fx.silence_for.reset();
        break;
      case fault_kind::slow: fx.slow += ms; break;
      case fault_kind::drop: fx.drop += p.effective_count(); break;
      case fault_kind::delay:
        fx.delay = std::max(fx.delay, ms);
        fx.delay_count += p.effective_count();
        break;
      case fault_kind::corrupt: fx.corrupt += p.effective_count(); break;
      case fault_kind::partition:
        fx.partition = true;
        if (p.duration_ms) fx.partition_for = ms;
        else fx.partition_for.reset();
        break;
      case fault_kind::count: break;
    }
    fx.fired.push_back(p);
  }
  return fx;
}

std::vector<std::pair<fault_plan, bool>> fault_injector::plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<fault_plan, bool>> out;
  for (std::size_t i = 0; i < plans_.size(); ++i) out.emplace_back(plans_[i], fired_[i]);
  return out;
}

bool fault_injector::mark_fired(const fault_plan& p) {
  if (!one_shot(p.kind)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (!fired_[i] && plans_[i] == p) {
      fired_[i] = true;
      return true;
    }
  return false;
}

void fault_injector::mark_fired_through(std::uint32_t node, fault_kind kind, std::uint64_t step) {
  if (!one_shot(kind)) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (plans_[i].node == node && plans_[i].kind == kind && plans_[i].step <= step) fired_[i] = true;
}

std::vector<fault_plan> fault_injector::pending(std::uint32_t node) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<fault_plan> out;
  for (std::size_t i = 0; i < plans_.size(); ++i)
    if (plans_[i].node == node && !fired_[i]) out.push_back(plans_[i]);
  return out;
}

void fault_injector::rearm() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(fired_.begin(), fired_.end(), false);
}

}  // namespace cellshard::supervision
