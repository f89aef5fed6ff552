#include "supervision/supervisor.hpp"
#include "supervision/listeners.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <deque>
#include <set>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

namespace cellshard::supervision {

std::string to_string(restart_strategy s) {
  switch (s) {
    case restart_strategy::one_for_one: return "one_for_one";
    case restart_strategy::rest_for_one: return "rest_for_one";
    case restart_strategy::one_for_all: return "one_for_all";
    case restart_strategy::count: break;
  }
  return "restart_strategy(" + std::to_string(static_cast<int>(s)) + ")";
}
static_assert(static_cast<int>(restart_strategy::count) == 3, "update to_string");

std::string to_string(restart_type t) {
  switch (t) {
    case restart_type::permanent: return "permanent";
    case restart_type::transient: return "transient";
    case restart_type::temporary: return "temporary";
    case restart_type::count: break;
  }
  return "restart_type(" + std::to_string(static_cast<int>(t)) + ")";
}
static_assert(static_cast<int>(restart_type::count) == 3, "update to_string");

caf::error validate(const supervisor_config& cfg) {
  auto bad = [&](const std::string& what) {
    return make_error(sv_errc::invalid_config, "supervisor '" + cfg.name + "': " + what);
  };
  if (cfg.intensity.period <= caf::timespan::zero()) return bad("intensity period must be > 0");
  if (cfg.strategy >= restart_strategy::count) return bad("unknown strategy");
  std::set<std::string> ids;
  for (std::size_t i = 0; i < cfg.children.size(); ++i) {
    const auto& c = cfg.children[i];
    if (c.id.empty()) return bad("child #" + std::to_string(i) + " has an empty id");
    if (!ids.insert(c.id).second) return bad("duplicate child id '" + c.id + "'");
    if (!c.start && !c.start_async) return bad("child '" + c.id + "' has no factory");
    if (c.restart >= restart_type::count) return bad("child '" + c.id + "': unknown restart type");
  }
  return {};
}

namespace {

struct child_entry {
  child_spec spec;
  caf::actor handle;            // invalid while not running
  std::uint64_t restarts = 0;
  caf::error last_reason;
  // A start running off the supervisor's thread (start_may_block).
  bool starting = false;
  bool starting_first = false;   // its first start: a failure escalates
  std::uint64_t attempt = 0;     // tags results; a stale one is refused
  std::string starting_cause;    // for the child_restarted event
  caf::error starting_reason;
};

child_entry entry_of(child_spec spec) {
  child_entry e;
  e.spec = std::move(spec);
  return e;
}

struct supervisor_state;
using supervisor_actor = caf::stateful_actor<supervisor_state>;

struct supervisor_state {
  static inline const char* name = "cellshard.supervisor";

  supervisor_actor* self = nullptr;
  supervisor_config cfg;                 // cfg.children moved into `children`
  std::vector<child_entry> children;     // spec order
  std::deque<caf::actor_clock::time_point> window;  // restart decisions in the period
  std::uint64_t total_restarts = 0;
  std::string last_child;
  caf::error last_reason;
  bool done = false;                     // escalated or stopping

  supervisor_state() = default;
  supervisor_state(const supervisor_state&) = delete;
  supervisor_state& operator=(const supervisor_state&) = delete;

  // Runs whenever the supervisor terminates, including by an untrappable
  // kill: children never outlive their supervisor.
  ~supervisor_state() {
    for (auto& c : children)
      if (c.handle) caf::anon_send_exit(c.handle, caf::exit_reason::kill);
  }

  caf::actor me() const { return caf::actor_cast<caf::actor>(self); }

  std::size_t find(const caf::actor_addr& addr) const {
    for (std::size_t i = 0; i < children.size(); ++i)
      if (children[i].handle && children[i].handle.address() == addr) return i;
    return children.size();
  }

  std::size_t find(const std::string& id) const {
    for (std::size_t i = 0; i < children.size(); ++i)
      if (children[i].spec.id == id) return i;
    return children.size();
  }

  std::uint64_t in_window() const {
    auto now = self->clock().now();
    return static_cast<std::uint64_t>(std::count_if(
        window.begin(), window.end(), [&](auto t) { return now - t < cfg.intensity.period; }));
  }

  void emit(supervisor_event_kind kind, const child_entry& c, const std::string& cause,
            const caf::error& reason) {
    supervisor_event ev;
    ev.kind = kind;
    ev.supervisor = cfg.name;
    ev.child = c.spec.id;
    ev.cause = cause;
    ev.handle = kind == supervisor_event_kind::child_restarted ? c.handle : caf::actor{};
    ev.reason = reason;
    ev.incarnation = c.restarts;
    ev.restarts_in_window = in_window();
    bool parent_is_listener = false;
    for (auto& l : cfg.listeners) {
      if (!l) continue;
      if (l == cfg.parent) parent_is_listener = true;
      self->send(l, sv_event_atom::value, ev);
    }
    if (kind == supervisor_event_kind::escalated && cfg.parent && !parent_is_listener)
      self->send(cfg.parent, sv_event_atom::value, ev);
  }

  // Starts children[i]; on failure queues a retry that counts as an exit.
  // A start that may block is only launched here (true: pending); its
  // result comes back as sv_started (started()).
  bool start(std::size_t i, bool first_start, const std::string& cause = {}, const caf::error& why = {}) {
    auto& c = children[i];
    if (!first_start) ++c.restarts;
    if (c.spec.start_may_block || c.spec.start_async) {
      c.handle = nullptr;
      c.starting = true;
      c.starting_first = first_start;
      c.starting_cause = cause;
      c.starting_reason = why;
      if (c.spec.start_async)
        launch_async_start(c, ++c.attempt);
      else
        launch_blocking_start(c, ++c.attempt);
      return true;
    }
    start_context ctx{self->home_system(), me(), c.spec.id, c.restarts, c.last_reason};
    caf::actor h = c.spec.start(ctx);
    if (!h) {
      c.handle = nullptr;
      if (!first_start) self->send(self, sv_retry_atom::value, c.spec.id, c.restarts);
      return false;
    }
    self->monitor(h);
    c.handle = std::move(h);
    return true;
  }

  // The helper owns copies of everything the factory reads; the context's
  // references point into the helper's own state.
  void launch_blocking_start(const child_entry& c, std::uint64_t attempt) {
    auto sup = me();
    auto factory = c.spec.start;
    auto id = c.spec.id;
    auto incarnation = c.restarts;
    auto last = c.last_reason;
    self->home_system().spawn<caf::detached + caf::hidden>(
        [sup, factory, id, incarnation, last, attempt](caf::event_based_actor* helper) -> caf::behavior {
          start_context ctx{helper->home_system(), sup, id, incarnation, last};
          caf::actor h = factory(ctx);
          // No timeout: a living supervisor answers at once, a dead one's
          // mailbox bounces the request as an error at once; and a request
          // timeout would hold this helper in the actor clock, which an
          // actor system being destroyed may never fire (its destructor
          // then waits for this detached thread for ever).
          helper->request(sup, caf::infinite, sv_started_atom::value, id, attempt, h)
              .then(
                  [helper, h](bool accepted) {
                    if (!accepted && h) helper->send_exit(h, caf::exit_reason::kill);
                    helper->quit();
                  },
                  [helper, h](caf::error&) {  // the supervisor is gone
                    if (h) helper->send_exit(h, caf::exit_reason::kill);
                    helper->quit();
                  });
          return {[] {}};
        });
  }

  // An asynchronous start: the factory runs here and hands its result to
  // `done`, which a courier delivers as sv_started (refused: killed).
  void launch_async_start(const child_entry& c, std::uint64_t attempt) {
    auto sup = me();
    auto id = c.spec.id;
    auto& sys = self->home_system();
    auto once = std::make_shared<std::atomic<bool>>(false);
    start_done done = [&sys, sup, id, attempt, once](caf::actor h) {
      if (once->exchange(true)) return;
      sys.spawn<caf::hidden>([sup, id, attempt, h](caf::event_based_actor* courier) -> caf::behavior {
        // No timeout, as for the blocking helper: a living supervisor
        // answers at once, a dead one's mailbox bounces the request.
        courier->request(sup, caf::infinite, sv_started_atom::value, id, attempt, h)
            .then(
                [courier, h](bool accepted) {
                  if (!accepted && h) courier->send_exit(h, caf::exit_reason::kill);
                  courier->quit();
                },
                [courier, h](caf::error&) {
                  if (h) courier->send_exit(h, caf::exit_reason::kill);
                  courier->quit();
                });
        return {[] {}};
      });
    };
    start_context ctx{sys, sup, c.spec.id, c.restarts, c.last_reason};
    c.spec.start_async(ctx, std::move(done));
  }

  // The result of a blocking start; false when it is no longer wanted.
  bool started(const std::string& id, std::uint64_t attempt, caf::actor h) {
    auto i = find(id);
    if (done || i == children.size()) return false;
    auto& c = children[i];
    if (!c.starting || c.attempt != attempt) return false;
    c.starting = false;
    if (!h) {
      if (c.starting_first)
        escalate(c, make_error(sv_errc::child_start_failed, c.spec.id), sv_errc::child_start_failed);
      else
        child_exited(i, make_error(sv_errc::child_start_failed,
                                   "supervisor '" + cfg.name + "': child '" + id + "' could not be started"));
      return false;
    }
    self->monitor(h);
    c.handle = std::move(h);
    if (!c.starting_first) emit(supervisor_event_kind::child_restarted, c, c.starting_cause, c.starting_reason);
    return true;
  }

  void terminate(child_entry& c) {
    c.starting = false;  // a start in flight is refused when it completes
    if (!c.handle) return;
    self->demonitor(c.handle);
    self->send_exit(c.handle, caf::exit_reason::kill);
    c.handle = nullptr;
  }

  void terminate_all() {
    for (auto i = children.size(); i-- > 0;) terminate(children[i]);
  }

  // Returns false when this restart exceeds the intensity.
  bool count_restart() {
    auto now = self->clock().now();
    while (!window.empty() && now - window.front() >= cfg.intensity.period) window.pop_front();
    window.push_back(now);
    return window.size() <= cfg.intensity.max_restarts;
  }

  void escalate(const child_entry& c, const caf::error& reason, sv_errc code) {
    if (done) return;
    done = true;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(cfg.intensity.period).count();
    std::string text = "supervisor '" + cfg.name + "': child '" + c.spec.id + "' exited (" +
                       describe(reason) + ")";
    if (code == sv_errc::restart_intensity_exceeded)
      text += "; " + std::to_string(window.size()) + " restarts within " + std::to_string(ms) +
              " ms exceed the limit of " + std::to_string(cfg.intensity.max_restarts);
    else
      text = "supervisor '" + cfg.name + "': child '" + c.spec.id + "' could not be started";
    terminate_all();
    emit(supervisor_event_kind::escalated, c, c.spec.id, reason);
    self->quit(make_error(code, std::move(text)));
  }

  void child_exited(std::size_t i, caf::error reason) {
    if (done) return;
    auto& c = children[i];
    c.handle = nullptr;
    c.last_reason = reason;
    bool restart = c.spec.restart == restart_type::permanent ||
                   (c.spec.restart == restart_type::transient && !is_normal_exit(reason));
    if (!restart) {
      emit(supervisor_event_kind::child_terminated, c, c.spec.id, reason);
      if (c.spec.restart == restart_type::temporary) children.erase(children.begin() + i);
      return;
    }
    if (!count_restart()) {
      escalate(c, reason, sv_errc::restart_intensity_exceeded);
      return;
    }
    ++total_restarts;
    last_child = c.spec.id;
    last_reason = reason;
    std::string cause = c.spec.id;
    // Which children restart (by identity, since temporaries get erased).
    std::vector<bool> again(children.size(), false);
    switch (cfg.strategy) {
      case restart_strategy::one_for_one: again[i] = true; break;
      case restart_strategy::rest_for_one:
        for (std::size_t j = i; j < children.size(); ++j) again[j] = true;
        break;
      case restart_strategy::one_for_all:
      case restart_strategy::count:
        std::fill(again.begin(), again.end(), true);
        break;
    }
    for (auto j = children.size(); j-- > 0;)
      if (again[j] && j != i) terminate(children[j]);
    // Temporary siblings are terminated but not restarted, and forgotten.
    std::vector<child_entry> kept;
    std::vector<bool> kept_again;
    for (std::size_t j = 0; j < children.size(); ++j) {
      if (again[j] && j != i && children[j].spec.restart == restart_type::temporary) {
        emit(supervisor_event_kind::child_terminated, children[j], cause, reason);
        continue;
      }
      kept.push_back(std::move(children[j]));
      kept_again.push_back(again[j]);
    }
    children = std::move(kept);
    for (std::size_t j = 0; j < children.size(); ++j) {
      if (!kept_again[j]) continue;
      if (start(j, false, cause, reason) && !children[j].starting)
        emit(supervisor_event_kind::child_restarted, children[j], cause, reason);
    }
  }

  child_info info(const child_entry& c) const {
    return child_info{c.spec.id, c.handle, static_cast<std::uint8_t>(c.spec.restart),
                      c.restarts, c.last_reason};
  }
};

caf::behavior supervisor_impl(supervisor_actor* self, supervisor_config cfg) {
  auto& st = self->state;
  st.self = self;
  for (auto& spec : cfg.children) st.children.push_back(entry_of(std::move(spec)));
  cfg.children.clear();
  st.cfg = std::move(cfg);
  for (auto& l : st.cfg.listeners)
    if (l) self->monitor(l);

  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto i = st.find(dm.source);
    if (i < st.children.size()) {
      st.child_exited(i, std::move(dm.reason));
      return;
    }
    // A listener went away (down_msgs of replaced incarnations are ignored).
    auto& ls = st.cfg.listeners;
    ls.erase(std::remove_if(ls.begin(), ls.end(),
                            [&](const caf::actor& l) { return l.address() == dm.source; }),
             ls.end());
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    if (!em.reason) return;  // a linked actor ended normally: not our business
    auto& st = self->state;
    if (st.find(em.source) < st.children.size()) return;  // children are not linked
    st.done = true;
    st.terminate_all();
    self->quit(std::move(em.reason));
  });

  for (std::size_t i = 0; i < st.children.size(); ++i) {
    if (!st.start(i, true)) {
      st.escalate(st.children[i], make_error(sv_errc::child_start_failed, st.children[i].spec.id),
                  sv_errc::child_start_failed);
      return {};
    }
  }

  return {
      [self](sv_children_atom) {
        std::vector<child_info> out;
        for (auto& c : self->state.children) out.push_back(self->state.info(c));
        return out;
      },
      [self](sv_stats_atom) {
        auto& st = self->state;
        supervisor_stats s;
        s.name = st.cfg.name;
        s.total_restarts = st.total_restarts;
        s.restarts_in_window = st.in_window();
        s.last_child = st.last_child;
        s.last_reason = st.last_reason;
        for (auto& c : st.children) s.children.push_back(st.info(c));
        return s;
      },
      [self](sv_listen_atom, caf::actor l) { add_listener(self, self->state.cfg.listeners, std::move(l)); },
      [self](sv_unlisten_atom, caf::actor l) { remove_listener(self, self->state.cfg.listeners, l); },
      [self](sv_stop_atom) {
        self->state.done = true;
        self->state.terminate_all();
        self->quit();
      },
      [self](sv_add_atom, child_spec& spec) -> caf::result<caf::actor> {
        auto& st = self->state;
        if (st.done) return make_error(sv_errc::invalid_config, "supervisor is stopping");
        if (spec.start_may_block || spec.start_async)
          return make_error(sv_errc::invalid_config, "supervisor '" + st.cfg.name + "': child '" + spec.id +
                                                         "' has a start that does not return the child: add it "
                                                         "in the config");
        if (spec.id.empty() || (!spec.start && !spec.start_async) || st.find(spec.id) < st.children.size())
          return make_error(sv_errc::invalid_config,
                            "supervisor '" + st.cfg.name + "': child id '" + spec.id +
                                "' is empty, duplicate or has no factory");
        st.children.push_back(entry_of(std::move(spec)));
        if (!st.start(st.children.size() - 1, true)) {
          auto id = st.children.back().spec.id;
          st.children.pop_back();
          return make_error(sv_errc::child_start_failed,
                            "supervisor '" + st.cfg.name + "': child '" + id +
                                "' could not be started");
        }
        return st.children.back().handle;
      },
      [self](sv_remove_atom, const std::string& id) -> caf::result<void> {
        auto& st = self->state;
        auto i = st.find(id);
        if (i == st.children.size())
          return make_error(sv_errc::unknown_child,
                            "supervisor '" + st.cfg.name + "' has no child '" + id + "'");
        st.terminate(st.children[i]);
        st.children.erase(st.children.begin() + i);
        return caf::unit;
      },
      [self](sv_exited_atom, const std::string& id, const caf::actor& incarnation, caf::error& reason) {
        auto& st = self->state;
        auto i = st.find(id);
        if (i == st.children.size() || st.done) return;
        auto& c = st.children[i];
        if (!c.handle || c.handle != incarnation) return;  // already replaced or gone
        st.terminate(c);
        st.child_exited(i, std::move(reason));
      },
      [self](sv_started_atom, const std::string& id, std::uint64_t attempt, caf::actor& h) {
        return self->state.started(id, attempt, std::move(h));
      },
      [self](sv_retry_atom, const std::string& id, std::uint64_t incarnation) {
        auto& st = self->state;
        auto i = st.find(id);
        if (i == st.children.size()) return;
        auto& c = st.children[i];
        // Only if that failed start is still the latest word on this child.
        if (c.handle || c.restarts != incarnation) return;
        st.child_exited(i, make_error(sv_errc::child_start_failed,
                                      "supervisor '" + st.cfg.name + "': child '" + id +
                                          "' could not be started"));
      },
      // Events of nested supervisors: their down_msg is what we act on.
      [](sv_event_atom, const supervisor_event&) {},
  };
}

}  // namespace

caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, supervisor_config cfg) {
  if (auto err = validate(cfg)) return err;
  return sys.spawn(supervisor_impl, std::move(cfg));
}

child_spec supervisor_child(std::string id, supervisor_config cfg, restart_type restart) {
  child_spec spec;
  spec.id = std::move(id);
  spec.restart = restart;
  spec.start = [cfg](const start_context& ctx) -> caf::actor {
    auto c = cfg;
    c.parent = ctx.supervisor;
    auto h = spawn_supervisor(ctx.system, std::move(c));
    return h ? *h : caf::actor{};
  };
  return spec;
}

}  // namespace cellshard::supervision
