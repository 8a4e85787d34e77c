"""The fake Kubernetes API server itself (tests/flows/fake_k8s_api.py): RBAC, admission,
garbage collection and schema validation answer as a real API server does."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import pytest

from flows.launchers import KubernetesSettings
from flows.launchers.manifests import build_config_map, build_job_manifest, build_rayjob_manifest
from llmrl.topology import Topology
from tests.flows.fake_k8s_api import FakeKubernetes
from tests.flows.fake_k8s_scenario import mounted_claim_path, owner_of
from tests.flows.rbac import (
    LAUNCHER_USER,
    Attributes,
    Permission,
    allows,
    manifest_role_rules,
    request_attributes,
    without,
)
from tests.support.crd_schema import missing_crds

NS = "llmrl"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
RAYJOBS = f"/apis/ray.io/v1/namespaces/{NS}/rayjobs"
SETTINGS = KubernetesSettings(namespace=NS, image="llmrl:test")
needs_crds = pytest.mark.skipif(
    bool(missing_crds(("1.4.2", "1.7.0"))), reason=missing_crds(("1.4.2", "1.7.0")) or ""
)


def call(
    fake: FakeKubernetes,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any, http.client.HTTPMessage]:
    """One raw request: (status, parsed JSON body, headers)."""
    host, port = fake.host.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": content_type} if data is not None else {}
    connection.request(method, path, body=data, headers=headers)
    response = connection.getresponse()
    text = response.read()
    connection.close()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text.decode()
    return response.status, parsed, response.headers


def config_map(name: str = "cm", owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = build_config_map(name, NS, "sft", "steps: 2\n")
    if owners is not None:
        body["metadata"]["ownerReferences"] = owners
    return body


def owner_ref(obj: dict[str, Any], block: bool = False) -> dict[str, Any]:
    return owner_of(obj, controller=False, block=block)


# ------------------------------------------------------------------------ RBAC mapping


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        ("GET", f"{CONFIGMAPS}/cm", ("", "configmaps", "", "get", "cm")),
        ("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=a%3Db", ("", "pods", "", "list", "")),
        ("GET", f"{JOBS}?watch=true", ("batch", "jobs", "", "watch", "")),
        ("GET", f"{JOBS}?watch=1", ("batch", "jobs", "", "watch", "")),
        ("GET", f"{JOBS}?watch=false", ("batch", "jobs", "", "list", "")),
        (
            "GET",
            f"{RAYJOBS}?watch=True&fieldSelector=metadata.name%3Dr1",
            ("ray.io", "rayjobs", "", "watch", "r1"),
        ),
        (
            "GET",
            f"/api/v1/namespaces/{NS}/pods/p1/log?follow=true",
            ("", "pods", "log", "get", "p1"),
        ),
        ("POST", CONFIGMAPS, ("", "configmaps", "", "create", "")),
        ("PATCH", f"{CONFIGMAPS}/cm", ("", "configmaps", "", "patch", "cm")),
        ("PUT", f"{JOBS}/j1", ("batch", "jobs", "", "update", "j1")),
        ("PUT", f"{JOBS}/j1/status", ("batch", "jobs", "status", "update", "j1")),
        ("DELETE", f"{RAYJOBS}/r1", ("ray.io", "rayjobs", "", "delete", "r1")),
        (
            "DELETE",
            f"{CONFIGMAPS}?labelSelector=a%3Db",
            ("", "configmaps", "", "deletecollection", ""),
        ),
        ("GET", f"/api/v1/namespaces/{NS}", ("", "namespaces", "", "get", NS)),
        ("GET", "/api/v1/pods?watch=true", ("", "pods", "", "watch", "")),
    ],
)
def test_requests_map_to_what_the_authorizer_sees(method, url, expected) -> None:
    attributes = request_attributes(method, url)
    assert attributes is not None
    group, resource, subresource, verb, name = expected
    assert attributes.permission == Permission(group, resource, subresource, verb)
    assert attributes.name == name
    assert attributes.namespace == ("" if url.startswith("/api/v1/pods") else NS)
    assert request_attributes("GET", f"/api/v1/namespaces/{NS}/status").subresource == "status"
    assert request_attributes("GET", "/version") is None


def test_rules_match_as_rbac_does() -> None:
    def attrs(verb: str, resource: str, sub: str = "", name: str = "x") -> Attributes:
        return Attributes(verb, "", "v1", resource, sub, NS, name)

    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["a"]},
        {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]},
    ]
    assert allows(rules, attrs("get", "pods"))
    assert not allows(rules, attrs("get", "pods", "log"))  # a subresource is its own resource
    assert not allows(rules, attrs("list", "pods"))
    assert allows(rules, attrs("get", "secrets", name="a"))
    assert not allows(rules, attrs("get", "secrets", name="b"))
    assert allows(rules, attrs("patch", "jobs", "status"))
    assert not allows([], attrs("get", "pods"))


def test_an_ungranted_request_gets_the_api_servers_403() -> None:
    with FakeKubernetes(rules=without(manifest_role_rules(), "configmaps")) as fake:
        code, status, _ = call(fake, "POST", CONFIGMAPS, config_map())
        allowed, _, _ = call(fake, "GET", f"/api/v1/namespaces/{NS}/pods")
    assert code == 403 and allowed == 200
    assert status["kind"] == "Status" and status["apiVersion"] == "v1"
    assert (status["status"], status["reason"], status["code"]) == ("Failure", "Forbidden", 403)
    assert status["message"] == (
        'configmaps is forbidden: User "system:serviceaccount:llmrl:llmrl-launcher" cannot '
        'create resource "configmaps" in API group "" in the namespace "llmrl"'
    )
    assert status["details"] == {"kind": "configmaps"}
    (denied,) = fake.denied
    assert denied.permission == Permission("", "configmaps", "", "create")
    assert fake.permissions_used() == {denied.permission, Permission("", "pods", "", "list")}


def test_a_named_403_names_the_object_and_the_group() -> None:
    with FakeKubernetes(rules=[], user="system:serviceaccount:llmrl:other") as fake:
        code, status, _ = call(fake, "GET", f"/api/v1/namespaces/{NS}/pods/p1/log")
        _, job_status, _ = call(fake, "DELETE", f"{JOBS}/j1")
    assert code == 403
    assert status["message"] == (
        'pods "p1" is forbidden: User "system:serviceaccount:llmrl:other" cannot get resource '
        '"pods/log" in API group "" in the namespace "llmrl"'
    )
    assert job_status["message"].startswith('jobs.batch "j1" is forbidden: User ')
    assert 'cannot delete resource "jobs" in API group "batch"' in job_status["message"]


# ------------------------------------------------------------------------ admission


def test_block_owner_deletion_needs_update_on_the_owners_finalizers() -> None:
    rules = manifest_role_rules()
    with FakeKubernetes(rules=rules) as fake:
        owner = fake.seed("jobs", NS, {"metadata": {"name": "flow-run-1"}, "spec": {}})
        code, status, _ = call(fake, "POST", CONFIGMAPS, config_map("a", [owner_ref(owner, True)]))
        plain, _, _ = call(fake, "POST", CONFIGMAPS, config_map("b", [owner_ref(owner, False)]))
    assert (code, plain) == (403, 201)
    assert status["message"].startswith(
        'configmaps "a" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers '
        "to a resource you can't set finalizers on: User "
        f'"{LAUNCHER_USER}" cannot update resource "jobs/finalizers" in API group "batch" in the '
        'namespace "llmrl"'
    )
    finalizers = {"apiGroups": ["batch"], "resources": ["jobs/finalizers"], "verbs": ["update"]}
    with FakeKubernetes(rules=[*rules, finalizers]) as fake:
        owner = fake.seed("jobs", NS, {"metadata": {"name": "flow-run-1"}, "spec": {}})
        code, _, _ = call(fake, "POST", CONFIGMAPS, config_map("a", [owner_ref(owner, True)]))
    assert code == 201


def test_changing_an_objects_owners_needs_delete_on_it() -> None:
    no_delete = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}]
    with FakeKubernetes(rules=no_delete) as fake:
        owner = fake.seed("jobs", NS, {"metadata": {"name": "j"}, "spec": {}})
        call(fake, "POST", CONFIGMAPS, config_map("a"))
        relabel = {"metadata": {"labels": {"x": "y"}}}
        relabelled, _, _ = call(
            fake, "PATCH", f"{CONFIGMAPS}/a", relabel, "application/strategic-merge-patch+json"
        )
        adopt = {"metadata": {"ownerReferences": [owner_ref(owner)]}}
        code, status, _ = call(
            fake, "PATCH", f"{CONFIGMAPS}/a", adopt, "application/strategic-merge-patch+json"
        )
    assert (relabelled, code) == (200, 403)
    assert "cannot set an ownerRef on a resource you can't delete" in status["message"]
    assert 'cannot delete resource "configmaps"' in status["message"]


# ------------------------------------------------------------------------ garbage collection


def _tree(fake: FakeKubernetes) -> dict[str, dict[str, Any]]:
    """A flow-run Job owning a RayJob owning a ConfigMap and a pod; an unrelated ConfigMap."""
    flow = fake.seed("jobs", NS, {"metadata": {"name": "flow-run"}, "spec": {}})
    rayjob = fake.seed(
        "rayjobs", NS, {"metadata": {"name": "rj", "ownerReferences": [owner_ref(flow)]}}
    )
    cm = fake.seed("configmaps", NS, config_map("rj", [owner_ref(rayjob)]))
    pod = fake.seed(
        "pods", NS, {"metadata": {"name": "rj-head", "ownerReferences": [owner_ref(rayjob)]}}
    )
    other = fake.seed("configmaps", NS, config_map("other"))
    return {"flow": flow, "rayjob": rayjob, "cm": cm, "pod": pod, "other": other}


def test_deleting_an_owner_deletes_its_dependents_recursively() -> None:
    with FakeKubernetes(rules=None) as fake:
        tree = _tree(fake)
        assert tree["flow"]["metadata"]["uid"]
        code, _, _ = call(fake, "DELETE", f"{JOBS}/flow-run?propagationPolicy=Background")
        assert code == 200
        assert fake.get("rayjobs", NS, "rj") is None
        assert fake.get("configmaps", NS, "rj") is None
        assert fake.get("pods", NS, "rj-head") is None
        assert fake.get("configmaps", NS, "other") is not None
        assert fake.deletes() == [f"{JOBS}/flow-run"]  # the rest was garbage collection


def test_a_dependent_with_another_live_owner_only_loses_the_reference() -> None:
    with FakeKubernetes(rules=None) as fake:
        tree = _tree(fake)
        shared = config_map("shared", [owner_ref(tree["rayjob"]), owner_ref(tree["other"])])
        fake.seed("configmaps", NS, shared)
        assert fake.delete_object("rayjobs", NS, "rj")
        kept = fake.get("configmaps", NS, "shared")
        assert kept is not None
        assert [o["name"] for o in kept["metadata"]["ownerReferences"]] == ["other"]
        assert fake.get("configmaps", NS, "rj") is None
        assert not fake.delete_object("rayjobs", NS, "rj")


def test_batch_v1_jobs_orphan_their_pods_unless_told_otherwise() -> None:
    with FakeKubernetes(rules=None) as fake:
        job = fake.seed("jobs", NS, {"metadata": {"name": "j"}, "spec": {}})
        fake.seed("pods", NS, {"metadata": {"name": "j-pod", "ownerReferences": [owner_ref(job)]}})
        code, _, headers = call(fake, "DELETE", f"{JOBS}/j")
        pod = fake.get("pods", NS, "j-pod")
    assert code == 200
    assert pod is not None and pod["metadata"]["ownerReferences"] == []
    assert "child pods are preserved by default" in headers["Warning"]


def test_an_object_whose_owners_are_all_gone_is_collected() -> None:
    ghost = {"apiVersion": "v1", "kind": "Pod", "name": "flow-run-pod", "uid": "no-such-uid"}
    with FakeKubernetes(rules=None) as fake:
        code, _, _ = call(fake, "POST", CONFIGMAPS, config_map("orphan", [ghost]))
        assert code == 201
        assert fake.get("configmaps", NS, "orphan") is None
    assert fake.collected == ["configmaps/orphan: no owner exists: Pod flow-run-pod (no-such-uid)"]


def test_a_watch_sends_added_modified_and_deleted() -> None:
    with FakeKubernetes(rules=None) as fake:
        fake.seed("configmaps", NS, config_map("w"))
        fake.seed("configmaps", NS, config_map("not-watched"))

        def change_then_delete() -> None:
            patch = {"metadata": {"labels": {"x": "1"}}}
            call(fake, "PATCH", f"{CONFIGMAPS}/w", patch, "application/merge-patch+json")
            # The fake reports the states it sees when it wakes, so a deletion right after the
            # patch could hide the MODIFIED event on a loaded machine: let the watch see it.
            time.sleep(0.3)
            fake.delete_object("configmaps", NS, "w")

        timer = threading.Timer(0.2, change_then_delete)
        timer.start()
        url = f"{CONFIGMAPS}?watch=true&timeoutSeconds=2&fieldSelector=metadata.name%3Dw"
        code, text, _ = call(fake, "GET", url)
        timer.join()
    events = [json.loads(line) for line in text.splitlines()]
    assert code == 200
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert {e["object"]["metadata"]["name"] for e in events} == {"w"}


# ------------------------------------------------------------------------ schema validation


def _rayjob(name: str = "llmrl-sft-0a1b2c") -> dict[str, Any]:
    return build_rayjob_manifest("sft", name, SETTINGS, Topology.local_default())


@needs_crds
def test_an_invalid_rayjob_is_refused_with_422_naming_the_field() -> None:
    rayjob = _rayjob()
    rayjob["spec"]["backoffLimit"] = "none"
    del rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    with FakeKubernetes("hang", rules=None) as fake:
        code, status, _ = call(fake, "POST", f"{RAYJOBS}?fieldValidation=Strict", rayjob)
    assert code == 422
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        'RayJob.ray.io "llmrl-sft-0a1b2c" is invalid: [spec.backoffLimit: Invalid value: '
        '"string": spec.backoffLimit in body must be of type integer: "string", '
        "spec.rayClusterSpec.headGroupSpec: Required value]"
    )
    assert [c["field"] for c in status["details"]["causes"]] == [
        "spec.backoffLimit",
        "spec.rayClusterSpec.headGroupSpec",
    ]
    assert fake.created == []


@needs_crds
def test_unknown_fields_are_refused_when_strict_and_pruned_otherwise() -> None:
    rayjob = _rayjob()
    rayjob["spec"]["foo"] = 1
    container = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    container["containers"][0]["bar"] = True
    with FakeKubernetes("hang", rules=None) as fake:
        code, status, _ = call(fake, "POST", f"{RAYJOBS}?fieldValidation=Strict", rayjob)
        warned, stored, headers = call(fake, "POST", RAYJOBS, rayjob)
    assert code == 400 and status["reason"] == "BadRequest"
    assert status["message"] == (
        'RayJob in version "v1" cannot be handled as a RayJob: strict decoding error: unknown '
        'field "spec.foo", unknown field '
        '"spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].bar"'
    )
    assert warned == 201
    assert "foo" not in stored["spec"]
    assert (
        "bar"
        not in stored["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][
            0
        ]
    )
    assert headers.get_all("Warning")[0] == '299 - "unknown field \\"spec.foo\\""'


@needs_crds
def test_the_kuberay_version_of_the_fake_decides_what_is_known() -> None:
    rayjob = _rayjob()
    rayjob["spec"]["deletionStrategy"] = {  # KubeRay >= 1.5
        "onSuccess": {"policy": "DeleteCluster"},
        "onFailure": {"policy": "DeleteCluster"},
    }
    with FakeKubernetes("hang", rules=None, kuberay_version="1.4.2") as fake:
        old, status, _ = call(fake, "POST", f"{RAYJOBS}?fieldValidation=Strict", rayjob)
    with FakeKubernetes("hang", rules=None, kuberay_version="1.7.0") as fake:
        new, _, _ = call(fake, "POST", f"{RAYJOBS}?fieldValidation=Strict", rayjob)
    assert (old, new) == (400, 201)
    assert 'unknown field "spec.deletionStrategy"' in status["message"]


def test_an_invalid_job_or_config_map_is_refused() -> None:
    job = build_job_manifest("eval", "llmrl-eval-0a1b2c", SETTINGS)
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    data = config_map("bad")
    data["data"] = {"sft.yaml": 3}
    extra = build_job_manifest("eval", "llmrl-eval-1a1b2c", SETTINGS)
    extra["spec"]["retries"] = 2
    with FakeKubernetes("hang", rules=None) as fake:
        code, status, _ = call(fake, "POST", f"{JOBS}?fieldValidation=Strict", job)
        cm_code, cm_status, _ = call(fake, "POST", CONFIGMAPS, data)
        strict, strict_status, _ = call(fake, "POST", f"{JOBS}?fieldValidation=Strict", extra)
    assert (code, cm_code, strict) == (422, 422, 400)
    assert status["message"].startswith(
        'Job.batch "llmrl-eval-0a1b2c" is invalid: '
        "spec.template.spec.containers[0].imagePullPolicy: Invalid value"
    )
    assert cm_status["message"].startswith('ConfigMap "bad" is invalid: data.sft.yaml:')
    assert strict_status["message"] == (
        'Job in version "v1" cannot be handled as a Job: strict decoding error: '
        'unknown field "spec.retries"'
    )


@needs_crds
def test_a_strategic_merge_patch_of_a_custom_resource_is_415() -> None:
    with FakeKubernetes("hang", rules=None) as fake:
        call(fake, "POST", RAYJOBS, _rayjob())
        patch = {"metadata": {"labels": {"a": "b"}}}
        code, status, _ = call(
            fake, "PATCH", f"{RAYJOBS}/llmrl-sft-0a1b2c", patch,
            "application/strategic-merge-patch+json",
        )  # fmt: skip
        merged, _, _ = call(
            fake, "PATCH", f"{RAYJOBS}/llmrl-sft-0a1b2c", patch, "application/merge-patch+json"
        )
    assert (code, merged) == (415, 200)
    assert status["reason"] == "UnsupportedMediaType"


def test_a_pod_writes_to_the_shared_claim_only_below_its_mount() -> None:
    job = build_job_manifest("eval", "llmrl-eval-0", SETTINGS)  # mounts llmrl-shared at /shared
    pod = {"spec": job["spec"]["template"]["spec"]}
    assert str(mounted_claim_path(pod, "llmrl-shared", "/shared/stage-results/x.json")) == (
        "stage-results/x.json"
    )
    assert mounted_claim_path(pod, "llmrl-shared", "/shared-other/x.json") is None  # a sibling
    assert mounted_claim_path(pod, "llmrl-shared", "/shared") is None  # the mount itself
    assert mounted_claim_path(pod, "another-claim", "/shared/x.json") is None
    with FakeKubernetes(rules=None) as fake:
        assert fake.shared_path(pod, "/shared/a/b.json") == fake.shared_dir / "a" / "b.json"
        assert fake.shared_path(pod, "/tmp/b.json") is None  # the container's own disk
