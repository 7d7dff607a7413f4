"""Benchmarks: each module is a script run from the repository root as `python -m bench.NAME`, printing tables.

Shared by them (and by the tests): the spoken corpus (bench/corpus.py), the prompts, a scripted client, a server
process, and the statistics."""
