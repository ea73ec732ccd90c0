/* How naiad's CPU kernels run their jobs in parallel (thread_pool.c). */
#ifndef NAIAD_KERNELS_THREAD_POOL_H
#define NAIAD_KERNELS_THREAD_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef void *(*job_fn)(void *);

/* Run fn(jobs + t * job_size) for t < n, in parallel on torch's OpenMP threads (the calling
 * thread among them); returns when every job is done. */
void pool_run(job_fn fn, void *jobs, size_t job_size, int n);

/* How many threads pool_run can use here: torch's OpenMP thread count (1 without OpenMP). */
int pool_threads(void);

/* Tiles of work [0, count) shared by n jobs: job t starts on its own contiguous run of tiles (one
 * stream through memory, as a static split gives) and, once that is done, takes tiles one at a
 * time from the ends of the other jobs' runs, so that a thread the system holds up (another
 * process on its core) delays the call by about one tile instead of a whole share. Each run on a
 * cache line of its own. */
typedef struct {
    _Alignas(64) uint64_t next_end; /* (next tile << 32) | end of the run, changed atomically */
} tile_run_t;

/* Splits [0, count) into n contiguous runs (count < 2^32). */
void tiles_split(tile_run_t *runs, int n, int64_t count);

/* The next tile job `me` computes: its own run's next, else the last of another's; -1 when none is left. */
int64_t tiles_next(tile_run_t *runs, int n, int me);

#endif
