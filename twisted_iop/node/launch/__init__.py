"""The engines a Node launches itself: the `launch` block, the supervisor (start, readiness,
restart with backoff, stop), each engine's process, logs and pidfile, and the Edge's
``provider.*`` commands that act on them.
"""
