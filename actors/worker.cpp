#include "actors/worker.hpp"

#if defined(__linux__)
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace cellshard::actors {

compute_worker::compute_worker(std::string name, int nice_increment, bool inline_jobs,
                               std::shared_ptr<compute_gate> gate)
    : inline_(inline_jobs), name_(std::move(name)), gate_(inline_jobs ? nullptr : std::move(gate)) {
  if (!inline_) thread_ = std::thread([this, nice_increment] { loop(nice_increment); });
}

compute_worker::~compute_worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  if (gate_) gate_->open();  // a job held by a test's gate runs on (and sees cancelled_)
  if (thread_.joinable()) thread_.join();
}

void compute_worker::post(job j) {
  if (inline_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++running_;
    }
    j(cancelled_);
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    jobs_.push_back(std::move(j));
  }
  cv_.notify_one();
}

void compute_worker::post_next(job j) {
  if (inline_) {
    post(std::move(j));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    jobs_.insert(jobs_.empty() ? jobs_.end() : jobs_.begin() + 1, std::move(j));
  }
  cv_.notify_one();
}

std::size_t compute_worker::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size() + running_;
}

void compute_worker::loop(int nice_increment) {
#if defined(__linux__)
  // Thread names are at most 15 characters.
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  if (nice_increment > 0) {
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    errno = 0;
    const int base = getpriority(PRIO_PROCESS, 0);
    if (errno == 0) (void)setpriority(PRIO_PROCESS, tid, base + nice_increment);
  }
#else
  (void)nice_increment;
#endif
  for (;;) {
    job j;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return cancelled_ || !jobs_.empty(); });
      if (cancelled_) return;
      j = std::move(jobs_.front());
      jobs_.pop_front();
      ++running_;
    }
    if (gate_) gate_->hold(cancelled_);
    j(cancelled_);
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
  }
}

}  // namespace cellshard::actors
