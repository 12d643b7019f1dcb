"""Servers the tests start on 127.0.0.1 for a session: PostgreSQL, Kafka, HDFS, S3, a Spark
standalone cluster (tests/conftest.py's fixtures)."""
