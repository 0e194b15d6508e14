"""Benchmarks: `make bench` writes bench/results.json (one flat object, unit in each key)."""
