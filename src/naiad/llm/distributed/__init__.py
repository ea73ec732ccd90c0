"""Tensor and pipeline parallelism: process groups, worker processes and Ray actors, multi-node
agents, and the steps rank 0 sends the other ranks.
"""
