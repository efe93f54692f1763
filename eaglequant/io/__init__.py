"""Checkpoint files, torch-free: safetensors headers, folder reading, shard planning and writing.

Also the read-back that checks written bytes, and atomic output folders.
"""
