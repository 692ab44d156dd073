"""LoRA adapters on the served model: the PEFT files read and checked (`adapter_file`), each adapted projection's
low-rank deltas added to its output row group by row group (`linear`), and the adapters a model holds (`adapters`)."""
