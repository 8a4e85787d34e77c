"""Statistics of evaluation results, one concept per module:

Layer 1 (data, models, topology, tracking): imports only llmrl.data.

- :mod:`~llmrl.eval.paired`: is one model better than another on the same problems? The
  accuracy gain with a paired bootstrap interval and the exact McNemar test.
- :mod:`~llmrl.eval.kinds`: accuracy per problem kind (e.g. an arithmetic problem's operators)
  and the MLflow metric names of those accuracies.

Pure Python and numpy (no torch): the orchestrating flow imports it to summarise a pipeline run.
"""
