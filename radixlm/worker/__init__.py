"""The model worker: runs the steps the engine core schedules (`radixlm/core/step.py`), in-process or not."""
