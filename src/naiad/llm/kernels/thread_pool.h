/* How naiad's CPU kernels run their jobs in parallel (thread_pool.c). */
#ifndef NAIAD_KERNELS_THREAD_POOL_H
#define NAIAD_KERNELS_THREAD_POOL_H

#include <stddef.h>

typedef void *(*job_fn)(void *);

/* Run fn(jobs + t * job_size) for t < n, in parallel on torch's OpenMP threads (the calling
 * thread among them); returns when every job is done. */
void pool_run(job_fn fn, void *jobs, size_t job_size, int n);

/* How many threads pool_run can use here: torch's OpenMP thread count (1 without OpenMP). */
int pool_threads(void);

#endif
