"""Fewer round trips to the JVM per batch: the driver's class lookups through ``sc._jvm`` kept.

PySpark names JVM classes through ``sc._jvm`` (``sc._jvm.PythonRDD``, ``sc._jvm.PythonUtils``, ...)
several times for every RDD it builds, and Py4J's ``JVMView`` asks the JVM again each time
(py4j/java_gateway.py, ``JVMView.__getattr__`` and ``JavaClass.__getattr__``: one reflection
command per lookup, no cache).
A batch's RDDs took about 35 Py4J calls on the generator's thread here, 7 of them such lookups;
on two busy cores each is a wait for a JVM thread. A class is the same class for the JVM's
lifetime, so the view below answers a name it has seen from memory, and so do the classes it
hands out for their static methods. It is the same view otherwise
(its JVM id, imports and gateway), set on the streaming context's SparkContext only.
"""

from __future__ import annotations

import logging

from py4j.java_gateway import JavaClass, JavaMember, JavaPackage, JVMView

log = logging.getLogger(__name__)


class CachedJavaClass(JavaClass):
    """A ``JavaClass`` remembering its static methods and inner classes (a static field's value is
    asked for each time: it may change)."""

    def __init__(self, fqn: str, gateway_client):
        super().__init__(fqn, gateway_client)
        self._members: dict[str, JavaMember | JavaClass] = {}

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_members":
            raise AttributeError(name)
        found = self._members.get(name)
        if found is None:
            found = super().__getattr__(name)
            if isinstance(found, (JavaMember, JavaClass)):
                self._members[name] = found
        return found


class CachedJVMView(JVMView):
    """A ``JVMView`` remembering the classes and packages it found by name."""

    def __init__(self, view: JVMView):  # noqa: D107 (the same view: its state copied, not re-made)
        self.__dict__.update(view.__dict__)
        self._found: dict[str, JavaClass | JavaPackage] = {}

    def __getattr__(self, name: str):  # only for names not in the view's own attributes
        if name.startswith("__") or name == "_found":
            raise AttributeError(name)
        found = self._found.get(name)
        if found is None:
            found = super().__getattr__(name)
            if type(found) is JavaClass:
                found = CachedJavaClass(found._fqn, found._gateway_client)
            if isinstance(found, (JavaClass, JavaPackage)):
                self._found[name] = found
        return found


def cache_class_lookups(sc) -> bool:
    """Give ``sc`` a :class:`CachedJVMView` (once); False when its view is not Py4J's ``JVMView``
    (said once in the log: every lookup then asks the JVM, as PySpark does)."""
    view = getattr(sc, "_jvm", None)
    if isinstance(view, CachedJVMView):
        return True
    if type(view) is not JVMView:
        log.info("Spark's JVM view is a %s, not Py4J's JVMView: class lookups are not cached",
                 type(view).__name__)
        return False
    sc._jvm = CachedJVMView(view)
    return True
