"""The Node's side of deployments: the engine profiles its owner declares and the instances it runs.

* :mod:`.profiles` reads node.yaml's ``engines:`` (and ``gpus:``) into frozen
  attrs classes, every error naming its dotted field.
* :mod:`.checker` is pure: it checks a desired instance against its profile
  (refusing with a reason) and renders the engine's argument list, value by
  value, never through a shell.
* :mod:`.plan` is pure: what to start, stop, restart or keep, from the
  desired set and what runs.
* :mod:`.instances` owns the running instances: it turns a plan into
  providers for the supervisor and reports their states.
"""
