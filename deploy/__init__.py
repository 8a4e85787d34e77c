"""What only the deployment needs, above the library: the Helm chart's values as a Python model
(:mod:`deploy.chart_values`) and the chart's files generated from the library's topology rules
(:mod:`deploy.chart_files`: ``helm/llmrl/values.schema.json`` and the topology guard template,
written by ``make chart-schema``).

It imports ``llmrl`` (the topology, its rules); nothing in ``llmrl/`` or ``flows/`` imports it
(``tests/test_layering.py``). The images do not carry it: no pod runs it.
"""
