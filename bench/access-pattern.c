// One thread's read rate for the avx2 Q4_0 decode's access pattern, against a plain
// sequential read: is the memory, the prefetch scheme or the page size what caps decode?
//
//   gcc -O2 -mavx2 -o /tmp/access-pattern bench/access-pattern.c
//   /tmp/access-pattern [WORK=3] [HUGE=1]
//
// A 2 GiB buffer (advised MADV_HUGEPAGE, or MADV_NOHUGEPAGE with HUGE=0) is read in groups
// of 8 rows of 2304 bytes (a 4096-column Q4_0 row), 32 bytes of each row per step, as
// `avx2_rows` reads its 8-row groups. WORK dependent `vpmaddubsw` + `vpmaddwd` per load
// stand in for the kernel's arithmetic (WORK=3 runs ~22 GB/s cache-resident on the Intel
// host of docs/BENCHMARKS.md session 41, about the real kernel's speed). Patterns: `seq`
// (one stream, as `hearth bench --membw`), the rows without prefetch, and with the group
// AHEAD groups on prefetched (`prefetcht1` into L2, or `prefetcht0`) in equal pieces per
// step, as `prefetch_group_step` does. Prints GB/s per pass and the best of 4 passes.
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define ROW 2304
#define GROUP (8 * ROW)
#define STEPS (ROW / 32)
#define PF_STEP (GROUP / STEPS) /* bytes of a later group prefetched per step */

static int work = 3;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static __m256i seq(const char *p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 128) {
    a = _mm256_add_epi64(a, _mm256_loadu_si256((const void *)(p + i)));
    b = _mm256_add_epi64(b, _mm256_loadu_si256((const void *)(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_loadu_si256((const void *)(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_loadu_si256((const void *)(p + i + 96)));
  }
  return _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
}

/* hint: 0 none, 1 prefetcht1, 2 prefetcht0; ahead: groups */
static __m256i rows(const char *p, size_t n, int hint, int ahead) {
  const __m256i one = _mm256_set1_epi16(1), k = _mm256_set1_epi8(3);
  __m256i acc[8];
  for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_si256();
  for (size_t g = 0; g + GROUP <= n; g += GROUP) {
    const char *q = p + g, *next = q + (size_t)ahead * GROUP;
    int pf = hint && g + (size_t)(ahead + 1) * GROUP <= n;
    for (int b = 0; b < STEPS; b++) {
      if (pf)
        for (int l = 0; l < PF_STEP; l += 64) {
          if (hint == 1) _mm_prefetch(next + b * PF_STEP + l, _MM_HINT_T1);
          else _mm_prefetch(next + b * PF_STEP + l, _MM_HINT_T0);
        }
      for (int r = 0; r < 8; r++) {
        __m256i v = _mm256_loadu_si256((const void *)(q + r * ROW + b * 32));
        for (int w = 0; w < work; w++) v = _mm256_madd_epi16(_mm256_maddubs_epi16(v, k), one);
        acc[r] = _mm256_add_epi64(acc[r], v);
      }
    }
  }
  for (int r = 1; r < 8; r++) acc[0] = _mm256_add_epi64(acc[0], acc[r]);
  return acc[0];
}

int main(int argc, char **argv) {
  work = argc > 1 ? atoi(argv[1]) : 3;
  int huge = argc > 2 ? atoi(argv[2]) : 1;
  size_t n = ((size_t)2 << 30) / GROUP * GROUP;
  char *p = aligned_alloc(2 << 20, ((size_t)2 << 30) + (2 << 20));
  if (!p) return 1;
  madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  memset(p, 1, n);
  volatile long long sink = 0;

  /* The arithmetic alone: 64 groups (1.1 MiB) stay in L2. */
  double l2 = 0;
  for (int i = 0; i < 200; i++) {
    double t = now();
    __m256i s = rows(p, (size_t)64 * GROUP, 0, 0);
    t = now() - t;
    sink += _mm256_extract_epi64(s, 0);
    if ((64.0 * GROUP) / t / 1e9 > l2) l2 = (64.0 * GROUP) / t / 1e9;
  }
  printf("BEST cache-resident %.1f GB/s\n", l2);

  const char *names[] = {"seq", "rows-nopf", "rows-pfT1-a1", "rows-pfT1-a2", "rows-pfT1-a4", "rows-pfT0-a2"};
  const int hint[] = {0, 0, 1, 1, 1, 2}, ahead[] = {0, 0, 1, 2, 4, 2};
  double best[6] = {0};
  for (int pass = 0; pass < 4; pass++)
    for (int m = 0; m < 6; m++) {
      double t = now();
      __m256i s = m == 0 ? seq(p, n) : rows(p, n, hint[m], ahead[m]);
      t = now() - t;
      sink += _mm256_extract_epi64(s, 0);
      printf("%s %.1f\n", names[m], n / t / 1e9);
      if (n / t / 1e9 > best[m]) best[m] = n / t / 1e9;
    }
  for (int m = 0; m < 6; m++) printf("BEST %s %.1f GB/s\n", names[m], best[m]);
  free(p);
  return 0;
}
