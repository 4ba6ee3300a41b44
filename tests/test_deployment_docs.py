"""The Kubernetes manifests in docs/kubernetes/ are valid for Kubernetes (kubernetes-validate:
the API's own schemas, strict, so a misspelt field fails), their Spark settings are Spark's or
sparkwal's documented ones, and the app they run compiles. They cannot run here (no cluster)."""

from __future__ import annotations

import glob
import os
import py_compile
import re

import kubernetes_validate
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFESTS = sorted(glob.glob(os.path.join(ROOT, "docs", "kubernetes", "*.yaml")))
KUBERNETES = "1.31"


def documents():
    for path in MANIFESTS:
        with open(path) as f:
            for i, doc in enumerate(yaml.safe_load_all(f)):
                if doc:
                    yield pytest.param(doc, id=f"{os.path.basename(path)}:{i}:{doc['kind']}")


def test_there_are_manifests():
    assert MANIFESTS and len(list(documents())) >= 7


@pytest.mark.parametrize("doc", list(documents()))
def test_each_manifest_is_valid_kubernetes(doc):
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_a_misspelt_field_would_fail():
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"clusterIp": "None"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def test_the_spark_settings_are_known_and_the_app_compiles():
    (conf_map,) = [d for d in (p.values[0] for p in documents()) if d["kind"] == "ConfigMap"]
    keys = [line.split()[0] for line in conf_map["data"]["spark-defaults.conf"].splitlines() if line.strip()]
    docs = "".join(open(p).read() for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for key in keys:
        assert re.fullmatch(r"spark\.[A-Za-z0-9._]+", key), key
        if key.startswith("spark.sparkwal."):
            assert key in docs, f"{key} is not documented"
    (stateful,) = [d for d in (p.values[0] for p in documents()) if d["kind"] == "StatefulSet"]
    assert stateful["spec"]["replicas"] == 2  # an active driver and its standby
    py_compile.compile(os.path.join(ROOT, "docs", "kubernetes", "app.py"), doraise=True)
