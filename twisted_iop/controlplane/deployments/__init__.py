"""Deployments on the Control Plane: which model runs where, and whether the fleet got there.

This package owns the Control Plane's half of deployments (the Edge's and
the Node's are :mod:`twisted_iop.edge.deployments` and the node's engine
supervisor; the spec hash both sides compute is
:mod:`twisted_iop.deployments.spec`):

* :mod:`.spec`: a deployment as an operator writes it (model, profile,
  parameters, edge and node selectors, replicas per edge, capacity,
  ``offline``, ``rollout``), parsed once with errors naming the field;
* :mod:`.placement`: pure functions, no I/O: from the deployments and what
  the Control Plane last heard of each edge, the desired instances of every
  edge (ids stable, kept where they run) and the changes they make (start,
  restart, stay, stop, and what cannot be placed and why);
* :mod:`.rollup`: from what each edge reports, the state of each edge for
  a deployment and the counts of a deployment's rollup (pure);
* :mod:`.roll`: a changed deployment's roll: its states (running, paused,
  cancelled, aborted, done), the moves an operator makes and the abort
  rule (the rollout engine's criteria), and each next step of a running
  roll (which edges to reach, abort, done), pure;
* :mod:`.kept`: what the service keeps of each deployment (its stored
  form, its roll) and what each edge was last sent;
* :mod:`.reports`: what edges say of their deployments (answers to a set,
  snapshots) and whether an edge takes deployments at all;
* :mod:`.dry_run`: a dry run's answer, pure;
* :mod:`.desired_sets`: what each edge was last sent, the versions of the
  sets, their answers, and which edges have not settled on theirs yet;
* :mod:`.service`: keeps deployments in the store, sends each edge its
  desired set (on every change and when it says hello), reads what runs,
  records ``deployment.*`` events;
* :mod:`.routes`: ``/deployments`` on the Control Plane's HTTP API.

See docs/deployments.md.
"""
