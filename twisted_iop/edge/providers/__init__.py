"""Where a request may run: the provider pool (leases and queues), cool-downs of failing
providers, the engines' load and the states of launched engines.
"""
