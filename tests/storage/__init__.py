"""Checkpoints on remote storage (HDFS, S3) and storage outages."""
