/*
 * How the CPU kernels (the linears, paged decode attention, a prompt's rotary and gating) run their
 * jobs in parallel: on the OpenMP threads torch itself uses.
 *
 * A decode step of a 30-layer model makes some 150 kernel calls of 10-100 us each, between torch
 * operations that run on torch's OpenMP threads. Threads of our own cost either a wake-up per
 * call (a futex wake and a reschedule: 20-60 us on a virtual machine, as much as the call's
 * work) or, if they spin between calls to avoid it, the cores that torch's threads then wait
 * for: measured on 2 cores, 120 linear calls at 64 rows with a small torch operation between
 * each took 111 ms with sleeping workers, 461 ms with workers spinning for 200 us, 57-59 ms
 * with no torch operation at all. One runtime for both avoids the fight: the library is built
 * with -fopenmp and its libgomp.so.1 is the one torch already loaded (the loader matches it by
 * its soname), so these jobs run on torch's warm team, which spins between regions as torch's
 * own operations do. A compiler without OpenMP builds the library without it (__init__.py): the
 * jobs then run one after the other on the calling thread.
 */
#include "thread_pool.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void pool_run(job_fn fn, void *jobs, size_t job_size, int n) {
    char *base = (char *)jobs;
#ifdef _OPENMP
    if (n > 1) {
#pragma omp parallel num_threads(n)
        {
            /* The team may be smaller than asked (nested in a parallel region, or a thread
             * limit): each thread then takes every team-size-th job. */
            const int team = omp_get_num_threads();
            for (int t = omp_get_thread_num(); t < n; t += team) fn(base + (size_t)t * job_size);
        }
        return;
    }
#endif
    for (int t = 0; t < n; t++) fn(base + (size_t)t * job_size); /* built without OpenMP: one thread */
}

int pool_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void tiles_split(tile_run_t *runs, int n, int64_t count) {
    for (int t = 0; t < n; t++)
        runs[t].next_end = ((uint64_t)(count * t / n) << 32) | (uint64_t)(count * (t + 1) / n);
}

/* Takes the run's first tile (own) or its last (another's); -1 when the run is empty. */
static int64_t take(tile_run_t *run, int own) {
    uint64_t seen = __atomic_load_n(&run->next_end, __ATOMIC_RELAXED);
    for (;;) {
        const uint64_t next = seen >> 32, end = seen & 0xffffffffu;
        if (next >= end) return -1;
        const uint64_t wanted = own ? ((next + 1) << 32) | end : (next << 32) | (end - 1);
        if (__atomic_compare_exchange_n(&run->next_end, &seen, wanted, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return (int64_t)(own ? next : end - 1);
    }
}

int64_t tiles_next(tile_run_t *runs, int n, int me) {
    int64_t tile = take(&runs[me], 1);
    for (int k = 1; tile < 0 && k < n; k++) tile = take(&runs[(me + k) % n], 0);
    return tile;
}
