// tools/stop_signals.hpp: SIGINT and SIGTERM as a clean stop of the
// long-running commands (`node`, `serve`).
//
// Blocking the two signals and sigwait()ing for them is not enough here:
// threads that exist before main() runs -- OpenBLAS starts its worker pool
// from a library constructor unless OPENBLAS_NUM_THREADS is 1 -- keep an
// empty signal mask. Linux gives a process-directed signal to the main thread
// when it can take it (a sigwait() there can), else to any thread not
// blocking it: `serve` waited on a watcher thread, so a pool thread took
// SIGTERM and its default action ended the process (status 143, no clean
// stop; `node` waited on its main thread and was spared). So the signals get
// a process-wide handler instead, which writes the signal number to a pipe
// (async-signal-safe; the self-pipe pattern); wait() reads it, whichever
// thread ran the handler.
//
// One instance at a time (the handler's pipe is process-wide). Thread
// safety: wait() on one thread, cancel() from any thread. Errors: the
// constructor throws cli_error when the pipe or a handler cannot be set up.
#pragma once

namespace cellshard::tools {

class stop_signals {
public:
  stop_signals();
  /// Restores the default actions of SIGINT and SIGTERM; closes the pipe.
  ~stop_signals();
  stop_signals(const stop_signals&) = delete;
  stop_signals& operator=(const stop_signals&) = delete;
  /// Blocks until SIGINT or SIGTERM arrives (returns it) or cancel() is
  /// called (returns 0). A signal that came before wait() is not lost.
  int wait();
  /// Makes a wait() in progress, or the next one, return 0.
  void cancel();
};

}  // namespace cellshard::tools
