"""iopctl, the operator CLI (its entry point is :mod:`twisted_iop.client.cli`): the shared argument and
watch machinery, one module of commands per family (deploy, history, rollout, slo), their renderings as
tables for people and JSON for scripts, and shell completion.
"""
