"""The Nodes of this Edge: their wire, the ownership of their connections, and the registry
of their connections, drain state, health and load.
"""
