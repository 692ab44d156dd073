"""Step traces: the engine's record of every arrival, step and finish (`recorder.py`), and what reads them back:
replay and what-if runs (`replay.py`), one request's timeline and the Trace Event export (`timeline.py`)."""
