"""What the real Triton 2.51.0 binary answered on these machines (bench/setup_peers.sh), for the
tests that hold naiad to it."""

#: `GET /v2` and gRPC ServerMetadata `extensions`, in Triton's order: tritonserver 2.51.0 (the
#: nvidia-pytriton 0.7.0 build, on a machine without GPUs), empty repository, checked 2026-12-03.
SERVER_EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]
