"""Tests of the plain Kubernetes manifests in k8s/."""
