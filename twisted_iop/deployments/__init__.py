"""Deployments: what both sides of the desired state share (no node, edge or Control Plane code).

:mod:`twisted_iop.deployments.spec` computes the spec hash of an instance
the same way on the Control Plane and on the Node, so an equal hash means
"this engine already runs what is asked" and restarts nothing.
"""
