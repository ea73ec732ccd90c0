"""The serving core: what every frontend calls, and who owns which state.

- `server.InferenceServer`: the one data-plane object; owns nothing mutable of its own beyond
  the shared-memory registry and the response cache it was given.
- `router.Router`: the hot path's model table (routes, version labels, `acquire`); sole owner
  of the routing lock, fed immutable `Serving` snapshots.
- `lifecycle.ModelManager`: the load / reload / unload state machine, ensemble dependencies,
  polling and the index; publishes to the Router and never sits on the request path.
- `model.LoadedVersion`: one loaded version's instances, scheduler and in-flight count.
- `worker.InstanceWorker` and `delivery.Responder`: the core's side of the instance contract
  (jobs in, a batch out; results back as responses, statistics recorded before delivery).
"""
