"""Fixtures of the flow tests: Prefect's test harness (:mod:`tests.flows.prefect_harness`)."""

from tests.flows.prefect_harness import prefect_api  # noqa: F401
