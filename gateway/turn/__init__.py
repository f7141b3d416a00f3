"""One turn, as stages that return values (one implementation for both transports)::

    checks -> resolve -> classify -> render -> sampling      (pipeline.prepare: a PreparedTurn)
    run: engine -> parse -> events -> finalize               (run.TurnRunner)

``pipeline`` composes the stages for ``create``, ``input_tokens`` and ``/responses/compact``.
"""
