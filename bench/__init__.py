"""Benchmarks of clienttools against hand-written JavaScript and bare Pyodide.

`python -m bench` (or `make bench`) runs every figure and writes
`bench/results/latest.json` and `bench/results/latest.md`; see bench/README.md.
"""
