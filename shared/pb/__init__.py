"""Generated from protos/ by scripts/gen_protos.py; never edit by hand."""
