"""The driver asks the JVM for a class by name once: PySpark names classes through ``sc._jvm``
for every RDD it builds, and each lookup was a Py4J round trip (issue 44: fewer per batch)."""

from __future__ import annotations

from sparkwal.engine.jvm_view import CachedJVMView, cache_class_lookups


def _sent_while(sc, action) -> list[str]:
    client = sc._jvm._gateway_client
    sent: list[str] = []
    original = client.send_command

    def recording(command, *args, **kwargs):
        sent.append(command)
        return original(command, *args, **kwargs)

    client.send_command = recording
    try:
        action()
    finally:
        del client.send_command
    return sent


def test_class_and_static_method_lookups_are_asked_once_and_still_answer(spark_context):
    assert cache_class_lookups(spark_context) and cache_class_lookups(spark_context)  # once: same view
    view = spark_context._jvm
    assert isinstance(view, CachedJVMView)

    def buffer_size() -> int:
        return spark_context._jvm.PythonUtils.getSparkBufferSize(spark_context._jsc)

    first = buffer_size()
    sent = _sent_while(spark_context, lambda: [buffer_size() for _ in range(3)])
    # Py4J releases JVM references as Python collects them, whatever test made them: not lookups
    sent = [c for c in sent if not c.startswith("m\nd\n")]
    assert len(sent) == 3 and not any(c.startswith("r\n") for c in sent), sent  # the calls alone
    assert buffer_size() == first > 0
    # other classes by name and through their packages answer as before
    system = getattr(spark_context._jvm, "java.lang.System")
    assert system.currentTimeMillis() > 0 and spark_context._jvm.java.util.ArrayList().size() == 0
    assert spark_context._jvm is view
