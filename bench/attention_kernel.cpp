// The decode attention kernel alone (llm_engine/native/attention.h): ns per cached position for a float16 and an
// int8 cache, G = 3 query heads per kv head, head_dim 64 (SmolLM2's shape), random rows; `heads` distinct rows
// (90: one SmolLM2 step's worth, out of cache) or 1 (in cache). Build and run (docs/benchmarks.md):
//   g++ -O3 -fopenmp -std=c++17 -fno-math-errno -march=native -Illm_engine/native bench/attention_kernel.cpp -o /tmp/ak
//   /tmp/ak 2000 1 1 300; /tmp/ak 2000 90 1 20      # positions, heads, threads, repetitions (best of)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <omp.h>
#include "attention.h"
using half = vec16::half;
constexpr int D = 64, G = 3;
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2000;
  int heads = argc > 2 ? atoi(argv[2]) : 90;  // layers*kv heads (distinct memory)
  int threads = argc > 3 ? atoi(argv[3]) : 1;
  int reps = argc > 4 ? atoi(argv[4]) : 20;
  std::mt19937 rng(1); std::normal_distribution<float> N(0, 1);
  size_t tot = (size_t)heads * n * D;
  std::vector<half> kh(tot), vh(tot); std::vector<int8_t> ki(tot), vi(tot);
  std::vector<float> ks((size_t)heads * n), vs((size_t)heads * n);
  for (size_t i = 0; i < tot; ++i) { float a = N(rng), b = N(rng); kh[i] = (half)a; vh[i] = (half)b; ki[i] = (int8_t)std::max(-127.f, std::min(127.f, a * 40)); vi[i] = (int8_t)std::max(-127.f, std::min(127.f, b * 40)); }
  for (auto& s : ks) s = 0.025f; for (auto& s : vs) s = 0.025f;
  std::vector<float> q(G * D); for (auto& x : q) x = N(rng);
  std::vector<half> ownh(2 * D); std::vector<int8_t> owni(2 * D);
  for (int kind = 0; kind < 2; ++kind)
  for (int round = 0; round < 2; ++round) {
    double best = 1e30; float chk = 0;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+:chk)
      {
        int me = omp_get_thread_num(), nt = omp_get_num_threads();
        std::vector<float> scores(G * n + 64), out(G * (D + 2));
        int a = (int)((int64_t)n * me / nt), b = (int)((int64_t)n * (me + 1) / nt);
        for (int h = 0; h < heads; ++h) {
          size_t base = (size_t)h * n * D;
          if (kind == 0) {
            attention::Scales sc;
            attention::partial<half>(q.data(), G, D, kh.data() + base, vh.data() + base, n - 1, ownh.data(), ownh.data() + D, sc, a, b, scores.data(), out.data());
          } else {
            attention::Scales sc{ks.data() + (size_t)h * n, vs.data() + (size_t)h * n, 0.025f, 0.025f};
            attention::partial<int8_t>(q.data(), G, D, ki.data() + base, vi.data() + base, n - 1, owni.data(), owni.data() + D, sc, a, b, scores.data(), out.data());
          }
          chk += out[0] / out[D + 1];
#pragma omp barrier
        }
      }
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, dt);
    }
    printf("%s threads %d heads %d n %d: %.2f ns/position/thread-share  step-attention %.3f ms  (chk %g)\n", kind ? "int8" : "half", threads, heads, n,
           best * 1e9 / heads / (n / (double)threads), best * 1e3, chk);
  }
}
