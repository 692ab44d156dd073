"""Step traces: the engine's record of every arrival, step and finish (`recorder.py`), and what reads them back:
replay and what-if runs (`replay.py`), one request's timeline and the Trace Event export (`timeline.py`). A trace
file is hostile input until `trace_file.py` has bounded, parsed (`bounded_json.py`) and validated it: each event's
fields (`trace_schema.py`, `trace_fields.py`) and the references between events (`trace_refs.py`)."""
