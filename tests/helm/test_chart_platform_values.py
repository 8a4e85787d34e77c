"""The helm/llmrl chart's platform values (labels, annotations, priority and runtime classes,
pull secrets, Kueue, extra env): they reach the chart's pods and every stage pod, role by role."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.helm.chart_objects import K8S_VERSION, of_kind, render, stage_manifests
from tests.support.chart import objects

pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

pytestmark = pytest.mark.integration  # the real Helm engine renders and lints the chart


PLATFORM_VALUES: dict[str, Any] = {
    "podLabels": {"team": "rl"},
    "podAnnotations": {"cost-center": "42"},
    "priorityClassName": "gpu-high",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "regcred"}],
    "huggingFace": {"tokenSecret": {"name": "hf", "key": "token"}},
    "kueue": {"queueName": "gpu-queue"},
    "stagePods": {
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "envFrom": [{"secretRef": {"name": "s3"}}],
        "roles": {
            "trainer": {
                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                "podLabels": {"role": "trainer"},
            },
            "envWorkers": {"podAnnotations": {"sandbox": "gvisor"}},
            "rewardModel": {"podLabels": {"role": "reward-model"}},
        },
    },
    "topology": {  # the model roles' engine pods are stage pods too
        "teacher": {"model": "t"},
        "judge": {"model": "j", "backend": "transformers"},
        "reward_model": {"model": "r"},
    },
    "mlflow": {"env": [{"name": "GUNICORN_CMD_ARGS", "value": "--timeout 120"}]},
    "prefect": {"worker": {"envFrom": [{"configMapRef": {"name": "proxy"}}]}},
}


def test_platform_values_reach_chart_pods(chart):
    items = objects(render(chart, copy.deepcopy(PLATFORM_VALUES)))
    for item in items:
        kubernetes_validate.validate(item, K8S_VERSION, strict=True)
    deployments = {
        d["metadata"]["name"]: d["spec"]["template"] for d in of_kind(items, "Deployment")
    }
    for name, template in deployments.items():
        assert template["metadata"]["labels"]["team"] == "rl", name
        assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llmrl", name
        assert template["metadata"]["annotations"] == {"cost-center": "42"}, name
        spec = template["spec"]
        assert (spec["priorityClassName"], spec["runtimeClassName"]) == ("gpu-high", "nvidia")
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], name
    mlflow_env = deployments["llmrl-mlflow"]["spec"]["containers"][0]["env"]
    assert {"name": "GUNICORN_CMD_ARGS", "value": "--timeout 120"} in mlflow_env
    worker = deployments["llmrl-prefect-worker"]["spec"]["containers"][0]
    assert worker["envFrom"] == [{"configMapRef": {"name": "proxy"}}]


def test_platform_values_reach_stage_pods(chart):
    """The chart's values reach the Jobs and RayJobs the launcher builds, role by role."""
    items = objects(render(chart, copy.deepcopy(PLATFORM_VALUES)))
    built = stage_manifests(items)
    for stage, manifest in built.items():
        assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue", stage
    grpo = built["grpo"]["spec"]
    cluster = grpo["rayClusterSpec"]
    templates = {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    templates["head"] = cluster["headGroupSpec"]["template"]
    templates["driver"] = grpo["submitterPodTemplate"]
    templates["job"] = built["eval"]["spec"]["template"]
    for role, template in templates.items():
        spec, labels = template["spec"], template["metadata"]["labels"]
        assert labels["team"] == "rl" and labels["llmrl.io/role"] == role, role
        assert (spec["priorityClassName"], spec["runtimeClassName"]) == ("gpu-high", "nvidia")
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], role
        container = spec["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
        expected = "INFO" if role == "trainer" else "WARN"
        assert env["NCCL_DEBUG"]["value"] == expected, role
        assert container["envFrom"] == [{"secretRef": {"name": "s3"}}], role
    assert {"teacher", "judge", "reward-model"} <= set(templates)
    assert templates["reward-model"]["metadata"]["labels"]["role"] == "reward-model"
    assert "role" not in templates["judge"]["metadata"]["labels"]
    assert templates["trainer"]["metadata"]["labels"]["role"] == "trainer"
    assert "role" not in templates["inference"]["metadata"]["labels"]
    assert templates["env-workers"]["metadata"]["annotations"] == {
        "cost-center": "42",
        "sandbox": "gvisor",
    }
