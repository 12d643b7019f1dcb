"""What the tests share: the streaming harness, the state API's and the supervisor's helpers,
remote storage settings, the test servers (``servers``), the driver scripts tests run as their
own processes (``drivers``) and the Java sources tests compile (``jvm``)."""
