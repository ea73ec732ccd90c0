"""Schedulers: which requests execute together and on which instance (Triton's default
scheduler, dynamic batcher, sequence batcher, ensembles).

Each scheduler owns its queues, its instances' busy state and its pending timers behind its own
locks (`base.PumpedScheduler`); nothing outside reads them. The contract with the core is
`base.Worker` (one instance, non-blocking `run`), and `base.PullingWorker` for instances with a
thread of their own, which take their next batch themselves when idle (the default scheduler's
shared queue, the dynamic batcher's late-bound batches); `timers.Timers` wakes schedulers at
deadlines (on the server's event loop, or on a thread of its own without one);
`rate_limiter.RateLimiter` owns the resource counts instances share.
"""
