"""Requests to edges: the gateway, status asks (one in flight per edge), fleet rounds, command
dispatch with its body's rules and the operation state machine, and their errors.
"""
