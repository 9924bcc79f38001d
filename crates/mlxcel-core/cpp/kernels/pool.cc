#include "mlxcel-core/cpp/kernels/pool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MLXCEL_PAUSE() _mm_pause()
#else
#define MLXCEL_PAUSE() std::this_thread::yield()
#endif

namespace mlxcel::kernels {
namespace {

// How long an idle worker spins before sleeping. Long enough to bridge the gaps between the
// matmuls of one forward step (other ops run in between), short enough that an idle server
// does not burn a core.
constexpr auto kSpin = std::chrono::microseconds(2000);
// The first part of the spin, with `pause` only.
constexpr auto kPauseSpin = std::chrono::microseconds(50);

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      publish(kStop);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void run(int threads, int tasks, const std::function<void(int)>& body) {
    // One kernel at a time: MLX runs a stream's tasks on one thread, and the lock makes a
    // second caller (another stream) wait rather than corrupt the job.
    std::lock_guard<std::mutex> serial(run_mutex_);
    const int helpers = std::min(threads, tasks) - 1;
    if (helpers <= 0) {
      for (int t = 0; t < tasks; ++t) body(t);
      return;
    }
    grow(helpers);
    const uint64_t job = ++job_;
    body_.store(&body, std::memory_order_relaxed);
    tasks_.store(tasks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    next_.store(job << 32, std::memory_order_release);
    publish(static_cast<uint64_t>(helpers));  // seq_cst: pairs with sleepers_ below
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    // The caller works too and waits only for tasks a helper has claimed: on a busy machine a
    // helper that is not scheduled in time simply finds no task left.
    work(job);
    while (done_.load(std::memory_order_acquire) != tasks) MLXCEL_PAUSE();
    // Closed before the next job's fields are written, so that a late helper's claim fails.
    next_.store((job << 32) | kClosed, std::memory_order_release);
  }

 private:
  // The job word: a generation count above, and the number of workers the job wants in the low
  // 16 bits, read together so that a worker can never pair one job's generation with another's
  // helper count.
  static constexpr uint64_t kHelperBits = 16;
  static constexpr uint64_t kStop = (1u << kHelperBits) - 1;
  static constexpr uint64_t kClosed = 0xFFFFFFFFu;

  void publish(uint64_t helpers) {
    const uint64_t gen = (state_.load() >> kHelperBits) + 1;
    state_.store((gen << kHelperBits) | helpers);
  }

  void grow(int helpers) {
    while (static_cast<int>(workers_.size()) < helpers) {
      const int index = static_cast<int>(workers_.size());
      // The worker starts from the job word as it is now, before the job that needs it is
      // published; reading it on the new thread could miss that job.
      const uint64_t seen = state_.load();
      workers_.emplace_back([this, index, seen] { loop(index, seen); });
    }
  }

  // Claims tasks of `job` one at a time (next_ holds the job id above and the next task below)
  // until none is left or the job is closed.
  void work(uint64_t job) {
    for (;;) {
      uint64_t v = next_.load(std::memory_order_acquire);
      if ((v >> 32) != (job & 0xFFFFFFFFu)) return;
      const uint64_t task = v & 0xFFFFFFFFu;
      if (task >= static_cast<uint64_t>(tasks_.load(std::memory_order_relaxed))) return;
      if (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;
      // Claimed: the job cannot finish (and body_ cannot change) before this task is done.
      (*body_.load(std::memory_order_relaxed))(static_cast<int>(task));
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void loop(int index, uint64_t seen) {
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      uint64_t now = state_.load(std::memory_order_acquire);
      int spins = 0;
      bool yielding = false;
      while (now == seen) {
        // Pause-spin briefly, then yield between checks so that a spinning worker gives its
        // core to any other runnable thread (MLX's own, or another process's).
        if (yielding) {
          std::this_thread::yield();
        } else {
          MLXCEL_PAUSE();
        }
        if (++spins == 64) {
          spins = 0;
          const auto waited = std::chrono::steady_clock::now() - start;
          if (waited > kSpin) break;
          yielding = waited > kPauseSpin;
        }
        now = state_.load(std::memory_order_acquire);
      }
      if (now == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);  // seq_cst: pairs with publish() in run()
        wake_.wait(lock, [&] { return state_.load() != seen; });
        sleepers_.fetch_sub(1);
        now = state_.load();
      }
      seen = now;
      const uint64_t helpers = seen & kStop;
      if (helpers == kStop) return;
      if (static_cast<uint64_t>(index) < helpers) work(job_of(next_.load(std::memory_order_acquire)));
    }
  }

  static uint64_t job_of(uint64_t next) { return next >> 32; }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<uint64_t> next_{kClosed};
  std::atomic<int> done_{0};
  std::atomic<int> tasks_{0};
  std::atomic<const std::function<void(int)>*> body_{nullptr};
  uint64_t job_ = 0;
};

Pool& pool() {
  // Leaked on purpose: joining workers from a static destructor at exit can deadlock with
  // MLX's own teardown, and the OS reclaims the threads anyway.
  static Pool* p = new Pool();
  return *p;
}

}  // namespace

void parallel_for(int threads, int tasks, const std::function<void(int task)>& body) {
  if (tasks <= 0) return;
  pool().run(threads, tasks, body);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace mlxcel::kernels
