"""Engine-free core of privstream: oracles, noise, ledgers and one module per mechanism family.

Nothing here imports Bytewax or any other privstream package (design §2): the mechanisms are
plain state machines that the operators drive one slot at a time.
"""
