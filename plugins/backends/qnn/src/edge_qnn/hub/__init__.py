"""AI Hub as a qualification facility: ``edge hub devices|compile|profile|infer``.

An optional extra (``pip install edge-qnn[hub]``); never a deployment dependency.
"""
