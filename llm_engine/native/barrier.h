// The decode step's barrier: the team's threads spin on a shared counter for up to kSpinUs before they sleep,
// where libgomp's `omp barrier` (its spin throttled once the process holds more OpenMP threads than cores)
// sleeps in the kernel almost at once and is woken by a system call. Measured on the 2-core EPYC, futex
// wait and wake were ~19 % of an embedded-model step (a layer has five barriers, a step ~150); spinning
// first halved the step. A waiter still sleeps (futex) once the spin runs out: a descheduled peer on a
// busy machine, or a team larger than the machine.
#pragma once
#include <atomic>
#include <chrono>
#include <climits>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <sched.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace team {

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

class Barrier {
   public:
    // Every thread of the team, before its first wait(): the team's size (the same value from every thread).
    void join(int threads) { size_.store(threads, std::memory_order_relaxed); }

    // Returns once every thread of the team has called it; what each wrote before is visible to all after.
    void wait() {
        const int n = size_.load(std::memory_order_relaxed);
        if (n <= 1) return;
        const unsigned gen = gen_.load(std::memory_order_acquire);
        if (count_.fetch_add(1, std::memory_order_acq_rel) == n - 1) {  // the last to arrive opens it
            count_.store(0, std::memory_order_relaxed);
            gen_.store(gen + 1, std::memory_order_seq_cst);
            if (sleepers_.load(std::memory_order_seq_cst) > 0) wake();
            return;
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
        for (int spins = 1; gen_.load(std::memory_order_acquire) == gen; ++spins) {
            relax();
            if (spins % 64 == 0 && std::chrono::steady_clock::now() > until) {
                sleepers_.fetch_add(1, std::memory_order_seq_cst);
                while (gen_.load(std::memory_order_seq_cst) == gen) sleep(gen);
                sleepers_.fetch_sub(1, std::memory_order_relaxed);
                return;
            }
        }
    }

   private:
    static constexpr int kSpinUs = 200;

    // Until gen_ moves past `gen` (or a spurious wake-up: the caller checks again).
    void sleep(unsigned gen) {
#if defined(__linux__)
        syscall(SYS_futex, reinterpret_cast<unsigned*>(&gen_), FUTEX_WAIT_PRIVATE, gen, nullptr, nullptr, 0);
#else
        sched_yield();
#endif
    }
    void wake() {
#if defined(__linux__)
        syscall(SYS_futex, reinterpret_cast<unsigned*>(&gen_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#endif
    }

    alignas(64) std::atomic<int> count_{0};
    alignas(64) std::atomic<unsigned> gen_{0};
    std::atomic<int> sleepers_{0};
    alignas(64) std::atomic<int> size_{1};
};

static_assert(sizeof(std::atomic<unsigned>) == sizeof(unsigned), "the futex word is the generation itself");

}  // namespace team
