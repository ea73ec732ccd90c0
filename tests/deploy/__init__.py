"""Deployment tests: the Helm chart, the KServe manifests and the storage-initializer path."""
