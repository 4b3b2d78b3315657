"""The HTTP API: the Klein routes and their errors, settings and authorization, the JSON views and
renderers, and the console's files.
"""
