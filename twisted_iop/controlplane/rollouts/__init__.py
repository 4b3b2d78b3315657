"""Rollouts: one command to many edges in batches; the pure state machine, the service that
runs it, and its routes.
"""
