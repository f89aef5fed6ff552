// supervision/errors.hpp: the error category of the supervision blocks and a
// renderer for every caf::error they may see.
//
// Errors are values (STYLE.md item 6): actors quit with, and reply, a
// caf::error built by make_error(sv_errc, context). The context is a message
// holding one std::string that names the supervisor/child/node and the cause,
// so describe() can print it without an actor_system.
//
// CAF 0.17.6 pitfalls handled here (measured on this machine):
// - An exit with exit_reason::normal arrives as an *empty* caf::error, and
//   calling code()/category() on an empty error dereferences null (segfault).
//   Use is_normal_exit()/describe(), which check for emptiness first.
// - exit_reason::kill cannot be trapped: it terminates an actor even when it
//   installed an exit handler.
//
// Thread safety: all functions are pure.
#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>

namespace cellshard::supervision {

/// Error codes of the supervision blocks (category sv_error_category).
enum class sv_errc : std::uint8_t {
  none = 0,
  /// A supervisor saw more than R restarts in T; it stopped its children and
  /// escalates. This is the supervisor's own exit reason.
  restart_intensity_exceeded,
  /// A child factory returned an invalid handle.
  child_start_failed,
  /// A supervisor/monitor configuration was rejected (context says which field).
  invalid_config,
  /// A fault hook made the actor quit on purpose (--fault crash:...).
  injected_crash,
  /// A request named a child/peer that does not exist.
  unknown_child,
  /// A failure detector declared the child's node silent (heartbeats stopped,
  /// phi accrual over its threshold) and the child was taken away from it.
  node_silent,
  /// Final enumerator: the number of codes (keep last).
  count
};

/// Category atom of sv_errc errors ("cs_superv", at most 10 characters).
constexpr caf::atom_value sv_error_category = caf::atom("cs_superv");

/// Name of a code ("restart_intensity_exceeded").
std::string to_string(sv_errc code);

/// An error of category sv_error_category whose context is `context`.
caf::error make_error(sv_errc code);
caf::error make_error(sv_errc code, std::string context);

/// True when `reason` is an error of our category with the given code.
bool is(const caf::error& reason, sv_errc code);

/// True for exits OTP calls "normal": none (exit_reason::normal) and
/// exit_reason::user_shutdown. A transient child exiting normally is not restarted.
bool is_normal_exit(const caf::error& reason);

/// Human-readable text for any error: "none", "exit_reason(kill)",
/// "sec(request_timeout)", "restart_intensity_exceeded: supervisor 'x' ...".
/// Works without an actor_system (no registered renderers needed).
std::string describe(const caf::error& reason);

/// Registers the message types of supervision/messages.hpp and the error
/// renderer of sv_errc with a config. Needed only when these messages cross
/// process boundaries or for sys.render(); harmless otherwise. Call it on
/// every node, before constructing the actor_system.
void add_supervision_types(caf::actor_system_config& cfg);

}  // namespace cellshard::supervision
