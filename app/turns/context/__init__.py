"""What a turn sends the model when the history outgrows its window (docs/context.md): the pure planner
(planner.py) and the turn's compactor that writes summaries with a model (compactor.py)."""
