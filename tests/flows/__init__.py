"""Tests of the Prefect flows and the stage launchers (flows/)."""
