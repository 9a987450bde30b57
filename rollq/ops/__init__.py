"""Operating rollq: the ``rollq`` command, status and metrics, the dashboard and the demo.

The top layer: it may import every other part of rollq, and nothing imports it.
"""
