#include "supervision/errors.hpp"

#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

#include "supervision/messages.hpp"

namespace cellshard::supervision {

std::string to_string(sv_errc code) {
  switch (code) {
    case sv_errc::none: return "none";
    case sv_errc::restart_intensity_exceeded: return "restart_intensity_exceeded";
    case sv_errc::child_start_failed: return "child_start_failed";
    case sv_errc::invalid_config: return "invalid_config";
    case sv_errc::injected_crash: return "injected_crash";
    case sv_errc::unknown_child: return "unknown_child";
    case sv_errc::node_silent: return "node_silent";
    case sv_errc::count: break;
  }
  return "sv_errc(" + std::to_string(static_cast<int>(code)) + ")";
}
static_assert(static_cast<int>(sv_errc::count) == 7, "update to_string(sv_errc)");

std::string to_string(supervisor_event_kind k) {
  switch (k) {
    case supervisor_event_kind::child_restarted: return "child_restarted";
    case supervisor_event_kind::child_terminated: return "child_terminated";
    case supervisor_event_kind::escalated: return "escalated";
    case supervisor_event_kind::count: break;
  }
  return "supervisor_event_kind(" + std::to_string(static_cast<int>(k)) + ")";
}
static_assert(static_cast<int>(supervisor_event_kind::count) == 3,
              "update to_string(supervisor_event_kind)");

caf::error make_error(sv_errc code) {
  return caf::error{static_cast<std::uint8_t>(code), sv_error_category};
}

caf::error make_error(sv_errc code, std::string context) {
  return caf::error{static_cast<std::uint8_t>(code), sv_error_category,
                    caf::make_message(std::move(context))};
}

bool is(const caf::error& reason, sv_errc code) {
  return reason && reason.category() == sv_error_category &&
         reason.code() == static_cast<std::uint8_t>(code);
}

bool is_normal_exit(const caf::error& reason) {
  if (!reason) return true;  // exit_reason::normal is the empty error
  return reason.category() == caf::atom("exit") &&
         reason.code() == static_cast<std::uint8_t>(caf::exit_reason::user_shutdown);
}

static std::string render_context(const caf::message& ctx) {
  if (ctx.empty()) return {};
  if (ctx.match_elements<std::string>()) return ctx.get_as<std::string>(0);
  return caf::to_string(ctx);
}

std::string describe(const caf::error& reason) {
  if (!reason) return "none";
  std::string out;
  auto cat = reason.category();
  if (cat == sv_error_category)
    out = to_string(static_cast<sv_errc>(reason.code()));
  else if (cat == caf::atom("exit"))
    out = caf::to_string(static_cast<caf::exit_reason>(reason.code()));
  else if (cat == caf::atom("system"))
    out = caf::to_string(static_cast<caf::sec>(reason.code()));
  else
    return caf::to_string(reason);
  auto ctx = render_context(reason.context());
  if (!ctx.empty()) out += ": " + ctx;
  return out;
}

void add_supervision_types(caf::actor_system_config& cfg) {
  // add_message_type<T> also registers std::vector<T> (as "std::vector<NAME>").
  cfg.add_message_type<supervisor_event>("cellshard::supervision::supervisor_event");
  cfg.add_message_type<child_info>("cellshard::supervision::child_info");
  cfg.add_message_type<supervisor_stats>("cellshard::supervision::supervisor_stats");
  cfg.add_message_type<suspect_event>("cellshard::supervision::suspect_event");
  cfg.add_error_category(sv_error_category,
                         [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
                           auto s = to_string(static_cast<sv_errc>(code));
                           auto c = render_context(ctx);
                           return c.empty() ? s : s + ": " + c;
                         });
}

}  // namespace cellshard::supervision
