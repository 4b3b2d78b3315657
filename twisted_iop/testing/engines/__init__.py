"""Engines for the tests and benches: fixtures of each engine kind's answers (recorded from the real
llama-server where it runs here), llama-cpp-python's and llama-server's harnesses, the tiny model the
tests write, a recording engine, a slow-disk load gate, an OpenAI-client load and launch helpers.
"""
